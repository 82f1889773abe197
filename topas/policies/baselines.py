"""Baseline policies. Each is an admission order on SGLang's PrefillAdder mechanism
(admit in order until the first stage that does not fit) plus an eviction order.

Sources:
- ``fcfs``: vLLM / SGLang first-come-first-served (``--schedule-policy fcfs``).
- ``lpm``: SGLang's longest-prefix-match (``schedule_policy.py``, ``CacheAwarePolicy.LPM``),
  which falls back to FCFS when more than ``WAITING_QUEUE_PREFIX_MATCH_MAX = 128`` wait.
- ``cpf``: critical-path-first list scheduling (the classic DAG heuristic; e.g. Kwok & Ahmad,
  "Static scheduling algorithms for allocating directed task graphs", 1999).
- ``atlas``: Autellix (Luo et al., 2025), Adaptive Thread-Level Attained Service.
- ``kvflow``: KVFlow (Pan et al., 2025), workflow-aware eviction by steps-to-execution,
  with prefetch of the agents due next.
- ``spf``: shortest (remaining predicted) processing first at the task level, i.e.
  task-level SRPT (Schrage, 1968), the "SPF" baseline of the TOPAS paper.
- ``parrot-fcfs``: Parrot (Lin et al., OSDI 2024, "Parrot: Efficient Serving of
  LLM-based Applications with Semantic Variable"), application-level FCFS.
- ``las``: Autellix (Luo et al., 2025, "Autellix: An Efficient Serving Engine for LLM
  Agents as General Programs"), PLAS: program-level least attained service.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from topas.instance import StageRef, longest_tails
from topas.policies.base import Policy, PolicyContext, Predictions, WaitingQueue, admit_in_order
from topas.state import Decision, Phase, PrefixStatus, State


def fcfs_key(state: State, ref: StageRef) -> tuple[float, float, str, str]:
    """The order in which stages reached the server; ties by task arrival, then id."""
    return (state.waiting[ref], state.tasks[ref[0]].release, ref[0], ref[1])


def fcfs_order(state: State) -> list[StageRef]:
    return sorted(state.waiting, key=lambda r: fcfs_key(state, r))


@dataclass
class FCFS(Policy):
    """First come, first served; LRU prefix eviction on demand."""

    name = "fcfs"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._queue = WaitingQueue(fcfs_key)

    def decide(self, state: State) -> Decision:
        return self._queue.admit(state, self.eviction_order(state)).decision()


@dataclass
class LPM(Policy):
    """SGLang's longest prefix match: resident prefix tokens descending, then FCFS.

    Above ``max_sorted`` waiting stages SGLang skips the sort and uses FCFS, for cost.
    """

    max_sorted: int = 128
    name = "lpm"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._fcfs = WaitingQueue(fcfs_key)

    def decide(self, state: State) -> Decision:
        evict_order = self.eviction_order(state)
        if len(state.waiting) > self.max_sorted:
            return self._fcfs.admit(state, evict_order).decision()
        order = fcfs_order(state)
        order.sort(key=lambda r: -self._matched(state, r))  # stable: FCFS among ties
        return admit_in_order(state, order, evict_order).decision()

    @staticmethod
    def _matched(state: State, ref: StageRef) -> int:
        p = state.prefixes[state.agent_of(ref)]
        return p.tokens if p.status == PrefixStatus.RESIDENT else 0


class _PathCache:
    """Per-task predicted tail lengths: a stage's service plus its longest path below."""

    def __init__(self) -> None:
        self.tails: dict[str, dict[str, float]] = {}

    def tail(self, policy: Policy, state: State, ref: StageRef) -> float:
        tid, sid = ref
        tails = self.tails.get(tid)
        if tails is None:
            tails = self.tails[tid] = self._compute(policy, state, tid)
            if len(self.tails) > 4 * max(16, len(state.tasks)):
                for t in [t for t in self.tails if t not in state.tasks]:
                    del self.tails[t]
        return tails[sid]

    @staticmethod
    def _compute(policy: Policy, state: State, tid: str) -> dict[str, float]:
        info = state.tasks[tid]
        ctx = policy.ctx

        def own(sid: str) -> float:
            s = info.stages[sid]
            return ctx.predict.service_s(s.input_tokens, s.predicted_output)

        return longest_tails(info.topo_order, lambda sid: info.stages[sid].children, own)


@dataclass
class CPF(Policy):
    """Critical path first: the stage heading the longest predicted remaining path first."""

    name = "cpf"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        paths = _PathCache()
        self._queue = WaitingQueue(
            lambda state, r: (-paths.tail(self, state, r), *fcfs_key(state, r))
        )

    def decide(self, state: State) -> Decision:
        return self._queue.admit(state, self.eviction_order(state)).decision()


