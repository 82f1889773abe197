"""What a policy sees, what it decides, and the post-decision transition.

A :class:`State` is the scheduler's view at a scheduling point: released tasks with
their workflow structure and *predicted* output lengths, the phase of every stage,
the residency of every agent's prefix, and the KV and batch-slot accounting. The
true output lengths stay with the engine: when a policy asks whether something
fits, the state answers through the engine's ``kv_need`` function, so a policy
never does KV arithmetic itself (DESIGN rule 11).

A :class:`Decision` is plain data. :func:`apply` returns the post-decision state or
raises :class:`InfeasibleDecision`; the simulator applies decisions through the
same code in place. :class:`Planner` builds a decision step by step against a
tentative copy of the accounting (``try_admit`` evicts on demand, in the order the
policy gives).

This module imports only :mod:`topas.instance`.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from topas.instance import Instance, StageRef, Task


class Phase(IntEnum):
    """Life cycle of a stage of a released task."""

    BLOCKED = 0  # some dep has not finished
    WAITING = 1  # ready, not admitted
    ADMITTED = 2  # holds its KV and a slot, waits for its prefix to become resident
    RUNNING = 3  # prefix resident, prefilling or decoding (or running a step interval)
    DONE = 4


class PrefixStatus(IntEnum):
    ABSENT = 0
    LOADING = 1
    RESIDENT = 2


class InfeasibleDecision(ValueError):
    """A decision that breaks the model's rules (memory, deps, prefix in use, ...)."""


@dataclass(frozen=True)
class StageInfo:
    """The static part of a stage that a policy may see (no true output length)."""

    ref: StageRef
    agent: str
    input_tokens: int
    predicted_output: int
    deps: tuple[str, ...]
    children: tuple[str, ...]


@dataclass(frozen=True)
class TaskInfo:
    """A released task's registered workflow, with predicted lengths only."""

    id: str
    release: float  # seconds (the release step times step_s in the step model)
    stages: dict[str, StageInfo]
    topo_order: tuple[str, ...]
    workflow: str | None = None

    @staticmethod
    def of(task: Task, release: float, predicted: dict[str, int] | None = None) -> TaskInfo:
        """Build the policy view of ``task``; ``predicted`` overrides the predicted lengths."""
        stages = {
            s.id: StageInfo(
                ref=(task.id, s.id),
                agent=s.agent,
                input_tokens=s.input_tokens,
                predicted_output=(predicted or {}).get(s.id, s.predicted_output),
                deps=s.deps,
                children=task.children[s.id],
            )
            for s in task.stages
        }
        return TaskInfo(task.id, release, stages, task.topo_order, task.workflow)


@dataclass
class RunInfo:
    """A stage holding KV and a slot (admitted or running)."""

    admitted_at: float
    started_at: float | None = None
    generated: int = 0  # output tokens decoded so far (calibrated model)
    reserved: int = 0  # KV tokens committed for it in the accounting


@dataclass
class PrefixInfo:
    """Residency of one agent's prefix."""

    tokens: int
    status: PrefixStatus = PrefixStatus.ABSENT
    users: int = 0  # admitted + running stages of this agent
    last_used: float = -1.0  # for LRU
    host_copy: bool | None = None  # an engine with a host tier (SGLang's HiCache) observed
    # whether the prefix has a copy in host memory: True, a load is a swap at the host
    # rate; False, a recompute. None (the simulator): as ``server.prefix_load`` says.

    @property
    def evictable(self) -> bool:
        return self.status == PrefixStatus.RESIDENT and self.users == 0


@dataclass(frozen=True)
class Decision:
    """What a policy decides at a scheduling point. Applied in the order of the fields."""

    preempt: tuple[StageRef, ...] = ()  # running/admitted stages to stop (back to waiting)
    evict: tuple[str, ...] = ()  # agents whose resident, unused prefix is dropped
    load: tuple[str, ...] = ()  # agents whose absent prefix starts loading (prefetch)
    admit: tuple[StageRef, ...] = ()  # waiting stages to start, in prefill order
    wake_at: float | None = None  # consult me again at this time even if nothing happens
    held: tuple[StageRef, ...] = ()  # waiting stages the policy keeps out on purpose (not
    # applied: information for an engine that admits on its own, such as SGLang's)

    @property
    def empty(self) -> bool:
        return not (self.preempt or self.evict or self.load or self.admit)


