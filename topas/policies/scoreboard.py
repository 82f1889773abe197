"""Slot arrays that mirror a policy's per-stage and per-task scores across decisions.

A serving loop changes a few tasks per scheduling point while thousands of stages wait.
:class:`Scoreboard` keeps what a score needs per waiting stage and per task in numpy
arrays indexed by slots, so a decision evaluates every waiting stage's score in a few
vector operations and only the tasks that changed are re-analysed in Python.

It is synchronised by diffing against whatever :class:`~topas.state.State` it is given
(set differences of the waiting queue and the released tasks, which run at C speed), so
it never goes wrong when handed a different state: it just does more work.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np

from topas.instance import StageRef


class Slots:
    """Stable integer slots for hashable keys, reusing freed ones; arrays grow by doubling."""

    def __init__(self) -> None:
        self.of: dict = {}
        self.free: list[int] = []
        self.capacity = 0

    def add(self, key) -> int:  # type: ignore[no-untyped-def]
        slot = self.free.pop() if self.free else len(self.of)
        self.of[key] = slot
        return slot

    def remove(self, key) -> int:  # type: ignore[no-untyped-def]
        slot = self.of.pop(key)
        self.free.append(slot)
        return slot


class Scoreboard:
    """Per-stage and per-task score inputs of the waiting stages of one run.

    Stage columns (one slot per waiting stage): ``task`` (its task's slot), ``agent``
    (index into ``agents``), ``inv_len``
    (1 / the task's remaining path), ``slack`` (path length minus the longest path through
    the stage), ``load`` (seconds to load its prefix, 0 if resident when last analysed) and
    ``stamp`` (the state's wait stamp, for first-come tie-breaking). Task columns:
    ``release`` and ``upcoming`` (one row per task: discounted count of its unadmitted
    stages per agent).
    """

    def __init__(self, agents: Iterable[str]) -> None:
        self.agents = list(agents)
        self.agent_index = {a: i for i, a in enumerate(self.agents)}
        self.tasks = Slots()
        self.stages = Slots()
        self._grow_tasks(16)
        self._grow_stages(64)

    # ------------------------------------------------------------------ storage

    def _grow_tasks(self, n: int) -> None:
        old = self.tasks.capacity
        self.release = _resized(getattr(self, "release", None), n)
        self.live = _resized(getattr(self, "live", None), n, dtype=bool)
        up = np.zeros((n, len(self.agents)))
        if old:
            up[:old] = self.upcoming
        self.upcoming = up
        self.tasks.capacity = n

    def _grow_stages(self, n: int) -> None:
        self.s_task = _resized(getattr(self, "s_task", None), n, dtype=np.int64)
        self.s_agent = _resized(getattr(self, "s_agent", None), n, dtype=np.int64)
        self.s_inv_len = _resized(getattr(self, "s_inv_len", None), n)
        self.s_slack = _resized(getattr(self, "s_slack", None), n)
        self.s_load = _resized(getattr(self, "s_load", None), n)
        self.s_stamp = _resized(getattr(self, "s_stamp", None), n)
        self.s_valid = _resized(getattr(self, "s_valid", None), n, dtype=bool)
        refs = getattr(self, "s_ref", [])
        self.s_ref: list[StageRef | None] = refs + [None] * (n - len(refs))
        self.stages.capacity = n

    # ------------------------------------------------------------------ tasks

    def add_task(self, tid: str, release: float) -> None:
        slot = self.tasks.add(tid)
        if slot >= self.tasks.capacity:
            self._grow_tasks(2 * self.tasks.capacity)
        self.release[slot] = release
        self.live[slot] = True
        self.upcoming[slot] = 0.0

    def drop_task(self, tid: str) -> None:
        slot = self.tasks.remove(tid)
        self.live[slot] = False
        self.upcoming[slot] = 0.0

    def set_upcoming(self, tid: str, upcoming: dict[str, float]) -> None:
        row = self.upcoming[self.tasks.of[tid]]
        row[:] = 0.0
        for agent, value in upcoming.items():
            row[self.agent_index[agent]] = value

    # ------------------------------------------------------------------ stages

    def put_stage(
        self, ref: StageRef, agent: str, inv_len: float, slack: float, load: float, stamp: float
    ) -> None:
        slot = self.stages.of.get(ref)
        if slot is None:
            slot = self.stages.add(ref)
            if slot >= self.stages.capacity:
                self._grow_stages(2 * self.stages.capacity)
            self.s_ref[slot] = ref
            self.s_valid[slot] = True
            self.s_task[slot] = self.tasks.of[ref[0]]
            self.s_agent[slot] = self.agent_index[agent]
        self.s_inv_len[slot] = inv_len
        self.s_slack[slot] = slack
        self.s_load[slot] = load
        self.s_stamp[slot] = stamp

    def set_agent_load(self, agent: str, load: float) -> None:
        """Every waiting stage of ``agent`` now needs ``load`` seconds of prefix load."""
        self.s_load[self.s_valid & (self.s_agent == self.agent_index[agent])] = load

    def drop_stage(self, ref: StageRef) -> None:
        slot = self.stages.remove(ref)
        self.s_valid[slot] = False
        self.s_ref[slot] = None

    # ------------------------------------------------------------------ queries

    def task_weights(self, now: float, aging: float, scale: float) -> np.ndarray:
        """w_j = 1 + aging * age_j / scale for every task slot (dead slots too)."""
        if not aging:
            return np.ones(self.tasks.capacity)
        return 1.0 + aging * (now - self.release) / scale

    def retention(self, weights: np.ndarray) -> np.ndarray:
        """Per agent: the weighted, discounted count of upcoming stages over live tasks."""
        return (weights * self.live) @ self.upcoming

    def order(
        self, values: np.ndarray, first: int = 128, agents: Iterable[str] | None = None
    ) -> Iterator[StageRef]:
        """Waiting stages by decreasing ``values`` (per stage slot), first come first on ties;
        with ``agents``, only those agents' stages.

        Lazy: the ``first`` best (and any tied with the last of them) are sorted up front,
        the rest only if the caller reads past them, so a decision that admits a few of
        thousands of waiting stages sorts only a few.
        """
        mask = self.s_valid
        if agents is not None:
            chosen = np.zeros(len(self.agents), dtype=bool)  # per agent index: in ``agents``
            chosen[[self.agent_index[a] for a in agents if a in self.agent_index]] = True
            mask = mask & chosen[self.s_agent]  # a free slot keeps an old index: s_valid masks it
        valid = np.flatnonzero(mask)
        neg = -values[valid]
        if len(valid) > 2 * first:
            cut = np.partition(neg, first - 1)[first - 1]
            head = neg <= cut
            rest = self._later(valid[~head], neg[~head])
            return itertools.chain(self._sorted(valid[head], neg[head]), rest)
        return self._sorted(valid, neg)

    def _sorted(self, slots: np.ndarray, neg: np.ndarray) -> Iterator[StageRef]:
        ranked = slots[np.lexsort((self.s_stamp[slots], neg))].tolist()
        return map(self.s_ref.__getitem__, ranked)

    def _later(self, slots: np.ndarray, neg: np.ndarray) -> Iterator[StageRef]:
        """:meth:`_sorted`, sorted only once a caller reaches it."""
        yield from self._sorted(slots, neg)


def _resized(a: np.ndarray | None, n: int, dtype=float) -> np.ndarray:  # type: ignore[no-untyped-def]
    out = np.zeros(n, dtype=dtype)
    if a is not None:
        out[: len(a)] = a
    return out
