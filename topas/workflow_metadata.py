"""Workflow metadata that travels with each LLM request to a serving engine.

A request that is one stage of a TOPAS task carries, in SGLang's
``sampling_params.custom_params["topas"]``, a JSON *string* (SGLang accepts only flat
values there: a nested object makes its scheduler fail) with schema ``topas-meta/1``::

    {"v": 1, "task": "t17", "stage": "s3", "agent": "engineer", "prefix": 2048,
     "arrival": 12.5, "prefixes": {"pm": 1024, "arch": 1536, "engineer": 2048},
     "dag": [["s0", "pm", 812, 300, []], ["s1", "arch", 640, 420, ["s0"]], ...]}

``prefix`` is the agent's system-prompt length in tokens (the request's first ``prefix``
input tokens). ``dag`` lists every stage of the task as ``[id, agent, input_tokens,
predicted_output_tokens, deps]``, so the scheduler can score the task's remaining path
from any one of its requests. ``arrival`` (seconds, the client's clock) is optional.
``prefixes`` (optional, an extension within version 1) gives the system-prompt length of
the task's other agents, so that the scheduler can price their prompts before it has seen
one of their requests.

:func:`encode` builds the ``custom_params`` entry from a :class:`~topas.instance.Task`;
:func:`decode` validates one and returns a :class:`StageMeta`, raising
:class:`MetadataError` with a one-line reason naming the field, so an integration can
fall back to the engine's own order for that request.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from topas.errors import InputError
from topas.instance import InstanceError, Stage, Task

KEY = "topas"
"""The ``custom_params`` key that holds the metadata."""

VERSION = 1
SCHEMA = "topas-meta/1"


class MetadataError(InputError):
    """Metadata that is missing or malformed: the request is scheduled as untagged."""


@dataclass(frozen=True)
class StageMeta:
    """One request's place in its workflow."""

    task: Task  # the whole DAG, predicted output lengths in ``predicted_output_tokens``
    stage: str
    agent: str
    prefix_tokens: int
    arrival: float | None = None
    prefixes: Mapping[str, int] = field(default_factory=dict)  # other agents' prompt lengths

    @property
    def ref(self) -> tuple[str, str]:
        return (self.task.id, self.stage)


def encode(
    task: Task,
    stage: str,
    prefix_tokens: int,
    arrival: float | None = None,
    prefixes: Mapping[str, int] | None = None,
) -> dict[str, str]:
    """The ``custom_params`` entry for the request of ``stage`` of ``task``.

    Stages are told their predicted output (``predicted_output_tokens``, else the truth:
    the instance's own convention). ``prefixes``: prompt lengths of the task's agents
    (only those of the task's agents are sent).
    """
    s = task.stage_by_id[stage]
    doc: dict[str, Any] = {
        "v": VERSION,
        "task": task.id,
        "stage": stage,
        "agent": s.agent,
        "prefix": prefix_tokens,
        "dag": [
            [x.id, x.agent, x.input_tokens, x.predicted_output, list(x.deps)] for x in task.stages
        ],
    }
    if arrival is not None:
        doc["arrival"] = arrival
    if prefixes:
        agents = {x.agent for x in task.stages}
        doc["prefixes"] = {a: n for a, n in sorted(prefixes.items()) if a in agents}
    return {KEY: json.dumps(doc, separators=(",", ":"))}