KvNeed = Callable[[StageRef, int], int]
"""``kv_need(ref, generated)``: KV tokens a stage commits if admitted now (engine-defined)."""


@dataclass
class State:
    """The scheduler's view. Policies read it; only :func:`apply` and the engine change it."""

    time: float
    capacity: int  # KV budget in tokens
    max_running: int | None
    kv_need: KvNeed = field(repr=False)  # the engine's commit: feasibility (may use the truth)
    tasks: dict[str, TaskInfo] = field(default_factory=dict)  # released, unfinished
    phase: dict[StageRef, Phase] = field(default_factory=dict)  # stages of released tasks
    waiting: dict[StageRef, float] = field(default_factory=dict)  # ready time; dict order =
    # the order in which stages reached the server
    wait_stamp: dict[StageRef, int] = field(default_factory=dict)  # same keys as waiting:
    # a stamp, increasing in insertion order and unique across copies (see WaitingQueue)
    running: dict[StageRef, RunInfo] = field(default_factory=dict)  # admitted or running
    prefixes: dict[str, PrefixInfo] = field(default_factory=dict)
    kv_committed: int = 0  # loading/resident prefixes + reservations of running stages
    generated: dict[StageRef, int] = field(default_factory=dict)  # kept across preemption
    done_service: dict[StageRef, float] = field(default_factory=dict)  # seconds each finished
    # stage ran (start to end), for attained-service policies
    unfinished: dict[str, int] = field(default_factory=dict)  # task -> stages not done
    task_epoch: dict[str, int] = field(default_factory=dict)  # task -> stamp of its last
    # phase change, unique across the state and its copies: policies cache per-task
    # results by it. Ordered by stamp (the last changed task last), so a policy can read
    # the tasks changed since stamp e from the end: ``reversed(state.task_epoch.items())``
    stamps: Iterator[int] = field(
        default_factory=lambda: itertools.count(1), repr=False, compare=False
    )  # the source of both kinds of stamp; shared by copies, so stamps never collide
    kv_estimate: KvNeed | None = field(default=None, repr=False)  # the commit from predicted
    # lengths, for a policy's own arithmetic; None: kv_need uses no truth (calibrated)

    # ------------------------------------------------------------------ construction

    @classmethod
    def initial(
        cls, instance: Instance, kv_need: KvNeed, kv_estimate: KvNeed | None = None
    ) -> State:
        """The empty state at time 0: nothing released, nothing resident. ``kv_need`` is
        the engine's commit (feasibility); ``kv_estimate``, when the commit reads true
        output lengths, the same rule with predicted ones (:meth:`estimated_need`)."""
        return cls(
            time=0.0,
            capacity=instance.server.kv_capacity_tokens,
            max_running=instance.server.max_running,
            kv_need=kv_need,
            kv_estimate=kv_estimate,
            prefixes={a.id: PrefixInfo(tokens=a.prefix_tokens) for a in instance.agents},
        )

    def copy(self) -> State:
        """A copy whose mutable parts are independent (task infos are shared, immutable)."""
        new = copy.copy(self)
        new.tasks = dict(self.tasks)
        new.phase = dict(self.phase)
        new.waiting = dict(self.waiting)
        new.wait_stamp = dict(self.wait_stamp)
        new.running = {k: copy.copy(v) for k, v in self.running.items()}
        new.prefixes = {k: copy.copy(v) for k, v in self.prefixes.items()}
        new.generated = dict(self.generated)
        new.done_service = dict(self.done_service)
        new.unfinished = dict(self.unfinished)
        new.task_epoch = dict(self.task_epoch)
        return new

    # ------------------------------------------------------------------ queries

    @property
    def free_kv(self) -> int:
        """KV tokens not committed (may be negative after output overruns its prediction)."""
        return self.capacity - self.kv_committed

    @property
    def free_slots(self) -> float:
        if self.max_running is None:
            return float("inf")
        return self.max_running - len(self.running)

    def stage(self, ref: StageRef) -> StageInfo:
        return self.tasks[ref[0]].stages[ref[1]]

    def agent_of(self, ref: StageRef) -> str:
        return self.tasks[ref[0]].stages[ref[1]].agent

    def need(self, ref: StageRef) -> int:
        """KV tokens the stage would commit if admitted now (its prefix not included): the
        engine's answer, behind ``fits``, the Planner and ``apply``. In the step model it
        is ``input + output`` with the *true* output (rule 3), so a policy's own KV
        arithmetic uses :meth:`estimated_need` instead (rule 11)."""
        return self.kv_need(ref, self.generated.get(ref, 0))

    def estimated_need(self, ref: StageRef) -> int:
        """What a policy may know of :meth:`need`: the same rule with the predicted output
        length (equal to it where the engine's commit uses predictions only)."""
        rule = self.kv_estimate or self.kv_need
        return rule(ref, self.generated.get(ref, 0))

    def admit_cost(self, ref: StageRef) -> int:
        """KV the admission adds now: the stage's need plus its prefix if absent."""
        p = self.prefixes[self.agent_of(ref)]
        return self.need(ref) + (p.tokens if p.status == PrefixStatus.ABSENT else 0)

    def fits(self, ref: StageRef) -> bool:
        """Can ``ref`` be admitted now, with no eviction?"""
        return self.free_slots >= 1 and self.admit_cost(ref) <= self.free_kv

    def evictable(self) -> list[str]:
        """Resident prefixes no stage uses, least recently used first."""
        cands = [a for a, p in self.prefixes.items() if p.evictable]
        cands.sort(key=lambda a: self.prefixes[a].last_used)
        return cands

    def is_resident(self, agent: str) -> bool:
        return self.prefixes[agent].status == PrefixStatus.RESIDENT

    def age(self, task_id: str) -> float:
        return self.time - self.tasks[task_id].release

    def plan(self) -> Planner:
        return Planner(self)


