"""The waiting queue as the search sees it, kept across decisions in slot arrays.

A serving loop changes a few tasks per scheduling point while thousands of stages wait.
:class:`QueueView` keeps, per task, what the search's pack order needs (release, the
share ``Delta`` of each waiting stage, the expected longest path ``L``) and, per waiting
stage, its task, agent and KV need, in numpy arrays indexed by slots; per agent, its
waiting stages (in the order they arrived) and the tasks they belong to; and the total
next-hop counts ``n_a``. A decision then ranks every waiting stage with one
``numpy.lexsort`` (:meth:`QueueView.ranked`) and turns an agent's stages into Python
objects only as far as a pack reads (:class:`Ranking`).

Every container is filled in a fixed order (callers add sorted keys), so nothing depends
on the iteration order of a set: decisions are the same in every process.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np

from topas.instance import StageRef
from topas.policies.scoreboard import Slots


def _grown(a: np.ndarray, n: int, fill: float = 0) -> np.ndarray:
    if n <= len(a):
        return a
    out = np.full(max(n, 2 * len(a)), fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


class QueueView:
    """Tasks and waiting stages of one run (module docstring)."""

    def __init__(self, agents: Iterable[str]) -> None:
        self.agents = list(agents)
        self.agent_index = {a: i for i, a in enumerate(self.agents)}
        self._agent_dtype = np.uint16 if len(self.agents) <= 1 << 16 else np.int64
        self.tasks = Slots()
        self.stages = Slots()
        self.release = np.zeros(16)
        self.share = np.zeros(16)
        self.length = np.ones(16)
        self.task_used = np.zeros(16, dtype=bool)
        self.stage_task = np.zeros(64, dtype=np.int64)
        self.stage_agent = np.zeros(64, dtype=np.int64)
        self.stage_used = np.zeros(64, dtype=bool)
        self.stage_order = np.zeros(64, dtype=np.int64)  # rank of its stage id in its task
        self.stage_opens = np.zeros(64, dtype=np.int64)  # index into opens_table (0: none)
        self.opens_table: list[tuple[str, ...]] = [()]  # agents a waiting stage would open
        self._opens_id: dict[tuple[str, ...], int] = {(): 0}
        self.waiting: dict[str, dict[StageRef, None]] = {a: {} for a in self.agents}
        self.task_count: dict[str, dict[str, int]] = {a: {} for a in self.agents}
        self.hops: dict[str, int] = {}
        self._task_hops: dict[str, dict[str, int]] = {}
        self.need: dict[StageRef, int] = {}
        self.ref_at: list[StageRef | None] = []  # stage slot -> its ref

    # ------------------------------------------------------------------ tasks

    def add_task(self, tid: str, release: float) -> None:
        slot = self.tasks.add(tid)
        n = slot + 1
        self.release, self.share = _grown(self.release, n), _grown(self.share, n)
        self.length, self.task_used = _grown(self.length, n, 1.0), _grown(self.task_used, n)
        self.release[slot], self.share[slot], self.length[slot] = release, 0.0, 1.0
        self.task_used[slot] = True

    def drop_task(self, tid: str) -> None:
        self.task_used[self.tasks.remove(tid)] = False
        self.set_hops(tid, {})
        del self._task_hops[tid]

    def set_task(self, tid: str, share: float, length: float) -> None:
        slot = self.tasks.of[tid]
        self.share[slot], self.length[slot] = share, max(length, 1e-9)

    def set_hops(self, tid: str, hops: dict[str, int]) -> None:
        """The task's contribution to ``n_a``: replaces its previous one."""
        for a, n in self._task_hops.get(tid, {}).items():
            left = self.hops[a] - n
            if left:
                self.hops[a] = left
            else:
                del self.hops[a]
        for a, n in hops.items():
            self.hops[a] = self.hops.get(a, 0) + n
        self._task_hops[tid] = hops

    def mean_release(self) -> float:
        return float(self.release[self.task_used].mean()) if self.tasks.of else 0.0

    # ------------------------------------------------------------------ waiting stages

    def add_stage(
        self, ref: StageRef, agent: str, need: int, order: int, opens: tuple[str, ...] = ()
    ) -> None:
        """A waiting stage; ``order``: its id's rank among its task's stage ids;
        ``opens``: the agents whose stages admitting it would make next hops."""
        slot = self.stages.add(ref)
        n = slot + 1
        self.stage_task, self.stage_agent = _grown(self.stage_task, n), _grown(self.stage_agent, n)
        self.stage_used, self.stage_order = _grown(self.stage_used, n), _grown(self.stage_order, n)
        self.stage_opens = _grown(self.stage_opens, n)
        self.stage_order[slot] = order
        self.set_opens(ref, opens, slot)
        self.stage_task[slot] = self.tasks.of[ref[0]]
        self.stage_agent[slot] = self.agent_index[agent]
        self.stage_used[slot] = True
        if slot == len(self.ref_at):
            self.ref_at.append(ref)
        else:
            self.ref_at[slot] = ref
        self.need[ref] = need
        self.waiting[agent][ref] = None
        counts = self.task_count[agent]
        counts[ref[0]] = counts.get(ref[0], 0) + 1

    def drop_stage(self, ref: StageRef) -> None:
        slot = self.stages.remove(ref)
        agent = self.agents[int(self.stage_agent[slot])]
        self.stage_used[slot] = False
        self.ref_at[slot] = None
        del self.need[ref]
        del self.waiting[agent][ref]
        counts = self.task_count[agent]
        counts[ref[0]] -= 1
        if not counts[ref[0]]:
            del counts[ref[0]]

    def set_opens(self, ref: StageRef, opens: tuple[str, ...], slot: int | None = None) -> None:
        """The agents whose stages admitting waiting stage ``ref`` would make next hops."""
        i = self._opens_id.get(opens)
        if i is None:
            i = self._opens_id[opens] = len(self.opens_table)
            self.opens_table.append(opens)
        self.stage_opens[self.stages.of[ref] if slot is None else slot] = i

    def waiting_tasks(self) -> dict[str, int]:
        """Per agent, the tasks with a waiting stage of it."""
        return {a: len(c) for a, c in self.task_count.items() if c}

    def held(self, agents: Iterable[str]) -> Iterator[StageRef]:
        """Every waiting stage of ``agents``, agent by agent in arrival order."""
        return itertools.chain.from_iterable(map(self.waiting.__getitem__, agents))

    def first_release(self) -> float | None:
        """The release time of the earliest released task with a waiting stage."""
        used = self.stage_used
        return float(self.release[self.stage_task[used]].min()) if used.any() else None

    def oldest(self) -> StageRef | None:
        """The waiting stage of the earliest released task (ties: the least ref)."""
        slots = np.flatnonzero(self.stage_used)
        if not len(slots):
            return None
        rel = self.release[self.stage_task[slots]]
        first = rel.min()
        return min(self.ref_at[s] for s in slots[rel == first].tolist())  # type: ignore[type-var]

    # ------------------------------------------------------------------ ranking

    def ranked(self, value: np.ndarray) -> Ranking:
        """The pack order of every waiting stage (:class:`Ranking`).

        Best first: the highest ``value`` (per task slot), then the shorter task (``length``),
        then the earlier release, then the task's slot and the stage id's rank within its
        task, so the order is total and the same in every process."""
        slots = np.flatnonzero(self.stage_used)
        task = self.stage_task[slots]
        # the tasks in order first (their keys are unique: the slot breaks ties), then the
        # stages by (their task's place, the stage id's rank): one sort of unique keys
        tasks = np.flatnonzero(self.task_used)
        by_task = tasks[np.lexsort((tasks, self.release[tasks], self.length[tasks], -value[tasks]))]
        place = np.zeros(len(self.task_used), dtype=np.int64)
        place[by_task] = np.arange(len(by_task))
        order_in_task = self.stage_order[slots]
        width = int(order_in_task.max()) + 1 if len(slots) else 1
        glob = np.argsort(place[task] * width + order_in_task)
        rank = np.empty(len(slots), dtype=np.int64)
        rank[glob] = np.arange(len(slots))
        agent = self.stage_agent[slots].astype(self._agent_dtype)  # 16 bits: a radix sort
        order = glob[np.argsort(agent[glob], kind="stable")]  # by agent, then by rank
        agent_sorted = agent[order]
        starts: list[int] = []
        if len(order):
            starts = [0, *(np.flatnonzero(agent_sorted[1:] != agent_sorted[:-1]) + 1).tolist()]
        ends = [*starts[1:], len(order)] if starts else []
        names = self.agents
        firsts = agent_sorted[starts].tolist()
        spans = {names[a]: (lo, hi) for a, lo, hi in zip(firsts, starts, ends, strict=True)}
        return Ranking(self, slots[order], rank[order], task[order], spans, starts)


