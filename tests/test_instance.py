"""Tests of topas/instance.py: validation, error messages, JSON round trips, file I/O.

Every malformed input must raise :class:`InstanceError` whose message names the
field and the id at fault (DESIGN.md, "Interfaces that outside tools rely on").
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import topas.instance as instance_mod
from topas.instance import (
    FORMAT,
    Agent,
    HostLoad,
    Instance,
    InstanceError,
    LinearCost,
    RecomputeLoad,
    ServerSpec,
    Stage,
    StepCost,
    Task,
    load_instance,
    save_instance,
)

# --------------------------------------------------------------------------- fixtures


def base_doc() -> dict[str, Any]:
    """A valid, canonical document (keys in the order ``to_dict`` writes them).

    The same stage id ``s1`` appears in both tasks, which is allowed.
    """
    return {
        "format": FORMAT,
        "name": "base",
        "server": {
            "kv_capacity_tokens": 1000,
            "chunk_tokens": 64,
            "max_running": 4,
            "cost_model": {"kind": "step", "step_s": 1.0},
            "prefix_load": {"kind": "recompute"},
        },
        "agents": [
            {"id": "pm", "prefix_tokens": 100},
            {"id": "eng", "prefix_tokens": 200},
        ],
        "tasks": [
            {
                "id": "t1",
                "arrival": 0.0,
                "workflow": "demo",
                "stages": [
                    {"id": "s1", "agent": "pm", "input_tokens": 10, "output_tokens": 5, "deps": []},
                    {
                        "id": "s2",
                        "agent": "eng",
                        "input_tokens": 20,
                        "output_tokens": 8,
                        "deps": ["s1"],
                        "predicted_output_tokens": 6,
                    },
                    {
                        "id": "s3",
                        "agent": "pm",
                        "input_tokens": 5,
                        "output_tokens": 3,
                        "deps": ["s1", "s2"],
                    },
                ],
            },
            {
                "id": "t2",
                "arrival": 2.5,
                "stages": [
                    {
                        "id": "s1",
                        "agent": "eng",
                        "input_tokens": 30,
                        "output_tokens": 4,
                        "deps": [],
                    },
                ],
            },
        ],
    }


def linear_host_doc() -> dict[str, Any]:
    """Canonical: linear cost model, host loads, mixed chunks, no max_running, int arrivals."""
    return {
        "format": FORMAT,
        "name": "linear-host",
        "server": {
            "kv_capacity_tokens": 80000,
            "chunk_tokens": 2048,
            "cost_model": {
                "kind": "linear",
                "base_s": 0.0048,
                "prefill_token_s": 2.5e-05,
                "decode_seq_s": 2e-05,
                "kv_token_s": 3.9e-08,
            },
            "prefix_load": {"kind": "host", "tokens_per_s": 200000},
            "mixed_chunk": True,
        },
        "agents": [
            {"id": "pm", "prefix_tokens": 6000},
            {"id": "arch", "prefix_tokens": 4500},
            {"id": "qa", "prefix_tokens": 3000},
        ],
        "tasks": [
            {
                "id": "t0",
                "arrival": 0,
                "workflow": "metagpt-sop",
                "stages": [
                    {
                        "id": "prd",
                        "agent": "pm",
                        "input_tokens": 800,
                        "output_tokens": 600,
                        "deps": [],
                        "predicted_output_tokens": 550,
                    },
                    {
                        "id": "design",
                        "agent": "arch",
                        "input_tokens": 1400,
                        "output_tokens": 900,
                        "deps": ["prd"],
                        "predicted_output_tokens": 1000,
                    },
                    {
                        "id": "test",
                        "agent": "qa",
                        "input_tokens": 2300,
                        "output_tokens": 700,
                        "deps": ["design"],
                    },
                ],
            },
            {
                "id": "t1",
                "arrival": 3,
                "stages": [
                    {
                        "id": "prd",
                        "agent": "pm",
                        "input_tokens": 700,
                        "output_tokens": 500,
                        "deps": [],
                    },
                    {
                        "id": "review",
                        "agent": "qa",
                        "input_tokens": 1200,
                        "output_tokens": 300,
                        "deps": [],
                    },
                    {
                        "id": "final",
                        "agent": "arch",
                        "input_tokens": 100,
                        "output_tokens": 50,
                        "deps": ["review", "prd"],
                        "predicted_output_tokens": 1,
                    },
                ],
            },
            {
                "id": "t2",
                "arrival": 7.25,
                "stages": [
                    {"id": "prd", "agent": "pm", "input_tokens": 1, "output_tokens": 1, "deps": []},
                ],
            },
        ],
    }


def default_server_doc() -> dict[str, Any]:
    """Canonical: no cost model (the calibrated default), recompute loads."""
    return {
        "format": FORMAT,
        "name": "defaults",
        "server": {
            "kv_capacity_tokens": 500,
            "chunk_tokens": 128,
            "prefix_load": {"kind": "recompute"},
        },
        "agents": [{"id": "solo", "prefix_tokens": 1}],
        "tasks": [
            {
                "id": "only",
                "arrival": 0.125,
                "stages": [
                    {
                        "id": "x",
                        "agent": "solo",
                        "input_tokens": 1,
                        "output_tokens": 498,
                        "deps": [],
                    },
                ],
            },
        ],
    }


def step_host_doc() -> dict[str, Any]:
    """Canonical: step model with a non-unit step, host loads, max_running 1."""
    return {
        "format": FORMAT,
        "name": "step-host",
        "server": {
            "kv_capacity_tokens": 64,
            "chunk_tokens": 8,
            "max_running": 1,
            "cost_model": {"kind": "step", "step_s": 0.25},
            "prefix_load": {"kind": "host", "tokens_per_s": 12.5},
        },
        "agents": [{"id": "a", "prefix_tokens": 16}, {"id": "b", "prefix_tokens": 32}],
        "tasks": [
            {
                "id": "j",
                "arrival": 1,
                "workflow": "fanout",
                "stages": [
                    {"id": "root", "agent": "a", "input_tokens": 4, "output_tokens": 4, "deps": []},
                    {
                        "id": "l",
                        "agent": "b",
                        "input_tokens": 8,
                        "output_tokens": 24,
                        "deps": ["root"],
                        "predicted_output_tokens": 20,
                    },
                    {
                        "id": "r",
                        "agent": "b",
                        "input_tokens": 8,
                        "output_tokens": 2,
                        "deps": ["root"],
                    },
                    {
                        "id": "join",
                        "agent": "a",
                        "input_tokens": 16,
                        "output_tokens": 1,
                        "deps": ["l", "r"],
                    },
                ],
            },
        ],
    }


CANONICAL_DOCS = {
    "base": base_doc,
    "linear-host": linear_host_doc,
    "defaults": default_server_doc,
    "step-host": step_host_doc,
}


def _set(doc: dict[str, Any], path: tuple, value: Any) -> None:
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _del(doc: dict[str, Any], path: tuple) -> None:
    node = doc
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]


def _mutated(path: tuple, value: Any) -> dict[str, Any]:
    doc = base_doc()
    _set(doc, path, value)
    return doc


def _without(path: tuple) -> dict[str, Any]:
    doc = base_doc()
    _del(doc, path)
    return doc


def expect_error(doc: Any, *fragments: str) -> str:
    """``from_dict(doc)`` raises InstanceError whose message contains every fragment."""
    with pytest.raises(InstanceError) as info:
        Instance.from_dict(doc)
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in error message {msg!r}"
    assert "\n" not in msg, f"error message spans several lines: {msg!r}"
    return msg


def test_base_docs_are_valid_and_canonical() -> None:
    for make in CANONICAL_DOCS.values():
        doc = make()
        assert Instance.from_dict(doc).to_dict() == doc


def test_instance_error_is_a_value_error() -> None:
    assert issubclass(InstanceError, ValueError)


# --------------------------------------------------------------------------- format / document


@pytest.mark.parametrize("fmt", ["topas-instance/2", "topas-instance", "", 1, None])
def test_unknown_format_tag(fmt: Any) -> None:
    expect_error(_mutated(("format",), fmt), "format", repr(fmt), FORMAT)


def test_missing_format() -> None:
    expect_error(_without(("format",)), "format", "None")


@pytest.mark.parametrize("doc", [[], [base_doc()], "topas-instance/1", 3, None, True])
def test_non_object_document(doc: Any) -> None:
    expect_error(doc, "document", "object")


# --------------------------------------------------------------------------- duplicates


def test_duplicate_agent_ids() -> None:
    doc = base_doc()
    doc["agents"].append({"id": "eng", "prefix_tokens": 7})
    expect_error(doc, "agents", "duplicate", "'eng'")


def test_duplicate_task_ids() -> None:
    doc = base_doc()
    doc["tasks"][1]["id"] = "t1"
    expect_error(doc, "tasks", "duplicate", "'t1'")


def test_duplicate_stage_ids_within_a_task() -> None:
    doc = base_doc()
    doc["tasks"][0]["stages"][2]["id"] = "s2"
    expect_error(doc, "tasks[t1].stages", "duplicate", "'s2'")


def test_same_stage_id_in_two_tasks_is_fine() -> None:
    inst = Instance.from_dict(base_doc())
    assert inst.stage(("t1", "s1")).agent == "pm"
    assert inst.stage(("t2", "s1")).agent == "eng"


# --------------------------------------------------------------------------- references


def test_unknown_agent() -> None:
    expect_error(
        _mutated(("tasks", 0, "stages", 1, "agent"), "qa"), "tasks[t1].stages[s2].agent", "'qa'"
    )


def test_unknown_agent_in_second_task() -> None:
    expect_error(
        _mutated(("tasks", 1, "stages", 0, "agent"), "ghost"),
        "tasks[t2].stages[s1].agent",
        "'ghost'",
    )


def test_dangling_dep() -> None:
    expect_error(
        _mutated(("tasks", 0, "stages", 1, "deps"), ["s1", "s9"]),
        "tasks[t1].stages[s2].deps",
        "'s9'",
    )


def test_dep_on_a_stage_of_another_task_is_dangling() -> None:
    # t1 has a stage s2, t2 has none: deps name stages of the same task only.
    doc = base_doc()
    doc["tasks"][1]["stages"][0]["deps"] = ["s2"]
    expect_error(doc, "tasks[t2].stages[s1].deps", "'s2'")


def test_self_dep() -> None:
    msg = expect_error(
        _mutated(("tasks", 0, "stages", 1, "deps"), ["s2"]),
        "tasks[t1].stages[s2].deps",
        "depends on itself",
    )
    assert "s1" not in msg and "s3" not in msg


def test_three_cycle_is_named() -> None:
    doc = base_doc()
    doc["tasks"][0]["stages"] = [
        {"id": "w", "agent": "pm", "input_tokens": 1, "output_tokens": 1, "deps": []},
        {"id": "x", "agent": "pm", "input_tokens": 1, "output_tokens": 1, "deps": ["z", "w"]},
        {"id": "y", "agent": "pm", "input_tokens": 1, "output_tokens": 1, "deps": ["x"]},
        {"id": "z", "agent": "eng", "input_tokens": 1, "output_tokens": 1, "deps": ["y"]},
    ]
    msg = expect_error(doc, "tasks[t1].stages", "cycle")
    named = msg.split("cycle", 1)[1].strip()
    assert set(re.split(r"\s*->\s*", named)) == {"x", "y", "z"}, msg


def test_two_cycle_is_named() -> None:
    doc = base_doc()
    doc["tasks"][0]["stages"][0]["deps"] = ["s3"]
    msg = expect_error(doc, "tasks[t1].stages", "cycle")
    named = set(re.split(r"\s*->\s*", msg.split("cycle", 1)[1].strip()))
    assert named <= {"s1", "s2", "s3"} and {"s1", "s3"} <= named, msg


# --------------------------------------------------------------------------- token counts

BAD_COUNTS = [0, -1, 2.5, "10", True, None, 10.0]

TOKEN_FIELDS = {
    "prefix_tokens": (("agents", 1, "prefix_tokens"), "agents[eng].prefix_tokens"),
    "input_tokens": (
        ("tasks", 0, "stages", 1, "input_tokens"),
        "tasks[t1].stages[s2].input_tokens",
    ),
    "output_tokens": (
        ("tasks", 0, "stages", 1, "output_tokens"),
        "tasks[t1].stages[s2].output_tokens",
    ),
    "predicted_output_tokens": (
        ("tasks", 0, "stages", 1, "predicted_output_tokens"),
        "tasks[t1].stages[s2].predicted_output_tokens",
    ),
    "kv_capacity_tokens": (("server", "kv_capacity_tokens"), "server.kv_capacity_tokens"),
    "chunk_tokens": (("server", "chunk_tokens"), "server.chunk_tokens"),
}


@pytest.mark.parametrize("value", BAD_COUNTS, ids=repr)
@pytest.mark.parametrize("field_name", list(TOKEN_FIELDS))
def test_bad_token_count(field_name: str, value: Any) -> None:
    path, where = TOKEN_FIELDS[field_name]
    if value is None and field_name == "predicted_output_tokens":
        # null means "no prediction": allowed.
        Instance.from_dict(_mutated(path, value))
        return
    expect_error(_mutated(path, value), where, repr(value))


def test_bad_token_count_in_second_task_names_that_task() -> None:
    expect_error(
        _mutated(("tasks", 1, "stages", 0, "output_tokens"), -5),
        "tasks[t2].stages[s1].output_tokens",
        "-5",
    )


def test_bad_prefix_tokens_of_first_agent() -> None:
    expect_error(_mutated(("agents", 0, "prefix_tokens"), 0), "agents[pm].prefix_tokens", "0")


# --------------------------------------------------------------------------- arrival


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), float("-inf"), -1, -0.5, "0", "1.5", True, None, [0]],
    ids=repr,
)
def test_bad_arrival(value: Any) -> None:
    expect_error(_mutated(("tasks", 1, "arrival"), value), "tasks[t2].arrival", repr(value))


def test_nan_arrival_literal_in_a_file(tmp_path: Path) -> None:
    # Python's json accepts the non-standard NaN literal; validation must still reject it.
    text = json.dumps(base_doc(), indent=1).replace('"arrival": 2.5', '"arrival": NaN')
    assert "NaN" in text
    path = tmp_path / "nan.json"
    path.write_text(text)
    with pytest.raises(InstanceError) as info:
        load_instance(path)
    msg = str(info.value)
    assert str(path) in msg and "tasks[t2].arrival" in msg and "nan" in msg


def test_infinity_literal_for_kv_capacity_in_a_file(tmp_path: Path) -> None:
    text = json.dumps(base_doc(), indent=1).replace(
        '"kv_capacity_tokens": 1000', '"kv_capacity_tokens": Infinity'
    )
    path = tmp_path / "inf.json"
    path.write_text(text)
    with pytest.raises(InstanceError, match=r"server\.kv_capacity_tokens"):
        load_instance(path)


# --------------------------------------------------------------------------- capacity


def test_prefix_that_cannot_fit() -> None:
    expect_error(
        _mutated(("agents", 1, "prefix_tokens"), 1001),
        "agents[eng].prefix_tokens",
        "1001",
        "server.kv_capacity_tokens",
        "1000",
    )


def test_stage_that_cannot_fit() -> None:
    # eng prefix 200 + input 700 + output 101 = 1001 > 1000
    doc = base_doc()
    doc["tasks"][0]["stages"][1]["input_tokens"] = 700
    doc["tasks"][0]["stages"][1]["output_tokens"] = 101
    expect_error(doc, "tasks[t1].stages[s2]", "1001", "server.kv_capacity_tokens", "1000")


def test_stage_that_exactly_fits_is_valid() -> None:
    doc = base_doc()
    doc["tasks"][0]["stages"][1]["input_tokens"] = 700
    doc["tasks"][0]["stages"][1]["output_tokens"] = 100
    Instance.from_dict(doc)


def test_fit_is_checked_against_the_true_output_not_the_prediction() -> None:
    doc = base_doc()
    stage = doc["tasks"][0]["stages"][1]
    stage["input_tokens"], stage["output_tokens"] = 700, 101
    stage["predicted_output_tokens"] = 1  # a small prediction does not make it fit
    expect_error(doc, "tasks[t1].stages[s2]", "1001")


# --------------------------------------------------------------------------- server


@pytest.mark.parametrize("value", [0, -3, 1.5, True, "4"], ids=repr)
def test_bad_max_running(value: Any) -> None:
    expect_error(_mutated(("server", "max_running"), value), "server.max_running", repr(value))


def test_bad_mixed_chunk() -> None:
    expect_error(_mutated(("server", "mixed_chunk"), "yes"), "server.mixed_chunk", "'yes'")
    expect_error(_mutated(("server", "mixed_chunk"), 1), "server.mixed_chunk", "1")


@pytest.mark.parametrize("kind", ["quadratic", "", None, 3])
def test_unknown_cost_model_kind(kind: Any) -> None:
    expect_error(
        _mutated(("server", "cost_model"), {"kind": kind}), "server.cost_model.kind", repr(kind)
    )


def test_cost_model_missing_kind() -> None:
    expect_error(
        _mutated(("server", "cost_model"), {"step_s": 1.0}), "server.cost_model.kind", "None"
    )


def test_cost_model_not_an_object() -> None:
    expect_error(_mutated(("server", "cost_model"), "step"), "server.cost_model")


LINEAR = {
    "kind": "linear",
    "base_s": 0.0048,
    "prefill_token_s": 2.5e-5,
    "decode_seq_s": 2.0e-5,
    "kv_token_s": 3.9e-8,
}


@pytest.mark.parametrize("param", ["base_s", "prefill_token_s", "decode_seq_s", "kv_token_s"])
def test_linear_cost_model_missing_parameter(param: str) -> None:
    model = {k: v for k, v in LINEAR.items() if k != param}
    expect_error(_mutated(("server", "cost_model"), model), f"server.cost_model.{param}", "missing")


@pytest.mark.parametrize(
    "param,value",
    [
        ("base_s", 0),
        ("base_s", -1.0),
        ("prefill_token_s", -1e-9),
        ("decode_seq_s", "0"),
        ("kv_token_s", float("nan")),
        ("base_s", float("inf")),
        ("kv_token_s", True),
    ],
    ids=repr,
)
def test_linear_cost_model_bad_parameter(param: str, value: Any) -> None:
    model = dict(LINEAR, **{param: value})
    expect_error(
        _mutated(("server", "cost_model"), model), f"server.cost_model.{param}", repr(value)
    )


def test_linear_cost_model_zero_marginal_terms_allowed() -> None:
    model = dict(LINEAR, prefill_token_s=0, decode_seq_s=0.0, kv_token_s=0)
    inst = Instance.from_dict(_mutated(("server", "cost_model"), model))
    assert inst.server.cost_model == LinearCost(0.0048, 0, 0.0, 0)


@pytest.mark.parametrize(
    "value", [0, 0.0, -1, "1", float("nan"), float("inf"), None, True], ids=repr
)
def test_step_cost_model_bad_step(value: Any) -> None:
    expect_error(
        _mutated(("server", "cost_model"), {"kind": "step", "step_s": value}),
        "server.cost_model.step_s",
        repr(value),
    )


def test_step_cost_model_default_step() -> None:
    inst = Instance.from_dict(_mutated(("server", "cost_model"), {"kind": "step"}))
    assert inst.server.cost_model == StepCost(1.0)


@pytest.mark.parametrize("kind", ["disk", "", None])
def test_unknown_prefix_load_kind(kind: Any) -> None:
    expect_error(
        _mutated(("server", "prefix_load"), {"kind": kind}), "server.prefix_load.kind", repr(kind)
    )


def test_prefix_load_not_an_object() -> None:
    expect_error(_mutated(("server", "prefix_load"), "host"), "server.prefix_load")


def test_host_prefix_load_missing_rate() -> None:
    expect_error(
        _mutated(("server", "prefix_load"), {"kind": "host"}),
        "server.prefix_load.tokens_per_s",
        "missing",
    )


@pytest.mark.parametrize("value", [0, -5, "100", float("nan"), None], ids=repr)
def test_host_prefix_load_bad_rate(value: Any) -> None:
    expect_error(
        _mutated(("server", "prefix_load"), {"kind": "host", "tokens_per_s": value}),
        "server.prefix_load.tokens_per_s",
        repr(value),
    )


# --------------------------------------------------------------------------- structure


def test_task_with_no_stages() -> None:
    expect_error(_mutated(("tasks", 1, "stages"), []), "tasks[t2].stages", "at least one")


@pytest.mark.parametrize(
    "path,where",
    [
        (("server",), "server"),
        (("agents",), "agents"),
        (("tasks",), "tasks"),
        (("server", "kv_capacity_tokens"), "server.kv_capacity_tokens"),
        (("server", "chunk_tokens"), "server.chunk_tokens"),
        (("agents", 1, "id"), "agents[1].id"),
        (("agents", 1, "prefix_tokens"), "agents[eng].prefix_tokens"),
        (("tasks", 1, "id"), "tasks[1].id"),
        (("tasks", 1, "arrival"), "tasks[t2].arrival"),
        (("tasks", 1, "stages"), "tasks[t2].stages"),
        (("tasks", 0, "stages", 1, "id"), "tasks[t1].stages[1].id"),
        (("tasks", 0, "stages", 1, "agent"), "tasks[t1].stages[s2].agent"),
        (("tasks", 0, "stages", 1, "input_tokens"), "tasks[t1].stages[s2].input_tokens"),
        (("tasks", 0, "stages", 1, "output_tokens"), "tasks[t1].stages[s2].output_tokens"),
    ],
    ids=lambda x: ".".join(map(str, x)) if isinstance(x, tuple) else None,
)
def test_missing_required_field(path: tuple, where: str) -> None:
    expect_error(_without(path), where, "missing")


@pytest.mark.parametrize(
    "path,value,where",
    [
        (("server",), [], "server"),
        (("server",), None, "server"),
        (("agents",), {"pm": 100}, "agents"),
        (("tasks",), {}, "tasks"),
        (("agents", 0), "pm", "agents[0]"),
        (("tasks", 1), ["t2"], "tasks[1]"),
        (("tasks", 0, "stages"), {"s1": {}}, "tasks[t1].stages"),
        (("tasks", 0, "stages", 2), "s3", "tasks[t1].stages[2]"),
        (("tasks", 0, "stages", 1, "deps"), "s1", "tasks[t1].stages[s2].deps"),
        (("tasks", 0, "stages", 1, "deps"), [1], "tasks[t1].stages[s2].deps"),
        (("tasks", 0, "stages", 1, "agent"), 7, "tasks[t1].stages[s2].agent"),
        (("tasks", 0, "workflow"), 7, "tasks[t1].workflow"),
        (("name",), 7, "name"),
    ],
    ids=lambda x: ".".join(map(str, x)) if isinstance(x, tuple) else None,
)
def test_wrong_type(path: tuple, value: Any, where: str) -> None:
    expect_error(_mutated(path, value), where)


@pytest.mark.parametrize("value", ["", 3, None])
def test_bad_agent_id(value: Any) -> None:
    expect_error(_mutated(("agents", 0, "id"), value), "agents", ".id", repr(value))


@pytest.mark.parametrize("value", ["", 3, None])
def test_bad_task_id(value: Any) -> None:
    expect_error(_mutated(("tasks", 0, "id"), value), "tasks", ".id", repr(value))


@pytest.mark.parametrize("value", ["", 3])
def test_bad_stage_id(value: Any) -> None:
    expect_error(
        _mutated(("tasks", 0, "stages", 0, "id"), value), "tasks[t1].stages", ".id", repr(value)
    )


# --------------------------------------------------------------------------- direct construction


def test_dataclasses_validate_when_built_directly() -> None:
    with pytest.raises(InstanceError, match="prefix_tokens"):
        Agent("a", 0)
    with pytest.raises(InstanceError, match=r"stages\[s\]\.output_tokens"):
        Stage("s", "a", 1, -2)
    with pytest.raises(InstanceError, match=r"tasks\[t\]\.stages"):
        Task("t", 0.0, ())
    with pytest.raises(InstanceError, match="kv_capacity_tokens"):
        ServerSpec(kv_capacity_tokens=0, chunk_tokens=1)
    with pytest.raises(InstanceError, match=r"tasks\[t\]\.stages\[s\]\.agent"):
        Instance(ServerSpec(100, 8), (Agent("a", 1),), (Task("t", 0, (Stage("s", "b", 1, 1),)),))


def test_instance_is_frozen() -> None:
    inst = Instance.from_dict(base_doc())
    with pytest.raises(dataclasses.FrozenInstanceError):
        inst.name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        inst.tasks[0].stages[0].input_tokens = 3  # type: ignore[misc]


# --------------------------------------------------------------------------- load_instance errors


def _load_error(path: Path) -> str:
    with pytest.raises(InstanceError) as info:
        load_instance(path)
    msg = str(info.value)
    assert str(path) in msg, f"file not named in {msg!r}"
    assert "\n" not in msg
    return msg


def test_load_missing_file(tmp_path: Path) -> None:
    _load_error(tmp_path / "nope.json")


def test_load_directory(tmp_path: Path) -> None:
    d = tmp_path / "adir.json"
    d.mkdir()
    _load_error(d)


def test_load_truncated_json(tmp_path: Path) -> None:
    text = json.dumps(base_doc(), indent=1)
    path = tmp_path / "trunc.json"
    path.write_text(text[: len(text) // 2])
    msg = _load_error(path)
    assert "line" in msg and "JSON" in msg


def test_load_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n "format": "topas-instance/1",\n "name": oops,\n "server": {}\n}\n')
    msg = _load_error(path)
    assert "line 3" in msg


def test_load_trailing_comma(tmp_path: Path) -> None:
    path = tmp_path / "comma.json"
    path.write_text('{"format": "topas-instance/1",\n\n "agents": [1, 2,],\n}')
    msg = _load_error(path)
    assert "line 3" in msg


def test_load_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    path.write_text("")
    assert "line 1" in _load_error(path)


def test_load_non_object_document(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text("[1, 2, 3]\n")
    assert "document" in _load_error(path)


def test_load_semantic_error_names_file_field_and_id(tmp_path: Path) -> None:
    path = tmp_path / "dangling.json"
    path.write_text(json.dumps(_mutated(("tasks", 0, "stages", 1, "deps"), ["nope"])))
    msg = _load_error(path)
    assert "tasks[t1].stages[s2].deps" in msg and "'nope'" in msg


def test_load_unknown_format_names_file(tmp_path: Path) -> None:
    path = tmp_path / "fmt.json"
    path.write_text(json.dumps(_mutated(("format",), "topas-result/1")))
    assert "'topas-result/1'" in _load_error(path)


def test_load_non_utf8_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(json.dumps(base_doc()).replace("base", "caf\u00e9").encode("latin-1"))
    _load_error(path)


# --------------------------------------------------------------------------- valid inputs


def minimal_doc() -> dict[str, Any]:
    return {
        "format": FORMAT,
        "server": {"kv_capacity_tokens": 100, "chunk_tokens": 16},
        "agents": [{"id": "a", "prefix_tokens": 10}],
        "tasks": [
            {
                "id": "t",
                "arrival": 3,
                "stages": [
                    {"id": "s", "agent": "a", "input_tokens": 5, "output_tokens": 7},
                    {"id": "u", "agent": "a", "input_tokens": 5, "output_tokens": 7, "deps": ["s"]},
                ],
            }
        ],
    }


def test_optional_fields_get_defaults() -> None:
    inst = Instance.from_dict(minimal_doc())
    assert inst.name == "instance"
    server = inst.server
    assert server.max_running is None
    assert server.cost_model is None
    assert server.prefix_load == RecomputeLoad()
    assert server.mixed_chunk is False
    task = inst.tasks[0]
    assert task.workflow is None
    s = task.stage_by_id["s"]
    assert s.deps == ()
    assert s.predicted_output_tokens is None
    assert s.predicted_output == s.output_tokens == 7
    assert task.stage_by_id["u"].deps == ("s",)


def test_prediction_is_what_policies_see() -> None:
    inst = Instance.from_dict(base_doc())
    s2 = inst.stage(("t1", "s2"))
    assert s2.output_tokens == 8 and s2.predicted_output_tokens == 6 and s2.predicted_output == 6


def test_defaults_are_written_out_canonically() -> None:
    out = Instance.from_dict(minimal_doc()).to_dict()
    assert out["name"] == "instance"
    assert out["server"] == {
        "kv_capacity_tokens": 100,
        "chunk_tokens": 16,
        "prefix_load": {"kind": "recompute"},
    }
    assert out["tasks"][0]["stages"][0]["deps"] == []
    assert "predicted_output_tokens" not in out["tasks"][0]["stages"][0]
    assert "workflow" not in out["tasks"][0]


@pytest.mark.parametrize("arrival", [0, 3, 10**6, 0.0, 1.5, 1e-9])
def test_integer_and_float_arrivals(arrival: float) -> None:
    doc = minimal_doc()
    doc["tasks"][0]["arrival"] = arrival
    inst = Instance.from_dict(doc)
    assert inst.tasks[0].arrival == arrival
    assert type(inst.to_dict()["tasks"][0]["arrival"]) is type(arrival)


def test_extra_unknown_keys_are_ignored() -> None:
    doc = base_doc()
    doc["comment"] = "hand written"
    doc["server"]["gpu"] = "H100"
    doc["server"]["cost_model"]["note"] = "x"
    doc["server"]["prefix_load"]["tier"] = "L2"
    doc["agents"][0]["role"] = "product manager"
    doc["tasks"][0]["user"] = 42
    doc["tasks"][0]["stages"][1]["temperature"] = 0.7
    inst = Instance.from_dict(doc)
    assert inst == Instance.from_dict(base_doc())
    assert inst.to_dict() == base_doc()


def test_lookups_and_graph() -> None:
    inst = Instance.from_dict(base_doc())
    assert inst.num_stages == 4
    assert set(inst.agent_by_id) == {"pm", "eng"}
    t1 = inst.task_by_id["t1"]
    assert t1.children == {"s1": ("s2", "s3"), "s2": ("s3",), "s3": ()}
    assert t1.topo_order == ("s1", "s2", "s3")
    assert set(t1.graph.edges) == {("s1", "s2"), ("s1", "s3"), ("s2", "s3")}


def test_null_optional_server_fields_mean_default() -> None:
    doc = minimal_doc()
    doc["server"].update(max_running=None, cost_model=None, prefix_load=None)
    inst = Instance.from_dict(doc)
    assert inst.server == ServerSpec(kv_capacity_tokens=100, chunk_tokens=16)


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", list(CANONICAL_DOCS))
def test_round_trip_dict(name: str) -> None:
    doc = CANONICAL_DOCS[name]()
    out = Instance.from_dict(copy.deepcopy(doc)).to_dict()
    assert out == doc
    assert json.dumps(out) == json.dumps(doc), "key order differs from the canonical one"


@pytest.mark.parametrize("name", list(CANONICAL_DOCS))
def test_round_trip_json_is_byte_identical(name: str) -> None:
    inst = Instance.from_dict(CANONICAL_DOCS[name]())
    text = inst.to_json()
    again = Instance.from_dict(json.loads(text))
    assert again == inst
    assert again.to_json() == text
    assert text == json.dumps(CANONICAL_DOCS[name](), indent=1)


@pytest.mark.parametrize("name", list(CANONICAL_DOCS))
def test_save_then_load(tmp_path: Path, name: str) -> None:
    inst = Instance.from_dict(CANONICAL_DOCS[name]())
    path = tmp_path / "sub" / "dir" / f"{name}.json"
    save_instance(inst, path)
    assert path.read_text() == inst.to_json() + "\n"
    loaded = load_instance(path)
    assert loaded == inst
    assert loaded.content_hash == inst.content_hash
    assert os.listdir(path.parent) == [path.name]


def test_save_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("old")
    inst = Instance.from_dict(base_doc())
    save_instance(inst, str(path))
    assert load_instance(str(path)) == inst
    assert os.listdir(tmp_path) == ["x.json"]


def test_typed_objects_round_trip() -> None:
    inst = Instance.from_dict(linear_host_doc())
    assert inst.server.cost_model == LinearCost(0.0048, 2.5e-5, 2e-5, 3.9e-8)
    assert inst.server.prefix_load == HostLoad(200000)
    assert inst.server.mixed_chunk is True
    step = Instance.from_dict(step_host_doc())
    assert step.server.cost_model == StepCost(0.25)
    assert step.server.prefix_load == HostLoad(12.5)
    assert step.server.max_running == 1


# --------------------------------------------------------------------------- content hash


def _token_paths(doc: dict[str, Any]) -> list[tuple]:
    paths: list[tuple] = [("server", "kv_capacity_tokens"), ("server", "chunk_tokens")]
    paths += [("agents", i, "prefix_tokens") for i in range(len(doc["agents"]))]
    for i, t in enumerate(doc["tasks"]):
        for j, s in enumerate(t["stages"]):
            for key in ("input_tokens", "output_tokens", "predicted_output_tokens"):
                if key in s:
                    paths.append(("tasks", i, "stages", j, key))
    return paths


@pytest.mark.parametrize("name", list(CANONICAL_DOCS))
def test_content_hash_is_stable(name: str) -> None:
    doc = CANONICAL_DOCS[name]()
    h = Instance.from_dict(doc).content_hash
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    assert Instance.from_dict(CANONICAL_DOCS[name]()).content_hash == h
    expected = hashlib.sha256(
        json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    assert h == expected
    # Key order, whitespace and unknown keys of the input do not matter.
    shuffled = json.loads(json.dumps(doc, sort_keys=True, indent=4))
    shuffled["extra"] = {"ignored": True}
    assert Instance.from_dict(shuffled).content_hash == h


@pytest.mark.parametrize("name", list(CANONICAL_DOCS))
def test_content_hash_changes_with_every_token_count(name: str) -> None:
    doc = CANONICAL_DOCS[name]()
    # Make room so that every +1 still fits.
    doc["server"]["kv_capacity_tokens"] += 10
    base_hash = Instance.from_dict(doc).content_hash
    seen = {base_hash}
    paths = _token_paths(doc)
    assert len(paths) >= 5
    for path in paths:
        changed = copy.deepcopy(doc)
        node = changed
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] += 1
        h = Instance.from_dict(changed).content_hash
        assert h != base_hash, f"hash unchanged when {path} changed"
        seen.add(h)
    assert len(seen) == len(paths) + 1


def test_content_hash_changes_with_structure() -> None:
    base_hash = Instance.from_dict(base_doc()).content_hash
    assert Instance.from_dict(_mutated(("tasks", 1, "arrival"), 2.75)).content_hash != base_hash
    assert (
        Instance.from_dict(_mutated(("tasks", 0, "stages", 2, "deps"), ["s2"])).content_hash
        != base_hash
    )
    assert Instance.from_dict(_mutated(("server", "max_running"), 5)).content_hash != base_hash


# --------------------------------------------------------------------------- hypothesis

ID = st.text(alphabet="abcxyz_-019.é", min_size=1, max_size=4)
FINITE_POS = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)
FINITE_NONNEG = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)


@st.composite
def instance_docs(draw: st.DrawFn) -> dict[str, Any]:
    agent_ids = draw(st.lists(ID, min_size=1, max_size=3, unique=True))
    prefixes = {a: draw(st.integers(1, 300)) for a in agent_ids}
    task_ids = draw(st.lists(ID, min_size=1, max_size=3, unique=True))
    tasks = []
    need = max(prefixes.values())
    for tid in task_ids:
        stage_ids = draw(st.lists(ID, min_size=1, max_size=5, unique=True))
        stages = []
        for k, sid in enumerate(stage_ids):
            # deps only on earlier stages: a DAG; the listing order is then shuffled.
            deps = draw(
                st.lists(st.sampled_from(stage_ids[:k]), unique=True, max_size=k)
                if k
                else st.just([])
            )
            agent = draw(st.sampled_from(agent_ids))
            stage: dict[str, Any] = {
                "id": sid,
                "agent": agent,
                "input_tokens": draw(st.integers(1, 500)),
                "output_tokens": draw(st.integers(1, 500)),
                "deps": deps,
            }
            if draw(st.booleans()):
                stage["predicted_output_tokens"] = draw(st.integers(1, 1000))
            need = max(need, prefixes[agent] + stage["input_tokens"] + stage["output_tokens"])
            stages.append(stage)
        stages = draw(st.permutations(stages))
        task: dict[str, Any] = {
            "id": tid,
            "arrival": draw(st.integers(0, 1000) | FINITE_NONNEG),
        }
        if draw(st.booleans()):
            task["workflow"] = draw(ID)
        task["stages"] = list(stages)
        tasks.append(task)
    server: dict[str, Any] = {
        "kv_capacity_tokens": need + draw(st.integers(0, 100)),
        "chunk_tokens": draw(st.integers(1, 4096)),
    }
    if draw(st.booleans()):
        server["max_running"] = draw(st.integers(1, 64))
    cost = draw(st.sampled_from(["none", "step", "linear"]))
    if cost == "step":
        server["cost_model"] = {"kind": "step", "step_s": draw(FINITE_POS)}
    elif cost == "linear":
        server["cost_model"] = {
            "kind": "linear",
            "base_s": draw(FINITE_POS),
            "prefill_token_s": draw(FINITE_NONNEG),
            "decode_seq_s": draw(FINITE_NONNEG),
            "kv_token_s": draw(FINITE_NONNEG),
        }
    if draw(st.booleans()):
        server["prefix_load"] = {"kind": "host", "tokens_per_s": draw(FINITE_POS)}
    else:
        server["prefix_load"] = {"kind": "recompute"}
    if draw(st.booleans()):
        server["mixed_chunk"] = True
    return {
        "format": FORMAT,
        "name": draw(st.text(max_size=8)),
        "server": server,
        "agents": [{"id": a, "prefix_tokens": prefixes[a]} for a in agent_ids],
        "tasks": tasks,
    }


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance_docs())
def test_random_instances_round_trip(doc: dict[str, Any]) -> None:
    inst = Instance.from_dict(copy.deepcopy(doc))
    assert inst.to_dict() == doc
    text = inst.to_json()
    assert text == json.dumps(doc, indent=1)
    again = Instance.from_dict(json.loads(text))
    assert again == inst
    assert again.to_json() == text
    assert again.content_hash == inst.content_hash
    for task in inst.tasks:
        order = task.topo_order
        assert sorted(order) == sorted(s.id for s in task.stages)
        pos = {sid: i for i, sid in enumerate(order)}
        assert all(pos[d] < pos[s.id] for s in task.stages for d in s.deps)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance_docs(), st.data())
def test_random_instances_reject_a_dangling_dep(doc: dict[str, Any], data: st.DataObject) -> None:
    t = data.draw(st.integers(0, len(doc["tasks"]) - 1))
    task = doc["tasks"][t]
    s = data.draw(st.integers(0, len(task["stages"]) - 1))
    stage = task["stages"][s]
    stage["deps"] = [*stage["deps"], "\u2603missing"]
    expect_error(doc, f"tasks[{task['id']}].stages[{stage['id']}].deps", "missing")


# --------------------------------------------------------------------------- atomic save


@pytest.fixture
def inst() -> Instance:
    return Instance.from_dict(base_doc())


def test_save_is_atomic_when_to_json_fails(
    tmp_path: Path, inst: Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(self: Instance) -> str:
        raise RuntimeError("serialisation failed")

    monkeypatch.setattr(Instance, "to_json", boom)
    with pytest.raises(RuntimeError):
        save_instance(inst, tmp_path / "out.json")
    assert os.listdir(tmp_path) == []


def test_save_is_atomic_when_json_dumps_fails(
    tmp_path: Path, inst: Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: Any, **kwargs: Any) -> str:
        raise TypeError("not serialisable")

    monkeypatch.setattr(instance_mod.json, "dumps", boom)
    with pytest.raises(TypeError):
        save_instance(inst, tmp_path / "out.json")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


class _HalfWriter:
    """A file object that writes half of what it is given, then fails (disk full)."""

    def __init__(self, f: Any) -> None:
        self.f = f

    def __enter__(self) -> _HalfWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.f.close()

    def write(self, text: str) -> int:
        self.f.write(text[: len(text) // 2])
        self.f.flush()
        raise OSError(28, "No space left on device")


def test_save_is_atomic_when_the_write_fails_midway(
    tmp_path: Path, inst: Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out.json"
    target.write_text("previous contents\n")
    real_fdopen = os.fdopen
    monkeypatch.setattr(
        instance_mod.os, "fdopen", lambda fd, *a, **k: _HalfWriter(real_fdopen(fd, *a, **k))
    )
    with pytest.raises(OSError):
        save_instance(inst, target)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["out.json"]
    assert target.read_text() == "previous contents\n"


def test_save_is_atomic_when_the_rename_fails(
    tmp_path: Path, inst: Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(src: Any, dst: Any) -> None:
        assert Path(src).exists()  # the temporary file was written
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(instance_mod.os, "replace", boom)
    with pytest.raises(OSError):
        save_instance(inst, tmp_path / "out.json")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_save_is_atomic_on_keyboard_interrupt(
    tmp_path: Path, inst: Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(src: Any, dst: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(instance_mod.os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        save_instance(inst, tmp_path / "out.json")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_saved_file_honours_the_umask(tmp_path: Path, inst: Instance) -> None:
    old = os.umask(0o022)
    try:
        save_instance(inst, tmp_path / "out.json")
    finally:
        os.umask(old)
    assert (tmp_path / "out.json").stat().st_mode & 0o777 == 0o644


def test_write_atomic_writes_text_or_bytes_and_leaves_nothing_behind(tmp_path):
    # the project's one atomic writer: text as UTF-8, bytes as they are; a failed write
    # (the target is a folder) names the target and leaves no temporary file
    from topas.instance import write_atomic

    write_atomic(tmp_path / "sub" / "a.txt", "é\n")
    write_atomic(tmp_path / "b.png", b"\x89PNG")
    assert (tmp_path / "sub" / "a.txt").read_bytes() == "é\n".encode()
    assert (tmp_path / "b.png").read_bytes() == b"\x89PNG"
    (tmp_path / "dir").mkdir()
    with pytest.raises(OSError, match="dir"):
        write_atomic(tmp_path / "dir", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.png", "dir", "sub"]


# --------------------------------------------------------------------------- DAG tails


def test_longest_tails_hand_solved():
    # a -> b -> d, a -> c -> d with own times a=1, b=5, c=2, d=1: the tail of a is
    # 1 + max(5, 2) + 1 = 7, of b 5 + 1 = 6, of c 2 + 1 = 3, of d 1
    from topas.instance import longest_tails

    children = {"a": ("b", "c"), "b": ("d",), "c": ("d",), "d": ()}
    own = {"a": 1, "b": 5, "c": 2, "d": 1}
    tails = longest_tails(("a", "b", "c", "d"), children.__getitem__, own.__getitem__)
    assert tails == {"a": 7, "b": 6, "c": 3, "d": 1}


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=15), st.data())
def test_longest_tails_equal_the_heaviest_path_by_enumeration(edges, data):
    import networkx as nx

    from topas.instance import longest_tails

    g = nx.DiGraph()
    g.add_nodes_from(range(7))
    g.add_edges_from((u, v) for u, v in edges if u < v)  # acyclic by construction
    own = {n: data.draw(st.integers(1, 9)) for n in g}
    tails = longest_tails(list(nx.topological_sort(g)), g.successors, own.__getitem__)
    for n in g:  # every path from n (n alone included), node weights summed
        paths = [[n]] + [p for t in nx.descendants(g, n) for p in nx.all_simple_paths(g, n, t)]
        assert tails[n] == max(sum(own[m] for m in p) for p in paths)


@st.composite
def _dags(draw):  # type: ignore[no-untyped-def]
    """Stages with random ids (so that id order and stage order differ) and deps on
    earlier stages only."""
    ids = draw(st.lists(st.text("abcxyz", min_size=1, max_size=3), min_size=1, max_size=9,
                        unique=True))  # fmt: skip
    stages = []
    for i, sid in enumerate(ids):
        deps = draw(st.lists(st.sampled_from(ids[:i]), unique=True)) if i else []
        stages.append(Stage(sid, "a", 1, 1, tuple(deps)))
    return Task("t", 0.0, tuple(draw(st.permutations(stages))))


@given(task=_dags())
def test_topo_order_is_networkx_lexicographical_topological_sort(task) -> None:
    import networkx as nx

    assert task.topo_order == tuple(nx.lexicographical_topological_sort(task.graph))