# --------------------------------------------------------------------------- transition


def stamp_task(state: State, task_id: str) -> None:
    """Record that a stage of ``task_id`` changed phase (engines and observers call it)."""
    state.task_epoch.pop(task_id, None)  # re-insert: the dict stays ordered by stamp
    state.task_epoch[task_id] = next(state.stamps)


_touch = stamp_task


def enqueue_stage(state: State, ref: StageRef, ready_at: float) -> None:
    """``ref`` became ready at ``ready_at``: it joins the end of the waiting queue."""
    state.phase[ref] = Phase.WAITING
    state.waiting[ref] = ready_at
    state.wait_stamp[ref] = next(state.stamps)


def _enqueue(state: State, ref: StageRef) -> None:
    enqueue_stage(state, ref, state.time)


def apply(state: State, decision: Decision) -> State:
    """The post-decision state; ``state`` is left unchanged. Raises InfeasibleDecision."""
    new = state.copy()
    apply_inplace(new, decision)
    return new


def apply_inplace(state: State, decision: Decision) -> list[StageRef]:
    """Apply ``decision`` to ``state`` (DESIGN rule 7 order). Returns the stages started.

    Admitted stages whose prefix is resident become RUNNING; the others become
    ADMITTED and the load of their prefix is started if it was absent. On error
    the state may be partly changed: the engine treats that as fatal, and
    :func:`apply` works on a copy.
    """
    for ref in decision.preempt:
        _preempt(state, ref)
    for agent in decision.evict:
        _evict(state, agent)
    for agent in decision.load:
        p = _prefix(state, agent)
        if p.status != PrefixStatus.ABSENT:
            raise InfeasibleDecision(f"load {agent!r}: prefix is already {p.status.name.lower()}")
        _start_load(state, agent)
    started: list[StageRef] = []
    for ref in decision.admit:
        if _admit(state, ref):
            started.append(ref)
    if decision.admit or decision.load:
        if state.kv_committed > state.capacity:
            raise InfeasibleDecision(
                f"decision needs {state.kv_committed} KV tokens, capacity is {state.capacity} "
                f"(admitting {_names(decision.admit)}, loading {list(decision.load)})"
            )
    if state.max_running is not None and len(state.running) > state.max_running:
        raise InfeasibleDecision(
            f"decision runs {len(state.running)} stages, max_running is {state.max_running} "
            f"(admitting {_names(decision.admit)})"
        )
    return started


def _names(refs: Sequence[StageRef]) -> str:
    return "[" + ", ".join(f"{t}/{s}" for t, s in refs) + "]"


