"""The plugin's queue arithmetic, on stand-ins for SGLang requests (no SGLang needed).

`topas_sglang.controller.queue_order` turns a Decision into SGLang's waiting queue; the
invariants below are what keeps a live server safe whatever the decision says. The
plugin's tests against SGLang's real classes are in integration/sglang/tests/.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topas.instance import Stage, Task
from topas.state import Decision
from topas.workflow_metadata import encode
from topas_sglang.adapter import observe
from topas_sglang.controller import Controller, queue_order, refill


def _req(rid: str, params=None):  # type: ignore[no-untyped-def]
    """What the adapter reads off an SGLang ``Req``."""
    return SimpleNamespace(
        rid=rid,
        sampling_params=SimpleNamespace(custom_params=params),
        output_ids=[],
        time_stats=SimpleNamespace(wait_queue_entry_time=1.0),
    )


@st.composite
def queues(draw):  # type: ignore[no-untyped-def]
    """A waiting queue of tagged stages (one task per stage) and untagged requests in a
    random order, and a random decision over the tagged ones."""
    n_tagged = draw(st.integers(0, 6))
    tagged = []
    for i in range(n_tagged):
        task = Task(f"t{i}", 0.0, (Stage("s", "a", 4, 2),))
        tagged.append(_req(f"t{i}/s", encode(task, "s", 8)))
    untagged = [_req(f"u{i}", None) for i in range(draw(st.integers(0, 4)))]
    waiting = draw(st.permutations(tagged + untagged))
    refs = [("t" + r.rid[1:].split("/")[0], "s") for r in tagged]
    chosen = draw(st.permutations(refs))
    n_admit = draw(st.integers(0, len(chosen)))
    n_held = draw(st.integers(0, len(chosen) - n_admit))
    decision = Decision(
        admit=tuple(chosen[:n_admit]), held=tuple(chosen[n_admit : n_admit + n_held])
    )
    return list(waiting), decision, draw(st.booleans())


@given(case=queues())
def test_queue_order_keeps_every_request_and_sglangs_untagged_slots(case):
    waiting, decision, idle = case
    obs = observe(waiting, [], {})
    order, held = queue_order(waiting, obs, decision, idle)
    # a permutation: nothing dropped, nothing duplicated
    assert sorted(map(id, order)) == sorted(map(id, waiting))
    # the held requests are at the tail, in the decision's order; none when idle and the
    # decision admits nothing
    assert order[len(order) - len(held) :] == held
    want_held = [ref for ref in decision.held if not (idle and not decision.admit)]
    assert [r.rid for r in held] == [f"{t}/{s}" for t, s in want_held]
    # among the rest, untagged requests keep the positions SGLang gave them
    body = order[: len(order) - len(held)]
    rest = [r for r in waiting if all(r is not h for h in held)]
    for before, after in zip(rest, body, strict=True):
        assert (before.rid[0] == "u") == (after.rid[0] == "u")
        if before.rid[0] == "u":
            assert before is after
    # the admitted ones come first among the tagged, in prefill order
    tagged_body = [r.rid for r in body if r.rid[0] == "t"]
    admitted = [f"{t}/{s}" for t, s in decision.admit]
    assert tagged_body[: len(admitted)] == admitted
    # and the other tagged ones follow in SGLang's order
    others = [r.rid for r in waiting if r.rid[0] == "t" and r.rid not in admitted]
    assert tagged_body[len(admitted) :] == [rid for rid in others if rid in tagged_body]


def test_queue_order_refuses_an_admission_that_is_not_queued():
    # a decision that admits a running request (or one twice) is a bug, not a reorder
    task = Task("t0", 0.0, (Stage("s", "a", 4, 2),))
    run, plain = _req("t0/s", encode(task, "s", 8)), _req("u0")
    obs = observe([plain], [run], {})
    with pytest.raises(ValueError, match="not queued"):
        queue_order([plain], obs, Decision(admit=(("t0", "s"),)), idle=False)


@given(seq=st.lists(st.integers(0, 50), unique=True), data=st.data())
def test_refill_puts_a_reordering_into_the_same_slots(seq, data):
    chosen = data.draw(st.lists(st.sampled_from(seq), unique=True) if seq else st.just([]))
    ranked = data.draw(st.permutations(chosen))
    out = refill(seq, list(ranked), key=int)
    assert sorted(out) == sorted(seq)
    assert [x for x in out if x in chosen] == list(ranked)
    assert [i for i, x in enumerate(out) if x in chosen] == [
        i for i, x in enumerate(seq) if x in chosen
    ]


def test_kv_needs_are_remembered_only_while_their_inputs_hold():
    # t0/s: input 40, predicted output 20, agent a with a 100-token prompt, 1000 tokens of
    # KV: SGLang reserves 40 + max(20, g + 1) (topas.kv.reservation), at most 900.
    c = Controller()
    c.prefix_tokens = {"a": 100}
    t0 = Task("t0", 0.0, (Stage("s", "a", 40, 20),))
    need = c._need_rule({"t0": t0}, 1000)
    assert need(("t0", "s"), 0) == 60 and c._needs == {("t0", "s"): 60}
    assert need(("t0", "s"), 30) == 71  # generated tokens: computed, not remembered
    assert c._needs == {("t0", "s"): 60}
    # a longer prompt leaves less room: a stage of 950 tokens is clipped to what is left
    big = Task("t1", 0.0, (Stage("s", "a", 900, 50),))
    c.prefix_tokens = {"a": 100}
    assert c._need_rule({"t1": big}, 1000)(("t1", "s"), 0) == 900
    c.prefix_tokens = {"a": 200}
    assert c._need_rule({"t1": big}, 1000)(("t1", "s"), 0) == 800  # forgotten, recomputed
    # a task forgotten, or seen again with another DAG, loses what was remembered of it
    c._noted["t1"] = big
    c._forget("t1")
    assert ("t1", "s") not in c._needs
