"""A :class:`~topas.state.State` built from what a serving engine can observe.

A live engine (SGLang, through the plugin) does not replay the simulator's transitions:
at a scheduling point it knows its queued and running requests, the workflow metadata
they carry (:mod:`topas.workflow_metadata`), the KV it holds for each running one and
which agents' prompts are cached. :func:`observed_state` turns that into the same
``State`` a policy sees in simulation, so the heuristic runs unchanged.

What is inferred: a stage that is neither queued nor running is DONE if the engine saw
its request finish (``finished``) or a queued or running stage of its task depends on it
(transitively: the client sends a stage only after its dependencies returned), and
BLOCKED otherwise. A running request's prompt is resident (the engine holds it). Queued
requests keep the order they are given in (the engine's queue order); tasks are registered
by release time. Tasks with no request queued or running are not part of the view.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from topas.instance import ServerSpec, StageRef, Task
from topas.state import (
    KvNeed,
    Phase,
    PrefixInfo,
    PrefixStatus,
    RunInfo,
    State,
    TaskInfo,
    stamp_task,
)


@dataclass(frozen=True)
class Request:
    """One request of a workflow stage, as the engine sees it."""

    task: Task  # from the request's metadata; predicted output lengths as the outputs
    stage: str
    release: float  # the task's release, seconds on the engine's clock
    queued_at: float  # when it entered the queue (or was admitted, when running)
    running: bool = False  # it holds KV and a batch slot
    started_at: float | None = None  # running: when its own prefill began (else queued_at)
    generated: int = 0  # output tokens decoded so far
    reserved: int | None = None  # KV tokens held for it (running); None: the state's kv_need


class ObservationError(ValueError):
    """Requests that contradict each other (one stage twice, two DAGs for one task)."""


def observed_state(
    server: ServerSpec,
    prefix_tokens: Mapping[str, int],
    requests: Sequence[Request],
    resident: Iterable[str],
    now: float,
    kv_need: KvNeed,
    finished: Mapping[str, Iterable[str]] | None = None,
    stamps: Iterator[int] | None = None,
    kv_estimate: KvNeed | None = None,
    on_host: Iterable[str] | None = None,
) -> State:
    """The scheduler's view of an engine: ``requests`` queued or running, the agents in
    ``resident`` with their prompts cached, at time ``now``; ``finished`` maps a task to
    the stages whose requests the engine has seen complete. ``on_host``, for an engine
    with a host tier, names the agents whose prompts have a copy in host memory (every
    prompt's ``PrefixInfo.host_copy`` is set; None: no host tier). A caller that observes the
    same engine round after round passes one ``stamps`` counter to every call, so that a
    task's epoch never repeats between rounds (policies cache per-task results by it), or
    better keeps one :class:`Observer`, which also keeps an unchanged task's epoch.
    ``kv_estimate``: where ``kv_need`` reads true lengths, the same rule with predicted
    ones (``State.estimated_need``); a live engine's reservation needs none."""
    return Observer(stamps).state(
        server, prefix_tokens, requests, resident, now, kv_need, finished, kv_estimate, on_host
    )


class Observer:
    """Observes one engine round after round (:func:`observed_state`, with memory).

    It keeps one :class:`~topas.state.State` and changes it in place from round to round,
    as an engine changes its own: a task whose observed requests (each queued or running),
    finished stages and release are the same as at the last round keeps its
    :class:`~topas.state.TaskInfo`, phases, ``unfinished`` count and epoch untouched, so a
    policy's per-task analyses (cached by epoch) carry over and a policy that recognises
    the state it synced last (:class:`~topas.policies.search.TOPAS`) reads only the tasks
    stamped since. A changed task is re-registered and stamped anew (``task_epoch`` stays
    ordered by stamp), a task that left the view is dropped; the running and waiting
    stages, the prefixes and the KV accounting are rebuilt every round. When every request
    and finished stage is as at the last round (equal ``Request`` values, in the same
    order), the tasks, phases and queue are kept as they are and only the clock, the KV
    rules, the prompts, the running stages' KV and fresh wait stamps are set. The state
    returned is therefore valid until the next call (a caller that keeps it across rounds
    copies it). Only the tasks in the last round's view are remembered; an observation
    that raises :class:`ObservationError` makes the next round start afresh."""

    def __init__(self, stamps: Iterator[int] | None = None) -> None:
        self.stamps = stamps if stamps is not None else itertools.count(1)
        self._known: dict[str, _Known] = {}
        self._state: State | None = None
        self._seen: tuple[list[Request], dict[str, frozenset[str]]] | None = None  # the
        # last round's requests and finished stages
        self._runs: list[tuple[StageRef, Request]] = []  # its running stages, as added

    def state(
        self,
        server: ServerSpec,
        prefix_tokens: Mapping[str, int],
        requests: Sequence[Request],
        resident: Iterable[str],
        now: float,
        kv_need: KvNeed,
        finished: Mapping[str, Iterable[str]] | None = None,
        kv_estimate: KvNeed | None = None,
        on_host: Iterable[str] | None = None,
    ) -> State:
        """The State of this round (arguments as :func:`observed_state`'s)."""
        seen = (list(requests), {tid: frozenset(d) for tid, d in (finished or {}).items() if d})
        state = self._state
        try:
            if (
                state is not None
                and seen == self._seen
                and state.capacity == server.kv_capacity_tokens
                and state.max_running == server.max_running
            ):  # the same requests and finished stages as last round: the same tasks,
                # phases and queue; only the clock, the prompts and the KV are read anew
                self._round(state, prefix_tokens, resident, now, kv_need, kv_estimate, on_host)
                for ref, r in self._runs:
                    _add_running(state, ref, r)
                _stamp_queue(state, list(state.waiting))
                return state
            self._seen = None
            by_task: dict[str, list[Request]] = {}  # task -> its requests, in observed order
            for r in requests:
                group = by_task.get(r.task.id)
                if group is None:
                    by_task[r.task.id] = [r]
                else:
                    group.append(r)
            state = self._update(
                server, prefix_tokens, requests, by_task, resident, now, kv_need, seen[1],
                kv_estimate, on_host,
            )  # fmt: skip
        except BaseException:
            self._state, self._known = None, {}  # half changed: the next round starts afresh
            raise
        runs = {(r.task.id, r.stage): r for r in requests if r.running}
        self._runs = [(ref, runs[ref]) for ref in state.running]
        self._seen = seen
        return state

    @staticmethod
    def _round(
        state: State,
        prefix_tokens: Mapping[str, int],
        resident: Iterable[str],
        now: float,
        kv_need: KvNeed,
        kv_estimate: KvNeed | None,
        on_host: Iterable[str] | None,
    ) -> None:
        """What every round sets anew: the clock, the KV rules, the prompts and their
        residency; the running stages are emptied (added again by the caller)."""
        state.time, state.kv_need, state.kv_estimate = now, kv_need, kv_estimate
        state.prefixes = {a: PrefixInfo(tokens=n) for a, n in prefix_tokens.items()}
        if on_host is not None:
            hosted = set(on_host)
            for agent, p in state.prefixes.items():
                p.host_copy = agent in hosted
        state.running = {}
        state.kv_committed = 0
        for agent in resident:
            _make_resident(state, agent)

    def _update(
        self,
        server: ServerSpec,
        prefix_tokens: Mapping[str, int],
        requests: Sequence[Request],
        by_task: dict[str, list[Request]],
        resident: Iterable[str],
        now: float,
        kv_need: KvNeed,
        finished: Mapping[str, frozenset[str]],
        kv_estimate: KvNeed | None,
        on_host: Iterable[str] | None,
    ) -> State:
        state = self._state
        if (
            state is None
            or state.capacity != server.kv_capacity_tokens
            or state.max_running != server.max_running
        ):
            state = self._state = State(
                time=now, capacity=server.kv_capacity_tokens, max_running=server.max_running,
                kv_need=kv_need,
            )  # fmt: skip
            state.stamps = self.stamps
            self._known = {}
        self._round(state, prefix_tokens, resident, now, kv_need, kv_estimate, on_host)
        # registered by the release of each task's first request; ties in observed order
        order = sorted(by_task, key=lambda tid: by_task[tid][0].release)  # stable
        known, self._known = self._known, {}
        for tid in known.keys() - by_task.keys():  # left the view
            _drop_task(state, tid, known[tid].info)
        for tid in order:
            self._add_task(state, by_task[tid], finished.get(tid, _NONE), known.get(tid))
        if list(state.tasks) != order:  # registered by release, as a fresh state's
            state.tasks = {tid: state.tasks[tid] for tid in order}
        # every observed stage not running is queued, in observed order (enqueue_stage)
        queued = [r for r in requests if not r.running]
        refs = [(r.task.id, r.stage) for r in queued]
        state.phase.update(dict.fromkeys(refs, Phase.WAITING))
        state.waiting = dict(zip(refs, [r.queued_at for r in queued], strict=True))
        _stamp_queue(state, refs)
        pairs = zip(refs, queued, strict=True)
        state.generated = {ref: r.generated for ref, r in pairs if r.generated}
        return state

    def _add_task(
        self, state: State, group: list[Request], finished: frozenset[str], known: _Known | None
    ) -> None:
        """Register the phases of one task, observed as ``group``. A task seen with the same
        requests (each queued or running) and finished stages as last round keeps its
        TaskInfo, phases, ``unfinished`` count and epoch as the state holds them."""
        first = group[0]
        task = first.task
        same = known is not None and known.task is task and known.info.release == first.release
        if same and known.reqs == group and known.seen[1] == finished:
            return self._keep(state, known)  # the very requests of the last round
        by_stage = _by_stage(group)
        seen = (frozenset([(sid, r.running) for sid, r in by_stage.items()]), finished)
        if same:
            if known.seen == seen:  # unchanged as far as phases go
                known.reqs = group
                return self._keep(state, known)
            info = known.info
        else:
            info = TaskInfo.of(task, first.release)
        if known is not None:  # its entries are overwritten; a stage it no longer has goes
            _drop_phases(state, task.id, known.info)
        state.tasks[task.id] = info
        _add_phases(state, info, task, by_stage, finished)
        stamp_task(state, task.id)
        self._known[task.id] = _Known(task, info, seen, group)

    def _keep(self, state: State, known: _Known) -> None:
        """A task unchanged since the last round: only its running stages are added again
        (the running stages are rebuilt every round)."""
        tid = known.task.id
        for r in known.reqs:
            if r.running:
                _add_running(state, (tid, r.stage), r)
        self._known[tid] = known


def _by_stage(group: list[Request]) -> dict[str, Request]:
    """One task's requests by stage; ObservationError if a stage is observed twice or
    two requests carry different DAGs."""
    first = group[0]
    out: dict[str, Request] = {}
    for r in group:
        if r.stage in out:
            raise ObservationError(f"stage {first.task.id}/{r.stage} observed twice")
        if r.task is not first.task and r.task != first.task:
            raise ObservationError(f"task {first.task.id}: requests carry different DAGs")
        out[r.stage] = r
    return out


@dataclass
class _Known:
    """What an :class:`Observer` remembers of a task from the last round."""

    task: Task
    info: TaskInfo
    seen: tuple[frozenset[tuple[str, bool]], frozenset[str]]  # its requests, finished stages
    reqs: list[Request]  # its Request objects (an engine adapter reuses unchanged ones)


_NONE: frozenset[str] = frozenset()


def _stamp_queue(state: State, refs: list[StageRef]) -> None:
    """Fresh wait stamps for the queued ``refs``, in order, as :func:`enqueue_stage` gives."""
    stamps = itertools.islice(state.stamps, len(refs))
    state.wait_stamp = dict(zip(refs, stamps, strict=True))


def _drop_task(state: State, tid: str, info: TaskInfo) -> None:
    """Take a task out of the state (its entries; the running and waiting ones are rebuilt
    every round)."""
    del state.tasks[tid], state.unfinished[tid], state.task_epoch[tid]
    _drop_phases(state, tid, info)


def _drop_phases(state: State, tid: str, info: TaskInfo) -> None:
    for sid in info.topo_order:
        del state.phase[(tid, sid)]


def _make_resident(state: State, agent: str) -> None:
    p = state.prefixes[agent]
    if p.status == PrefixStatus.ABSENT:
        p.status = PrefixStatus.RESIDENT
        state.kv_committed += p.tokens


def _add_phases(
    state: State, info: TaskInfo, task: Task, reqs: dict[str, Request], finished: frozenset[str]
) -> None:
    """Set the phase of each of the task's stages. A stage observed and not running is
    WAITING (one finished, or an ancestor of another observed, is an ObservationError)."""
    clash = finished & reqs.keys()
    if clash:
        raise ObservationError(f"stage {task.id}/{sorted(clash)[0]} finished and observed")
    done = _ancestors(task, reqs) | finished
    state.unfinished[task.id] = len(task.stages) - len(done)
    for sid in info.topo_order:
        ref = (task.id, sid)
        r = reqs.get(sid)
        if sid in done:
            state.phase[ref] = Phase.DONE
        elif r is None:
            state.phase[ref] = Phase.BLOCKED
        elif r.running:
            _add_running(state, ref, r)
        else:
            state.phase[ref] = Phase.WAITING


def _add_running(state: State, ref: tuple[str, str], r: Request) -> None:
    agent = state.agent_of(ref)
    _make_resident(state, agent)
    reserved = state.kv_need(ref, r.generated) if r.reserved is None else r.reserved
    state.phase[ref] = Phase.RUNNING
    started = r.queued_at if r.started_at is None else r.started_at
    state.running[ref] = RunInfo(
        admitted_at=r.queued_at, started_at=started, generated=r.generated, reserved=reserved
    )
    state.kv_committed += reserved
    p = state.prefixes[agent]
    p.users += 1
    p.last_used = max(p.last_used, r.queued_at)


def _ancestors(task: Task, reqs: Mapping[str, Request]) -> set[str]:
    """Stages that some observed stage depends on, transitively: finished."""
    out: set[str] = set()
    stack = [d for sid in reqs for d in task.stage_by_id[sid].deps]
    while stack:
        sid = stack.pop()
        if sid not in out:
            out.add(sid)
            stack.extend(task.stage_by_id[sid].deps)
    clash = out & reqs.keys()
    if clash:
        raise ObservationError(
            f"task {task.id}: stage {sorted(clash)[0]!r} is observed while a stage that "
            "depends on it is too"
        )
    return out