def _prefix(state: State, agent: str) -> PrefixInfo:
    try:
        return state.prefixes[agent]
    except KeyError:
        raise InfeasibleDecision(f"unknown agent {agent!r}") from None


def _start_load(state: State, agent: str) -> None:
    p = state.prefixes[agent]
    p.status = PrefixStatus.LOADING
    state.kv_committed += p.tokens


def _evict(state: State, agent: str) -> None:
    p = _prefix(state, agent)
    if p.status != PrefixStatus.RESIDENT:
        raise InfeasibleDecision(
            f"evict {agent!r}: prefix is {p.status.name.lower()}, not resident"
        )
    if p.users:
        raise InfeasibleDecision(f"evict {agent!r}: prefix is in use by {p.users} stage(s)")
    p.status = PrefixStatus.ABSENT
    state.kv_committed -= p.tokens


def _admit(state: State, ref: StageRef) -> bool:
    if state.phase.get(ref) != Phase.WAITING:
        what = state.phase.get(ref)
        why = "not released" if what is None else what.name.lower()
        raise InfeasibleDecision(f"admit {ref[0]}/{ref[1]}: stage is {why}, not waiting")
    agent = state.agent_of(ref)
    p = state.prefixes[agent]
    if p.status == PrefixStatus.ABSENT:
        _start_load(state, agent)
    reserved = state.need(ref)
    del state.waiting[ref]
    del state.wait_stamp[ref]
    state.running[ref] = RunInfo(
        admitted_at=state.time, generated=state.generated.get(ref, 0), reserved=reserved
    )
    state.kv_committed += reserved
    p.users += 1
    p.last_used = state.time
    _touch(state, ref[0])
    if p.status == PrefixStatus.RESIDENT:
        state.phase[ref] = Phase.RUNNING
        state.running[ref].started_at = state.time
        return True
    state.phase[ref] = Phase.ADMITTED
    return False


def _preempt(state: State, ref: StageRef) -> None:
    run = state.running.get(ref)
    if run is None:
        raise InfeasibleDecision(f"preempt {ref[0]}/{ref[1]}: stage is not running")
    state.generated[ref] = max(state.generated.get(ref, 0), run.generated)  # kept for re-prefill
    free_stage(state, ref)
    _enqueue(state, ref)
    _touch(state, ref[0])


def free_stage(state: State, ref: StageRef) -> RunInfo:
    """Free a running stage's KV and slot (completion or preemption)."""
    run = state.running.pop(ref)
    state.kv_committed -= run.reserved
    p = state.prefixes[state.agent_of(ref)]
    p.users -= 1
    p.last_used = state.time
    return run


# --------------------------------------------------------------------------- engine hooks


def task_arrives(state: State, info: TaskInfo) -> list[StageRef]:
    """A task arrives (is released): it is registered and its root stages become waiting.
    Returns them."""
    state.tasks[info.id] = info
    state.unfinished[info.id] = len(info.stages)
    _touch(state, info.id)
    ready = []
    for sid in info.topo_order:
        ref = (info.id, sid)
        if info.stages[sid].deps:
            state.phase[ref] = Phase.BLOCKED
        else:
            _enqueue(state, ref)
            ready.append(ref)
    return ready


def complete_stage(state: State, ref: StageRef, service_s: float) -> list[StageRef]:
    """A running stage finished: free it, unblock its children. Returns newly ready stages."""
    free_stage(state, ref)
    state.phase[ref] = Phase.DONE
    state.generated.pop(ref, None)
    state.done_service[ref] = service_s
    task = state.tasks[ref[0]]
    ready = []
    for child in task.stages[ref[1]].children:
        cref = (ref[0], child)
        if all(state.phase[(ref[0], d)] == Phase.DONE for d in task.stages[child].deps):
            _enqueue(state, cref)
            ready.append(cref)
    state.unfinished[ref[0]] -= 1
    _touch(state, ref[0])
    if state.unfinished[ref[0]] == 0:
        _forget_task(state, task)
    return ready


def _forget_task(state: State, task: TaskInfo) -> None:
    del state.tasks[task.id]
    del state.unfinished[task.id]
    del state.task_epoch[task.id]
    for sid in task.stages:
        state.phase.pop((task.id, sid), None)
        state.done_service.pop((task.id, sid), None)


