"""Problem data: server, agents, tasks and stages, validated on construction.

An :class:`Instance` is the whole input of a scheduling run. It is frozen, checks
itself when built (errors name the field and the id at fault) and round-trips
through the ``topas-instance/1`` JSON format of ``DESIGN.md``.

This module imports nothing from the rest of the package.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import networkx as nx

from topas.errors import InputError

K = TypeVar("K")
N = TypeVar("N", int, float)

FORMAT = "topas-instance/1"

_UMASK = os.umask(0)
os.umask(_UMASK)

StageRef = tuple[str, str]
"""A stage is named by ``(task_id, stage_id)``: stage ids are unique within a task."""


class InstanceError(InputError):
    """An instance is malformed. The message names the file (when known), field and id."""


# --------------------------------------------------------------------------- server


@dataclass(frozen=True)
class StepCost:
    """The exact step model: one step lasts ``step_s`` seconds (DESIGN rule 1)."""

    step_s: float = 1.0
    kind: str = field(default="step", init=False)

    def __post_init__(self) -> None:
        _require_positive_float(self.step_s, "server.cost_model.step_s")


@dataclass(frozen=True)
class LinearCost:
    """Iteration time ``base_s + prefill_token_s*P + decode_seq_s*D + kv_token_s*K``."""

    base_s: float
    prefill_token_s: float
    decode_seq_s: float
    kv_token_s: float
    kind: str = field(default="linear", init=False)

    def __post_init__(self) -> None:
        _require_positive_float(self.base_s, "server.cost_model.base_s")
        for name in ("prefill_token_s", "decode_seq_s", "kv_token_s"):
            _require_nonnegative_float(getattr(self, name), f"server.cost_model.{name}")


CostModel = StepCost | LinearCost


@dataclass(frozen=True)
class RecomputeLoad:
    """A missing prefix is recomputed by prefill (SGLang's default)."""

    kind: str = field(default="recompute", init=False)


@dataclass(frozen=True)
class HostLoad:
    """A missing prefix is copied from host memory at ``tokens_per_s`` (hierarchical cache)."""

    tokens_per_s: float
    kind: str = field(default="host", init=False)

    def __post_init__(self) -> None:
        _require_positive_float(self.tokens_per_s, "server.prefix_load.tokens_per_s")


PrefixLoad = RecomputeLoad | HostLoad


@dataclass(frozen=True)
class ProfileRecord:
    """Which server profile an instance was made for, with the numbers behind its swap rate.

    An extension of ``topas-instance/1`` (``server.profile``, docs/formats.md): the
    profile's name, ``mu`` (KV bytes per token) and ``B_swap`` (host link bytes per
    second). With host prefix loads, ``prefix_load.tokens_per_s`` must equal
    ``swap_bytes_per_s / kv_bytes_per_token``. The cost model, KV budget and chunk are
    recorded where they always are.
    """

    name: str
    kv_bytes_per_token: int
    swap_bytes_per_s: float

    def __post_init__(self) -> None:
        _require_id(self.name, "server.profile.name")
        _require_positive_int(self.kv_bytes_per_token, "server.profile.kv_bytes_per_token")
        _require_positive_float(self.swap_bytes_per_s, "server.profile.swap_bytes_per_s")

    @property
    def swap_tokens_per_s(self) -> float:
        return self.swap_bytes_per_s / self.kv_bytes_per_token


@dataclass(frozen=True)
class ServerSpec:
    """The serving engine: KV budget, batch limit, prefill chunk, cost model, prefix loads.

    ``max_running=None`` means unlimited. ``cost_model=None`` means the documented
    calibrated default (``topas.timing.DEFAULT_LINEAR``). ``mixed_chunk`` (an extension
    of the format, default false) mixes prefill chunks into decode batches in the
    calibrated model, as SGLang's ``--enable-mixed-chunk`` does.
    """

    kv_capacity_tokens: int
    chunk_tokens: int
    max_running: int | None = None
    cost_model: CostModel | None = None
    prefix_load: PrefixLoad = field(default_factory=RecomputeLoad)
    mixed_chunk: bool = False
    profile: ProfileRecord | None = None

    def __post_init__(self) -> None:
        _require_positive_int(self.kv_capacity_tokens, "server.kv_capacity_tokens")
        if self.profile is not None and isinstance(self.prefix_load, HostLoad):
            want = self.profile.swap_tokens_per_s
            if not math.isclose(self.prefix_load.tokens_per_s, want, rel_tol=1e-9):
                raise InstanceError(
                    f"server.prefix_load.tokens_per_s: {self.prefix_load.tokens_per_s!r} "
                    f"disagrees with server.profile ({want!r} = swap_bytes_per_s / "
                    "kv_bytes_per_token)"
                )
        _require_positive_int(self.chunk_tokens, "server.chunk_tokens")
        if self.max_running is not None:
            if not _is_int(self.max_running):
                raise InstanceError(
                    f"server.max_running: must be an integer, got {self.max_running!r}"
                )
            if self.max_running < 1:
                raise InstanceError(f"server.max_running: must be >= 1, got {self.max_running}")
        if not isinstance(self.mixed_chunk, bool):
            raise InstanceError(
                f"server.mixed_chunk: must be true or false, got {self.mixed_chunk!r}"
            )


# --------------------------------------------------------------------------- workflow


@dataclass(frozen=True)
class Agent:
    """An agent and the length of its system prompt (its shareable prefix)."""

    id: str
    prefix_tokens: int

    def __post_init__(self) -> None:
        _require_id(self.id, "agents[].id")
        _require_positive_int(self.prefix_tokens, f"agents[{self.id}].prefix_tokens")


@dataclass(frozen=True)
class Stage:
    """One agent call of a task. ``predicted_output_tokens`` is what policies are told."""

    id: str
    agent: str
    input_tokens: int
    output_tokens: int
    deps: tuple[str, ...] = ()
    predicted_output_tokens: int | None = None

    def __post_init__(self) -> None:
        _require_id(self.id, "stages[].id")
        where = f"stages[{self.id}]"
        _require_id(self.agent, f"{where}.agent")
        _require_positive_int(self.input_tokens, f"{where}.input_tokens")
        _require_positive_int(self.output_tokens, f"{where}.output_tokens")
        if self.predicted_output_tokens is not None:
            _require_positive_int(self.predicted_output_tokens, f"{where}.predicted_output_tokens")
        object.__setattr__(self, "deps", tuple(self.deps))
        for dep in self.deps:
            _require_id(dep, f"{where}.deps")

    @property
    def predicted_output(self) -> int:
        """The output length a policy sees (the truth when no prediction is given)."""
        if self.predicted_output_tokens is None:
            return self.output_tokens
        return self.predicted_output_tokens


@dataclass(frozen=True)
class Task:
    """A workflow instance: a DAG of stages released at ``arrival`` seconds."""

    id: str
    arrival: float
    stages: tuple[Stage, ...]
    workflow: str | None = None

    def __post_init__(self) -> None:
        _require_id(self.id, "tasks[].id")
        where = f"tasks[{self.id}]"
        if isinstance(self.arrival, bool) or not isinstance(self.arrival, int | float):
            raise InstanceError(f"{where}.arrival: must be a number, got {self.arrival!r}")
        if not math.isfinite(self.arrival) or self.arrival < 0:
            raise InstanceError(f"{where}.arrival: must be finite and >= 0, got {self.arrival!r}")
        object.__setattr__(self, "stages", tuple(self.stages))
        if not self.stages:
            raise InstanceError(f"{where}.stages: a task needs at least one stage")
        ids = [s.id for s in self.stages]
        dup = _first_duplicate(ids)
        if dup is not None:
            raise InstanceError(f"{where}.stages: duplicate stage id {dup!r}")
        known = set(ids)
        for s in self.stages:
            for dep in s.deps:
                if dep not in known:
                    raise InstanceError(f"{where}.stages[{s.id}].deps: unknown stage {dep!r}")
                if dep == s.id:
                    raise InstanceError(f"{where}.stages[{s.id}].deps: stage depends on itself")
            dup = _first_duplicate(s.deps)
            if dup is not None:
                raise InstanceError(f"{where}.stages[{s.id}].deps: duplicate dep {dup!r}")
        if len(self.topo_order) < len(self.stages):  # the stages on a cycle are left out
            cycle = [u for u, _ in nx.find_cycle(self.graph)]
            path = " -> ".join([*cycle, cycle[0]])
            raise InstanceError(f"{where}.stages: dependency cycle {path}")

    @cached_property
    def graph(self) -> nx.DiGraph:
        """Edges dep -> stage."""
        g = nx.DiGraph()
        g.add_nodes_from(s.id for s in self.stages)
        g.add_edges_from((d, s.id) for s in self.stages for d in s.deps)
        return g

    @cached_property
    def stage_by_id(self) -> dict[str, Stage]:
        return {s.id: s for s in self.stages}

    @cached_property
    def children(self) -> dict[str, tuple[str, ...]]:
        """Stage id -> ids of the stages that depend on it, in stage order."""
        out: dict[str, list[str]] = {s.id: [] for s in self.stages}
        for s in self.stages:
            for d in s.deps:
                out[d].append(s.id)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def topo_order(self) -> tuple[str, ...]:
        """Stage ids, every stage after its deps, the smallest id first among those ready
        (networkx's ``lexicographical_topological_sort``; Kahn's algorithm with a heap).
        Stages on a dependency cycle are left out (``__post_init__`` refuses one)."""
        waiting = {s.id: len(s.deps) for s in self.stages}
        ready = [sid for sid, n in waiting.items() if n == 0]
        heapq.heapify(ready)
        children = self.children
        order = []
        while ready:
            sid = heapq.heappop(ready)
            order.append(sid)
            for c in children[sid]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    heapq.heappush(ready, c)
        return tuple(order)


def longest_tails(
    order: Sequence[K], children: Callable[[K], Iterable[K]], own: Callable[[K], N]
) -> dict[K, N]:
    """Per node of a DAG, ``own(node)`` plus the longest tail among its ``children(node)``:
    the longest path from the node to the end, the node included. ``order`` is a
    topological order (every node before its children). The one place DAG tails are
    computed (the oracle's bounds, critical-path priorities, TOPAS's paths)."""
    tails: dict[K, N] = {}
    for node in reversed(order):
        tails[node] = own(node) + max((tails[c] for c in children(node)), default=0)  # type: ignore[operator]
    return tails


@dataclass(frozen=True)
class Instance:
    """A whole scheduling problem. Validated on construction."""

    server: ServerSpec
    agents: tuple[Agent, ...]
    tasks: tuple[Task, ...]
    name: str = "instance"

    def __post_init__(self) -> None:
        object.__setattr__(self, "agents", tuple(self.agents))
        object.__setattr__(self, "tasks", tuple(self.tasks))
        dup = _first_duplicate(a.id for a in self.agents)
        if dup is not None:
            raise InstanceError(f"agents: duplicate agent id {dup!r}")
        if not self.tasks:
            raise InstanceError("tasks: an instance needs at least one task")
        dup = _first_duplicate(t.id for t in self.tasks)
        if dup is not None:
            raise InstanceError(f"tasks: duplicate task id {dup!r}")
        cap = self.server.kv_capacity_tokens
        prefix = {a.id: a.prefix_tokens for a in self.agents}
        for a in self.agents:
            if a.prefix_tokens > cap:
                raise InstanceError(
                    f"agents[{a.id}].prefix_tokens: {a.prefix_tokens} can never fit in "
                    f"server.kv_capacity_tokens={cap}"
                )
        for t in self.tasks:
            for s in t.stages:
                where = f"tasks[{t.id}].stages[{s.id}]"
                if s.agent not in prefix:
                    raise InstanceError(f"{where}.agent: unknown agent {s.agent!r}")
                need = prefix[s.agent] + s.input_tokens + s.output_tokens
                if need > cap:
                    raise InstanceError(
                        f"{where}: prefix + input + output = {need} tokens can never fit in "
                        f"server.kv_capacity_tokens={cap}"
                    )

    # ------------------------------------------------------------------ lookups

    @cached_property
    def agent_by_id(self) -> dict[str, Agent]:
        return {a.id: a for a in self.agents}

    @cached_property
    def task_by_id(self) -> dict[str, Task]:
        return {t.id: t for t in self.tasks}

    def stage(self, ref: StageRef) -> Stage:
        return self.task_by_id[ref[0]].stage_by_id[ref[1]]

    @property
    def num_stages(self) -> int:
        return sum(len(t.stages) for t in self.tasks)

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        """The canonical ``topas-instance/1`` document."""
        server: dict[str, Any] = {
            "kv_capacity_tokens": self.server.kv_capacity_tokens,
            "chunk_tokens": self.server.chunk_tokens,
        }
        if self.server.max_running is not None:
            server["max_running"] = self.server.max_running
        if self.server.cost_model is not None:
            server["cost_model"] = _cost_model_to_dict(self.server.cost_model)
        server["prefix_load"] = _prefix_load_to_dict(self.server.prefix_load)
        if self.server.mixed_chunk:
            server["mixed_chunk"] = True
        if self.server.profile is not None:
            server["profile"] = _profile_to_dict(self.server.profile)
        return {
            "format": FORMAT,
            "name": self.name,
            "server": server,
            "agents": [{"id": a.id, "prefix_tokens": a.prefix_tokens} for a in self.agents],
            "tasks": [_task_to_dict(t) for t in self.tasks],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @cached_property
    def content_hash(self) -> str:
        """sha256 of the canonical JSON, compact and key-sorted."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def from_dict(cls, doc: Any) -> Instance:
        """Build from a parsed ``topas-instance/1`` document (raises :class:`InstanceError`)."""
        if not isinstance(doc, Mapping):
            raise InstanceError("document: expected a JSON object")
        fmt = doc.get("format")
        if fmt != FORMAT:
            raise InstanceError(f"format: expected {FORMAT!r}, got {fmt!r}")
        name = _get(doc, "name", "name", str, default="instance")
        server = _server_from_dict(_get(doc, "server", "server", Mapping))
        agents = [_agent_from_dict(a, i) for i, a in enumerate(_get(doc, "agents", "agents", list))]
        tasks = [_task_from_dict(t, i) for i, t in enumerate(_get(doc, "tasks", "tasks", list))]
        return cls(server=server, agents=tuple(agents), tasks=tuple(tasks), name=name)


# --------------------------------------------------------------------------- file I/O


def load_instance(path: str | os.PathLike[str]) -> Instance:
    """Read and validate an instance file. Errors are prefixed with the file name."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InstanceError(f"{p}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise InstanceError(f"{p}: not UTF-8 text (byte {e.start}): {e.reason}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InstanceError(
            f"{p}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None
    try:
        return Instance.from_dict(doc)
    except InstanceError as e:
        raise InstanceError(f"{p}: {e}") from None


def save_instance(instance: Instance, path: str | os.PathLike[str]) -> None:
    """Write atomically: a partly written file is never left behind."""
    write_atomic(path, instance.to_json() + "\n")


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` through a temporary file in the
    same folder and a rename, so ``path`` is either untouched or complete. The one atomic
    writer of the project: instances, results and every study's files."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(p)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; honour the umask like open()
        os.replace(tmp, p)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(p)) from None  # name the target, not tmp
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- helpers


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _require_positive_int(x: Any, where: str) -> None:
    if not _is_int(x):
        raise InstanceError(f"{where}: must be a positive integer, got {x!r}")
    if x <= 0:
        raise InstanceError(f"{where}: must be a positive integer, got {x}")


def _require_positive_float(x: Any, where: str) -> None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x <= 0:
        raise InstanceError(f"{where}: must be a finite number > 0, got {x!r}")


def _require_nonnegative_float(x: Any, where: str) -> None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x < 0:
        raise InstanceError(f"{where}: must be a finite number >= 0, got {x!r}")


def _require_id(x: Any, where: str) -> None:
    if not isinstance(x, str) or not x:
        raise InstanceError(f"{where}: must be a non-empty string, got {x!r}")


def _first_duplicate(items: Iterable[str]) -> str | None:
    seen: set[str] = set()
    for x in items:
        if x in seen:
            return x
        seen.add(x)
    return None


_MISSING = object()


def _get(doc: Mapping[str, Any], key: str, where: str, kind: Any, default: Any = _MISSING) -> Any:
    if key not in doc:
        if default is _MISSING:
            raise InstanceError(f"{where}: missing required field")
        return default
    value = doc[key]
    if not isinstance(value, kind):
        raise InstanceError(f"{where}: expected {_json_type(kind)}, got {_json_type(type(value))}")
    return value


def _json_type(kind: Any) -> str:
    """The JSON name of a Python type, for error messages."""
    if kind is Mapping or kind is dict:
        return "an object"
    if kind is list:
        return "an array"
    if kind is str:
        return "a string"
    if kind is bool:
        return "true/false"
    if kind in (int, float):
        return "a number"
    if kind is type(None):
        return "null"
    return getattr(kind, "__name__", str(kind))


def _cost_model_from_dict(d: Any) -> CostModel:
    where = "server.cost_model"
    if not isinstance(d, Mapping):
        raise InstanceError(f"{where}: expected an object")
    kind = d.get("kind")
    if kind == "step":
        return StepCost(step_s=d.get("step_s", 1.0))
    if kind == "linear":
        names = ("base_s", "prefill_token_s", "decode_seq_s", "kv_token_s")
        for n in names:
            if n not in d:
                raise InstanceError(f"{where}.{n}: missing parameter of the linear cost model")
        return LinearCost(**{n: d[n] for n in names})
    raise InstanceError(f"{where}.kind: unknown cost model {kind!r} (expected 'step' or 'linear')")


def _cost_model_to_dict(c: CostModel) -> dict[str, Any]:
    if isinstance(c, StepCost):
        return {"kind": "step", "step_s": c.step_s}
    return {
        "kind": "linear",
        "base_s": c.base_s,
        "prefill_token_s": c.prefill_token_s,
        "decode_seq_s": c.decode_seq_s,
        "kv_token_s": c.kv_token_s,
    }


def _prefix_load_from_dict(d: Any) -> PrefixLoad:
    where = "server.prefix_load"
    if not isinstance(d, Mapping):
        raise InstanceError(f"{where}: expected an object")
    kind = d.get("kind")
    if kind == "recompute":
        return RecomputeLoad()
    if kind == "host":
        if "tokens_per_s" not in d:
            raise InstanceError(f"{where}.tokens_per_s: missing parameter of the host load")
        return HostLoad(tokens_per_s=d["tokens_per_s"])
    raise InstanceError(
        f"{where}.kind: unknown prefix load {kind!r} (expected 'recompute' or 'host')"
    )


def _prefix_load_to_dict(p: PrefixLoad) -> dict[str, Any]:
    if isinstance(p, HostLoad):
        return {"kind": "host", "tokens_per_s": p.tokens_per_s}
    return {"kind": "recompute"}


def _profile_from_dict(d: Any) -> ProfileRecord:
    where = "server.profile"
    if not isinstance(d, Mapping):
        raise InstanceError(f"{where}: expected an object")
    for n in ("name", "kv_bytes_per_token", "swap_bytes_per_s"):
        if n not in d:
            raise InstanceError(f"{where}.{n}: missing field")
    return ProfileRecord(
        name=d["name"],
        kv_bytes_per_token=d["kv_bytes_per_token"],
        swap_bytes_per_s=d["swap_bytes_per_s"],
    )


def _profile_to_dict(p: ProfileRecord) -> dict[str, Any]:
    return {
        "name": p.name,
        "kv_bytes_per_token": p.kv_bytes_per_token,
        "swap_bytes_per_s": p.swap_bytes_per_s,
    }


def _server_from_dict(d: Mapping[str, Any]) -> ServerSpec:
    cost = d.get("cost_model")
    load = d.get("prefix_load")
    profile = d.get("profile")
    return ServerSpec(
        kv_capacity_tokens=_get(d, "kv_capacity_tokens", "server.kv_capacity_tokens", object),
        chunk_tokens=_get(d, "chunk_tokens", "server.chunk_tokens", object),
        max_running=d.get("max_running"),
        cost_model=None if cost is None else _cost_model_from_dict(cost),
        prefix_load=RecomputeLoad() if load is None else _prefix_load_from_dict(load),
        mixed_chunk=d.get("mixed_chunk", False),
        profile=None if profile is None else _profile_from_dict(profile),
    )


def _agent_from_dict(d: Any, i: int) -> Agent:
    if not isinstance(d, Mapping):
        raise InstanceError(f"agents[{i}]: expected an object")
    aid = _get(d, "id", f"agents[{i}].id", object)
    return Agent(
        id=aid, prefix_tokens=_get(d, "prefix_tokens", f"agents[{aid}].prefix_tokens", object)
    )


def _stage_from_dict(d: Any, where: str) -> Stage:
    if not isinstance(d, Mapping):
        raise InstanceError(f"{where}: expected an object")
    sid = _get(d, "id", f"{where}.id", object)
    w = f"{where.rsplit('[', 1)[0]}[{sid}]"
    deps = _get(d, "deps", f"{w}.deps", list, default=[])
    return Stage(
        id=sid,
        agent=_get(d, "agent", f"{w}.agent", object),
        input_tokens=_get(d, "input_tokens", f"{w}.input_tokens", object),
        output_tokens=_get(d, "output_tokens", f"{w}.output_tokens", object),
        deps=tuple(deps),
        predicted_output_tokens=d.get("predicted_output_tokens"),
    )


def _task_from_dict(d: Any, i: int) -> Task:
    if not isinstance(d, Mapping):
        raise InstanceError(f"tasks[{i}]: expected an object")
    tid = _get(d, "id", f"tasks[{i}].id", object)
    where = f"tasks[{tid}]"
    stages = _get(d, "stages", f"{where}.stages", list)
    try:
        built = tuple(_stage_from_dict(s, f"stages[{j}]") for j, s in enumerate(stages))
    except InstanceError as e:
        raise InstanceError(f"{where}.{e}") from None
    return Task(
        id=tid,
        arrival=_get(d, "arrival", f"{where}.arrival", object),
        stages=built,
        workflow=_get(d, "workflow", f"{where}.workflow", str, default=None),
    )


def _task_to_dict(t: Task) -> dict[str, Any]:
    out: dict[str, Any] = {"id": t.id, "arrival": t.arrival}
    if t.workflow is not None:
        out["workflow"] = t.workflow
    out["stages"] = [_stage_to_dict(s) for s in t.stages]
    return out


def _stage_to_dict(s: Stage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": s.id,
        "agent": s.agent,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "deps": list(s.deps),
    }
    if s.predicted_output_tokens is not None:
        out["predicted_output_tokens"] = s.predicted_output_tokens
    return out


def release_step(arrival: float, step_s: float) -> int:
    """DESIGN rule 1: a task's release step is ``ceil(arrival / step_s)``, 1e-9 tolerant."""
    return max(0, math.ceil(arrival / step_s - 1e-9))