@dataclass
class ATLAS(Policy):
    """Autellix's ATLAS: least attained service first, measured along the critical path.

    A stage's priority is the largest service (seconds run) attained by the finished
    stages on any path that leads to it in its task's DAG; least first, FCFS among
    ties. Autellix discretises this into multi-level queues with anti-starvation
    promotion; this implements the continuous order without those (documented
    simplification).
    """

    name = "atlas"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._attained: dict[StageRef, float] = {}
        self._queue = WaitingQueue(
            lambda state, r: (self._path_attained(state, r), *fcfs_key(state, r))
        )

    def decide(self, state: State) -> Decision:
        if len(self._attained) > 10_000:
            self._attained = {r: v for r, v in self._attained.items() if r[0] in state.tasks}
        return self._queue.admit(state, self.eviction_order(state)).decision()

    def _path_attained(self, state: State, ref: StageRef) -> float:
        """Largest attained service over the paths of finished stages ending at ``ref``."""
        got = self._attained.get(ref)
        if got is not None:
            return got
        tid = ref[0]
        best = 0.0
        for d in state.stage(ref).deps:
            dref = (tid, d)
            best = max(best, self._path_attained(state, dref) + state.done_service.get(dref, 0.0))
        self._attained[ref] = best
        return best


@dataclass
class KVFlow(Policy):
    """KVFlow: evict the prefix whose agent is furthest from execution; prefetch the next.

    Steps-to-execution of a stage is 0 when it is ready or running and otherwise one
    more than the largest value among its unfinished deps; an agent's value is the
    smallest over its unfinished stages (infinite when it has none). Eviction takes
    the largest value first (LRU among ties). With ``prefetch`` the absent prefixes of
    agents due within ``horizon`` steps are loaded when they fit without eviction.
    Admission is FCFS, as in the SGLang build KVFlow extends.
    """

    prefetch: bool = True
    horizon: int = 1
    name = "kvflow"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._steps = StepsToExecution()
        self._queue = WaitingQueue(fcfs_key)

    def decide(self, state: State) -> Decision:
        steps = self._steps.update(state)
        evict_order = self._order(state, steps)
        plan = self._queue.admit(state, evict_order)
        if self.prefetch:
            due = sorted((v, a) for a, v in steps.items() if v <= self.horizon)
            for _, agent in due:
                if plan.status(agent) == PrefixStatus.ABSENT:
                    plan.do_load(agent)
        return plan.decision()

    def eviction_order(self, state: State) -> list[str]:
        return self._order(state, self._steps.update(state))

    @staticmethod
    def _order(state: State, steps: dict[str, int]) -> list[str]:
        cands = state.evictable()  # LRU order; the stable sort keeps it among ties
        cands.sort(key=lambda a: -steps.get(a, math.inf))
        return cands


class StepsToExecution:
    """KVFlow's per-agent steps-to-execution, maintained incrementally per task.

    A task's contribution is recomputed only when one of its stages changed phase
    (``State.task_epoch``); per agent a histogram of distances over tasks gives the
    minimum without scanning every task.
    """

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, dict[str, int]]] = {}
        self._hist: dict[str, dict[int, int]] = {}

    def update(self, state: State) -> dict[str, int]:
        for tid in [t for t in self._seen if t not in state.task_epoch]:
            self._account(self._seen.pop(tid)[1], -1)
        for tid, epoch in state.task_epoch.items():
            old = self._seen.get(tid)
            if old is not None and old[0] == epoch:
                continue
            if old is not None:
                self._account(old[1], -1)
            dists = task_distances(state, tid)
            self._seen[tid] = (epoch, dists)
            self._account(dists, +1)
        return {a: min(h) for a, h in self._hist.items() if h}

    def _account(self, dists: dict[str, int], sign: int) -> None:
        for agent, d in dists.items():
            h = self._hist.setdefault(agent, {})
            h[d] = h.get(d, 0) + sign
            if h[d] == 0:
                del h[d]


def task_distances(state: State, tid: str) -> dict[str, int]:
    """Per agent, the fewest dependency steps before one of its stages in ``tid`` runs.

    0 for a stage that is ready or running, else one more than the largest value
    among its unfinished deps.
    """
    info = state.tasks[tid]
    dist: dict[str, int] = {}
    best: dict[str, int] = {}
    for sid in info.topo_order:
        phase = state.phase[(tid, sid)]
        if phase == Phase.DONE:
            continue
        s = info.stages[sid]
        d = (
            0
            if phase != Phase.BLOCKED
            else 1 + max((dist[x] for x in s.deps if x in dist), default=0)
        )
        dist[sid] = d
        if d < best.get(s.agent, 1 << 30):
            best[s.agent] = d
    return best


# --------------------------------------------------------------------------- task-level orders