def prefix_ready(state: State, agent: str) -> list[StageRef]:
    """A load finished: the prefix is resident; admitted stages of the agent start."""
    p = state.prefixes[agent]
    p.status = PrefixStatus.RESIDENT
    p.last_used = state.time
    started = []
    for ref, run in state.running.items():
        if state.phase[ref] == Phase.ADMITTED and state.agent_of(ref) == agent:
            state.phase[ref] = Phase.RUNNING
            run.started_at = state.time
            started.append(ref)
            _touch(state, ref[0])
    return started


def committed_kv(state: State) -> int:
    """``state``'s committed KV recounted: resident and loading prompts plus the
    reservations of admitted and running stages (``kv_committed`` must equal it)."""
    prompts = sum(p.tokens for p in state.prefixes.values() if p.status != PrefixStatus.ABSENT)
    return prompts + sum(r.reserved for r in state.running.values())


def check_invariants(state: State) -> None:
    """Full consistency check (the engines' debug mode, the decision bench): committed KV
    equals its recount (:func:`committed_kv`), every running stage's prompt is
    resident and its dependencies done, prompt user counts match, waiting stages are
    waiting, and ``max_running`` holds. Raises AssertionError naming what broke."""
    recount = committed_kv(state)
    assert recount == state.kv_committed, (recount, state.kv_committed)
    users: dict[str, int] = {a: 0 for a in state.prefixes}
    for ref in state.running:
        users[state.agent_of(ref)] += 1
        if state.phase[ref] == Phase.RUNNING:
            assert state.is_resident(state.agent_of(ref)), f"{ref} runs without its prefix"
        for d in state.stage(ref).deps:
            assert state.phase[(ref[0], d)] == Phase.DONE, f"{ref} runs before dep {d}"
    for a, p in state.prefixes.items():
        assert p.users == users[a], (a, p.users, users[a])
    for ref in state.waiting:
        assert state.phase[ref] == Phase.WAITING
    if state.max_running is not None:
        assert len(state.running) <= state.max_running


# --------------------------------------------------------------------------- planning


