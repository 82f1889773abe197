"""The request metadata schema topas-meta/1 (topas/workflow_metadata.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topas.workflow_metadata import KEY, MetadataError, decode, encode
from topas.workloads import WORKLOADS, generate


@given(name=st.sampled_from(sorted(WORKLOADS)), seed=st.integers(0, 50))
def test_round_trip_every_stage(name, seed):
    inst = generate(name, num_tasks=3, seed=seed, prediction_sigma=0.5)
    prefix = {a.id: a.prefix_tokens for a in inst.agents}
    for task in inst.tasks:
        for s in task.stages:
            params = encode(task, s.id, prefix[s.agent], arrival=task.arrival, prefixes=prefix)
            assert set(params) == {KEY} and isinstance(params[KEY], str)  # flat, as SGLang needs
            meta = decode(params)
            assert meta.ref == (task.id, s.id)
            assert (meta.agent, meta.prefix_tokens, meta.arrival) == (
                s.agent,
                prefix[s.agent],
                task.arrival,
            )
            # the DAG with what a policy may see: predicted lengths, not the truth
            got = {
                x.id: (x.agent, x.input_tokens, x.output_tokens, x.deps) for x in meta.task.stages
            }
            want = {
                x.id: (x.agent, x.input_tokens, x.predicted_output, x.deps) for x in task.stages
            }
            assert got == want
            assert meta.task.topo_order == task.topo_order
            # the prompt lengths of the task's own agents travel along, no others
            assert meta.prefixes == {x.agent: prefix[x.agent] for x in task.stages}


def test_metadata_stays_small():
    # a 20-stage SOP task fits in about 1 KB of JSON
    inst = generate("metagpt-sop", num_tasks=20, seed=0)
    task = max(inst.tasks, key=lambda t: len(t.stages))
    assert len(encode(task, task.stages[0].id, 2048)[KEY]) < 80 * len(task.stages)


def test_the_requests_of_one_task_share_its_task():
    """Every request carries its task's whole dag: the stages of one task decode to one
    Task object (built once), a different dag under the same id to a new one."""
    a = decode(_doc(stage="a", agent="x"))
    b = decode(_doc())
    assert a.task is b.task and a.ref != b.ref
    other = decode(_doc(dag=[["a", "x", 10, 5, []], ["b", "y", 13, 3, ["a"]]]))
    assert other.task is not a.task
    assert other.task.stage_by_id["b"].input_tokens == 13
    assert decode(_doc()).task is not other.task  # the first dag again: built anew
    assert decode(_doc()).task == a.task
    with pytest.raises(MetadataError, match="unknown stage 'zz'"):  # never served from memory
        decode(_doc(dag=[["a", "x", 10, 5, []], ["b", "y", 12, 3, ["zz"]]]))
    decode(_doc(dag=[["a", "x", 1, 5, []], ["b", "y", 12, 3, ["a"]]]))
    for odd in (1.0, True):  # equal to the 1 just decoded in Python, yet not a count
        with pytest.raises(MetadataError, match="token counts must be integers"):
            decode(_doc(dag=[["a", "x", odd, 5, []], ["b", "y", 12, 3, ["a"]]]))


def _doc(**change):
    doc = {
        "v": 1,
        "task": "t0",
        "stage": "b",
        "agent": "y",
        "prefix": 100,
        "dag": [["a", "x", 10, 5, []], ["b", "y", 12, 3, ["a"]]],
    }
    doc.update(change)
    return {KEY: json.dumps(doc)}


def test_a_hand_written_request_decodes():
    meta = decode(_doc(arrival=1.5))
    assert meta.ref == ("t0", "b") and meta.prefix_tokens == 100 and meta.arrival == 1.5
    assert meta.task.stage_by_id["b"].deps == ("a",)
    assert meta.task.children["a"] == ("b",)
    assert meta.prefixes == {}  # optional
    assert decode(_doc(prefixes={"x": 64})).prefixes == {"x": 64}


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        (None, "missing"),
        ({}, "missing"),
        ({KEY: {"v": 1}}, "expected a JSON string"),
        ({KEY: "{not json"}, "not JSON"),
        ({KEY: "[1]"}, "expected an object"),
        (_doc(v=2), ".v: expected 1"),
        (_doc(task=None), ".task: expected str"),
        (_doc(prefix=-1), ".prefix: must be >= 0"),
        (_doc(prefix=True), ".prefix: expected int"),
        (_doc(arrival="soon"), ".arrival"),
        (_doc(prefixes=[1]), ".prefixes: expected an object"),
        (_doc(prefixes={"x": -1}), ".prefixes.x: expected an integer >= 0"),
        (_doc(stage="c"), "'c' is not a stage of task 't0'"),
        (_doc(agent="x"), "gives stage 'b' to 'y'"),
        (_doc(dag=[["a", "x", 10, 5]]), "dag[0]: expected [id"),
        (_doc(dag=[["a", "x", 10, 5, "b"]]), "deps must be a list"),
        (_doc(dag=[["a", "x", 1.5, 5, []]]), "token counts must be integers"),
        (_doc(dag=[["a", "x", 0, 5, []]]), "input_tokens"),
        (_doc(dag=[["a", "x", 1, 5, ["b"]], ["b", "y", 1, 1, ["a"]]]), "dependency cycle"),
        (_doc(dag=[["b", "y", 1, 1, ["zz"]]]), "unknown stage 'zz'"),
    ],
)
def test_malformed_metadata_is_one_line_naming_the_field(params, fragment):
    with pytest.raises(MetadataError) as err:
        decode(params)
    message = str(err.value)
    assert fragment in message and "\n" not in message