class TaskValues:
    """A per-task value, recomputed only when one of the task's stages changed phase.

    Cached by ``State.task_epoch`` (a stamp unique across states), so it is right for
    any state it is given, hypothetical copies included.
    """

    def __init__(self, compute: Callable[[State, str], float]) -> None:
        self.compute = compute
        self._seen: dict[str, tuple[int, float]] = {}

    def get(self, state: State, tid: str) -> float:
        epoch = state.task_epoch[tid]
        got = self._seen.get(tid)
        if got is not None and got[0] == epoch:
            return got[1]
        value = self.compute(state, tid)
        self._seen[tid] = (epoch, value)
        return value

    def prune(self, state: State) -> None:
        if len(self._seen) > 4 * max(16, len(state.tasks)):
            self._seen = {t: v for t, v in self._seen.items() if t in state.tasks}


def by_task_value(state: State, value: Callable[[str], Any]) -> Iterator[StageRef]:
    """Waiting stages by (their task's ``value``, ``fcfs_key``), produced lazily.

    The keys are computed afresh for every decision (values are per task, cached by
    the caller); a heap is popped only as far as admission goes.
    """
    tasks = state.tasks
    heap = [
        (value(tid), ready, tasks[tid].release, tid, sid)
        for (tid, sid), ready in state.waiting.items()
    ]
    heapq.heapify(heap)
    while heap:
        entry = heapq.heappop(heap)
        yield (entry[3], entry[4])


@dataclass
class SPF(Policy):
    """Shortest (remaining predicted) processing first, per task: task-level SRPT.

    A waiting stage's key is its task's remaining predicted work: the sum of
    ``PolicyContext.predict.service_s`` over the task's stages that are not done
    (blocked, waiting, admitted and running ones). An admitted or running stage that
    has decoded ``g > 0`` tokens (``RunInfo.generated``, which the calibrated engine
    keeps up to date; the step engine does not) counts only its ``predicted - g``
    remaining decode tokens, its prefill being over. Smallest first, then FCFS. On a
    chain this is SRPT.
    """

    name = "spf"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._pred = Predictions(ctx)
        self._left = TaskValues(self._not_done)

    def decide(self, state: State) -> Decision:
        order = by_task_value(state, self.remaining(state))
        return admit_in_order(state, order, self.eviction_order(state)).decision()

    def remaining(self, state: State) -> Callable[[str], float]:
        """A task's remaining predicted work in ``state`` (the class doc), by task id."""
        self._left.prune(state)
        if len(self._pred.service_of) > 64 * max(16, len(state.tasks)):
            self._pred.keep_tasks(state.tasks)
        ctx = self.ctx
        adjust: dict[str, float] = {}
        for ref, run in state.running.items():
            if run.generated > 0:
                s = state.stage(ref)
                left = ctx.predict.service_s(0, max(s.predicted_output - run.generated, 0))
                tid = ref[0]
                adjust[tid] = adjust.get(tid, 0.0) + left - self._pred.service(state, ref)

        def remaining(tid: str) -> float:
            return self._left.get(state, tid) + adjust.get(tid, 0.0)

        return remaining

    def _not_done(self, state: State, tid: str) -> float:
        phase = state.phase
        return sum(
            self._pred.service(state, (tid, sid))
            for sid in state.tasks[tid].topo_order
            if phase[(tid, sid)] != Phase.DONE
        )


def parrot_key(state: State, ref: StageRef) -> tuple[float, float, str, str]:
    """Application-level FCFS: task release, then when the stage became ready, then ids."""
    return (state.tasks[ref[0]].release, state.waiting[ref], ref[0], ref[1])


@dataclass
class ParrotFCFS(Policy):
    """Parrot's application-level FCFS: every request of an earlier task goes first.

    Parrot (Lin et al., OSDI 2024) schedules the requests of an application by the
    application's arrival; within a task the stage that became ready first goes
    first. LRU prefix eviction on demand.
    """

    name = "parrot-fcfs"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._queue = WaitingQueue(parrot_key)

    def decide(self, state: State) -> Decision:
        return self._queue.admit(state, self.eviction_order(state)).decision()


@dataclass
class LAS(Policy):
    """Autellix's PLAS: program-level least attained service first.

    A waiting stage's key is the total service its task has attained: the sum of
    ``State.done_service`` (seconds run, start to end) over the task's finished
    stages; running stages do not count until they finish, so the order depends on
    the discrete state only. Least first, then FCFS. Unlike ``atlas`` (the largest
    attained service along the critical path) this is the sum over the whole task.
    Autellix discretises attained service into multi-level queues with
    anti-starvation promotion; this implements the continuous order without those
    (documented simplification).
    """

    name = "las"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._attained = TaskValues(_attained_service)

    def decide(self, state: State) -> Decision:
        self._attained.prune(state)
        order = by_task_value(state, lambda tid: self._attained.get(state, tid))
        return admit_in_order(state, order, self.eviction_order(state)).decision()


def _attained_service(state: State, tid: str) -> float:
    """Seconds run by the finished stages of ``tid`` (summed in topological order)."""
    done = state.done_service
    return sum(done.get((tid, sid), 0.0) for sid in state.tasks[tid].topo_order)