class Planner:
    """Build a decision against a tentative copy of the accounting.

    ``try_admit`` admits a stage if it fits, evicting unused resident prefixes on
    demand in the order given (LRU by default); evictions made for an admission
    that still does not fit are undone. Policies use it so that they never do KV
    arithmetic themselves.
    """

    def __init__(self, state: State) -> None:
        self.state = state
        self.free_kv = state.free_kv
        self.free_slots = state.free_slots
        self._status = {a: p.status for a, p in state.prefixes.items()}
        self._users = {a: p.users for a, p in state.prefixes.items()}
        self.admit: list[StageRef] = []
        self.evict: list[str] = []
        self.load: list[str] = []
        self.preempt: list[StageRef] = []

    def status(self, agent: str) -> PrefixStatus:
        return self._status[agent]

    def cost(self, ref: StageRef) -> int:
        return self._cost(ref, self.state.agent_of(ref))

    def _cost(self, ref: StageRef, agent: str) -> int:
        """:meth:`cost` for a stage of ``agent`` (policies call it per waiting stage)."""
        state = self.state
        need = state.kv_need(ref, state.generated.get(ref, 0))  # State.need
        if self._status[agent] is PrefixStatus.ABSENT:
            need += state.prefixes[agent].tokens
        return need

    def fits(self, ref: StageRef) -> bool:
        return self.free_slots >= 1 and self.cost(ref) <= self.free_kv

    def evictable(self, order: Sequence[str] | None = None) -> list[str]:
        """Agents whose prefix is resident and unused in the plan, in ``order`` (else LRU)."""
        order = self.state.evictable() if order is None else order
        return [
            a for a in order if self._status[a] == PrefixStatus.RESIDENT and self._users[a] == 0
        ]

    def do_evict(self, agent: str) -> None:
        if self._status[agent] != PrefixStatus.RESIDENT or self._users[agent]:
            raise InfeasibleDecision(f"plan: cannot evict {agent!r}")
        self._status[agent] = PrefixStatus.ABSENT
        self.free_kv += self.state.prefixes[agent].tokens
        self.evict.append(agent)

    def do_load(self, agent: str) -> bool:
        """Prefetch ``agent``'s prefix if absent and it fits without eviction."""
        tokens = self.state.prefixes[agent].tokens
        if self._status[agent] != PrefixStatus.ABSENT or tokens > self.free_kv:
            return False
        if agent in self.evict:
            return False
        self._status[agent] = PrefixStatus.LOADING
        self.free_kv -= tokens
        self.load.append(agent)
        return True

    def do_preempt(self, ref: StageRef) -> None:
        """Stop a running stage: its KV and slot are free again, it waits once more."""
        run = self.state.running.get(ref)
        if run is None or ref in self.preempt:
            raise InfeasibleDecision(f"plan: {ref[0]}/{ref[1]} is not running")
        self.free_kv += run.reserved
        self.free_slots += 1
        self._users[self.state.agent_of(ref)] -= 1
        self.preempt.append(ref)

    def try_admit(self, ref: StageRef, evict_order: Iterable[str] | None = None) -> bool:
        """Admit ``ref`` if it fits, evicting on demand. Returns whether it was admitted."""
        if self.free_slots < 1:
            return False
        agent = self.state.agent_of(ref)
        cost = self._cost(ref, agent)
        if cost > self.free_kv:
            order = None if evict_order is None else list(evict_order)  # read twice below
            if cost > self.free_kv + self._evictable_tokens(agent, order):
                return False
            for victim in self.evictable(order):
                if cost <= self.free_kv:
                    break
                if victim != agent:
                    self.do_evict(victim)
            cost = self._cost(ref, agent)
            if cost > self.free_kv:
                return False
        self._take(ref, agent, cost)
        return True

    def admit_priced(self, ref: StageRef, cost: int) -> None:
        """Admit ``ref``, whose :meth:`cost` the caller has just read and found to fit the
        free KV (:meth:`try_admit` without pricing it again or evicting)."""
        if self.free_slots < 1 or cost > self.free_kv:
            raise InfeasibleDecision(f"plan: {ref[0]}/{ref[1]} does not fit")
        self._take(ref, self.state.agent_of(ref), cost)

    def take_while_fits(self, refs: Iterator[StageRef]) -> tuple[StageRef, int] | None:
        """Admit stages from ``refs``, in order, while each fits as the plan stands (no
        eviction), and return the first that does not with its :meth:`cost` (taken from
        ``refs``); None when ``refs`` or the batch slots run out. :meth:`cost` then
        :meth:`admit_priced` for each, in one loop, for a policy that admits many stages
        a decision."""
        state = self.state
        tasks, generated, prefixes = state.tasks, state.generated, state.prefixes
        need = state.kv_need
        status, users, admit = self._status, self._users, self.admit
        absent, loading = PrefixStatus.ABSENT, PrefixStatus.LOADING
        free, slots = self.free_kv, self.free_slots
        out = None
        try:
            for ref in refs if slots >= 1 else ():  # no stage is taken from refs unread
                agent = tasks[ref[0]].stages[ref[1]].agent
                cost = need(ref, generated.get(ref, 0))  # State.need
                load = status[agent] is absent
                if load:
                    cost += prefixes[agent].tokens
                if cost > free:
                    out = (ref, cost)
                    break
                if load:
                    status[agent] = loading
                users[agent] += 1
                free -= cost
                slots -= 1
                admit.append(ref)
                if slots < 1:
                    break
        finally:
            self.free_kv, self.free_slots = free, slots
        return out

    def _take(self, ref: StageRef, agent: str, cost: int) -> None:
        if self._status[agent] is PrefixStatus.ABSENT:
            self._status[agent] = PrefixStatus.LOADING
        self._users[agent] += 1
        self.free_kv -= cost
        self.free_slots -= 1
        self.admit.append(ref)

    def _evictable_tokens(self, keep: str, order: Iterable[str] | None) -> int:
        names = self.evictable(None if order is None else list(order))
        return sum(self.state.prefixes[a].tokens for a in names if a != keep)

    def decision(self, wake_at: float | None = None) -> Decision:
        return Decision(
            preempt=tuple(self.preempt),
            evict=tuple(self.evict),
            load=tuple(self.load),
            admit=tuple(self.admit),
            wake_at=wake_at,
        )