class Ranking:
    """One decision's pack order, materialised per agent on demand: a pack reads an
    agent's stages best first and rarely far, so each agent's are turned into Python
    objects a chunk at a time (:meth:`take`)."""

    def __init__(
        self,
        view: QueueView,
        slots: np.ndarray,
        rank: np.ndarray,
        task: np.ndarray,
        spans: dict[str, tuple[int, int]],
        starts: list[int],
    ) -> None:
        self._view = view
        self._slots, self._rank = slots, rank
        self._rows = np.stack((slots, rank, task), axis=1)  # one slice per chunk (take)
        self.spans = spans  # agent -> [lo, hi) of its stages in the arrays, best first
        self._starts = np.asarray(starts, dtype=np.int64)  # the lo of every span, in order
        self._taken = dict.fromkeys(spans, 0)

    def opened(self, first: int) -> set[str]:
        """The agents that some stage among the ``first`` best of an agent's would open."""
        ids = self._view.stage_opens[self._slots]
        at = np.flatnonzero(ids)  # positions of the stages that open any agent
        lo = self._starts[np.searchsorted(self._starts, at, side="right") - 1]
        table = self._view.opens_table
        return set().union(*map(table.__getitem__, set(ids[at[at - lo < first]].tolist())))

    def heads(self) -> list[tuple[int, str]]:
        """(global rank of its best stage, agent) for every agent with waiting stages, best
        first."""
        return sorted(zip(self._rank[self._starts].tolist(), self.spans, strict=True))

    def take(self, agent: str, n: int) -> list[tuple[StageRef, int, int]]:
        """The agent's next ``n`` stages not taken yet: (ref, global rank, task slot)."""
        lo, hi = self.spans[agent]
        start = lo + self._taken[agent]
        stop = min(hi, start + n)
        self._taken[agent] = stop - lo
        refs = self._view.ref_at
        return [(refs[s], r, t) for s, r, t in self._rows[start:stop].tolist()]  # type: ignore[misc]