def decode(custom_params: Mapping[str, Any] | None) -> StageMeta:
    """The metadata of a request from its ``custom_params``; raises MetadataError."""
    if not isinstance(custom_params, Mapping) or KEY not in custom_params:
        raise MetadataError(f"custom_params.{KEY}: missing")
    raw = custom_params[KEY]
    if not isinstance(raw, str):
        raise MetadataError(
            f"custom_params.{KEY}: expected a JSON string, got {type(raw).__name__}"
        )
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise MetadataError(f"custom_params.{KEY}: not JSON ({e.msg})") from None
    if not isinstance(doc, dict):
        raise MetadataError(f"{SCHEMA}: expected an object")
    if doc.get("v") != VERSION:
        raise MetadataError(f"{SCHEMA}.v: expected {VERSION}, got {doc.get('v')!r}")
    tid = _field(doc, "task", str)
    sid = _field(doc, "stage", str)
    agent = _field(doc, "agent", str)
    prefix = _field(doc, "prefix", int)
    if prefix < 0:
        raise MetadataError(f"{SCHEMA}.prefix: must be >= 0, got {prefix}")
    arrival = doc.get("arrival")
    if arrival is not None and not (_is_number(arrival) and math.isfinite(arrival)):
        raise MetadataError(f"{SCHEMA}.arrival: expected a finite number, got {arrival!r}")
    task = _task_of(tid, _field(doc, "dag", list))
    if sid not in task.stage_by_id:
        raise MetadataError(f"{SCHEMA}.stage: {sid!r} is not a stage of task {tid!r}")
    if task.stage_by_id[sid].agent != agent:
        raise MetadataError(
            f"{SCHEMA}.agent: {agent!r}, but the dag gives stage {sid!r} to "
            f"{task.stage_by_id[sid].agent!r}"
        )
    when = None if arrival is None else float(arrival)
    return StageMeta(task, sid, agent, prefix, when, _prefixes(doc.get("prefixes", {})))


def _prefixes(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise MetadataError(f"{SCHEMA}.prefixes: expected an object, got {value!r}")
    for agent, n in value.items():
        if not (_is_int(n) and n >= 0):
            raise MetadataError(f"{SCHEMA}.prefixes.{agent}: expected an integer >= 0, got {n!r}")
    return dict(value)


def _field(doc: Mapping[str, Any], name: str, kind: type) -> Any:
    if name not in doc:
        raise MetadataError(f"{SCHEMA}.{name}: missing")
    value = doc[name]
    ok = _is_int(value) if kind is int else isinstance(value, kind)
    if not ok:
        raise MetadataError(f"{SCHEMA}.{name}: expected {kind.__name__}, got {value!r}")
    return value


def _task_of(tid: str, dag: list) -> Task:
    """The Task of ``dag``; the one decoded last for ``tid`` when its dag is the same JSON.
    Every stage's request carries its task's whole dag: the requests of one task share one
    Task (and its cached analyses), built and validated once. The dag is compared as JSON
    text, not as Python values, so that ``true`` or ``1.0`` where ``1`` was seen is
    validated (and refused), not taken for it."""
    text = json.dumps(dag, separators=(",", ":"))
    hit = _BUILT.get(tid)
    if hit is not None and hit[0] == text:
        return hit[1]
    task = _task(tid, dag)
    if len(_BUILT) >= MAX_BUILT:
        _BUILT.clear()
    _BUILT[tid] = (text, task)
    return task


MAX_BUILT = 1 << 14
_BUILT: dict[str, tuple[str, Task]] = {}  # task id -> the dag last decoded for it, its Task


def _task(tid: str, dag: list) -> Task:
    stages = []
    for i, row in enumerate(dag):
        where = f"{SCHEMA}.dag[{i}]"
        if not (isinstance(row, list) and len(row) == 5):
            raise MetadataError(f"{where}: expected [id, agent, input, predicted output, deps]")
        sid, agent, inp, out, deps = row
        if not (isinstance(deps, list) and all(isinstance(d, str) for d in deps)):
            raise MetadataError(f"{where}: deps must be a list of stage ids")
        if not (_is_int(inp) and _is_int(out)):
            raise MetadataError(f"{where}: token counts must be integers")
        try:
            stages.append(Stage(sid, agent, inp, out, tuple(deps)))
        except InstanceError as e:
            raise MetadataError(f"{where}: {e}") from None
    try:
        return Task(tid, 0.0, tuple(stages))
    except InstanceError as e:
        raise MetadataError(f"{SCHEMA}.dag: {e}") from None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)
