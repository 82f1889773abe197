"""The TOPAS policy: prefix retention and admission decided together.

At a scheduling point TOPAS builds the post-decision state greedily, best candidate
first, and scores each step of the construction with the terms of ``DESIGN.md``
(docs/topas.md has the derivation, the defaults and the measurements):

- **path**: per task ``j`` the longest remaining service path ``L_j`` in predicted seconds,
  including the load time of every prefix on it that is not resident (a running stage
  counts what is left of it). Starting a waiting stage on (or near, ``crit``) that path
  cuts the task's expected completion; by Smith's rule for the sum of JCTs that cut is
  worth ``crit(v) / L_j`` per second, so a task near its end goes first.
- **reuse**: a resident prefix is worth the reloads it saves the tasks whose next stage of
  that agent is ready or becomes ready soon (discounted over ``horizon``):
  ``R(a) = load_s(a) * sum_j w_j * max_u exp(-ready_in(u) / horizon)``. An admission that
  needs evictions is held back when the evicted prefixes' ``R`` exceeds the gain of
  starting it now; absent prefixes with ``R >= move * load_s / 2`` are prefetched.
- **move**: an admission that needs its prefix loaded pays ``load_s`` (per second of its
  task's path); an eviction forfeits the evicted prefix's ``R``.
- **redo**: the retraction victim minimises the work it loses (and must redo) plus its
  task's value; this weight only orders victims.
- **aging**: ``w_j = 1 + aging * age_j / age_scale``; the admission value adds
  ``(w_j - 1) / q`` to the Smith ratio, so after ``age_scale`` a task ranks with one that
  has a single stage left, whatever its length.
- **reserve**: a stage whose task has waited ``reserve`` times the mean age of the
  released tasks, and cannot fit even after evictions, gets the memory that running
  stages free (EASY backfilling): so a large cold stage is not starved by small hot ones.

Every term has a weight; 0 switches it off: ``topas:reuse=0,aging=0``. Per-task analyses
are cached by the task's epoch and the residency of its agents, and per-stage score inputs
live in numpy slot arrays (:mod:`topas.policies.scoreboard`), so a decision re-analyses only the
tasks that changed and scores thousands of waiting stages in a few vector operations.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from topas.instance import StageRef, longest_tails
from topas.policies.base import Policy, PolicyContext, Predictions
from topas.policies.scoreboard import Scoreboard
from topas.state import Decision, Phase, Planner, PrefixStatus, State


@dataclass
class _Shape:
    """What never changes about a task during a run, with stages by topological index."""

    refs: list[StageRef]
    index: dict[str, int]  # stage id -> topological index
    agents: list[str]
    svc: list[float]  # predicted service, seconds
    load: list[float]  # seconds to load the stage's prefix
    children: list[list[int]]
    deps: list[list[int]]


@dataclass
class _TaskView:
    """The path analysis of one task for one epoch and residency of its agents."""

    length: float  # L_j: longest remaining path, seconds (loads of non-resident prefixes in)
    tails: dict[int, float]  # waiting stage -> its own service + load + longest path after it
    slack_ref: dict[int, float]  # waiting stage -> longest path over the task's other frontier
    upcoming: dict[str, float]  # agent -> max of exp(-ready_in/horizon) over unadmitted stages
    at: float  # the time of the analysis (running stages count what was left of them then)


REFRESH_BUDGET = 4
"""Tasks re-analysed per decision because a prefix they need changed residency (beyond
those whose own stages changed, which always are). The move term follows residency at
once; a task's path length may count a load that is no longer needed (or miss one) for a
few decisions: with many tasks per agent, re-analysing all of them at every load or
eviction would dominate the decision time."""

VIEWS_PER_TASK = 4
"""Analyses kept per task (by epoch and residency of its agents): residency flips back
and forth, and each flip would otherwise re-analyse every task that uses the agent."""


@dataclass
class _Reservation:
    """Memory promised to the best-ranked stage that cannot fit yet (EASY backfilling):
    it fits once running stages free it, ``at`` seconds from now by their predictions."""

    at: float
    extra: int  # tokens free at that time beyond what the reserved stage needs
    prefixes: frozenset[str] = frozenset()  # agents whose prefix it counts on being freed

    def allows(self, service: float, cost: int, agent: str) -> bool:
        """A later stage may start if it ends before ``at``, or if it fits in the extra
        without keeping a prefix the reservation counts on in use."""
        if service <= self.at:
            return True
        if agent not in self.prefixes and cost <= self.extra:
            self.extra -= cost
            return True
        return False


MAX_MISFITS = 16
"""Waiting stages a decision examines that do not fit as they are, before it stops: bounds
the time of a decision when memory, not the batch, is what limits admission."""


def _version(state: State) -> tuple:
    """What changes whenever a state changes in a way a sync reads: its clock, its newest
    task and wait stamps (every phase change and every queued stage takes a new one), its
    queue, batch and KV, and its prompts' residency."""
    epoch, stamps = state.task_epoch, state.wait_stamp
    return (
        state.time,
        next(reversed(epoch.values()), 0),
        next(reversed(stamps.values()), 0),
        len(state.waiting),
        len(state.running),
        state.kv_committed,
        tuple(p.status for p in state.prefixes.values()),
    )


@dataclass
class TOPASGreedy(Policy):
    """Task-oriented, prefix-aware scheduling (see the module docstring)."""

    path: float = 1.0
    reuse: float = 1.0
    move: float = 1.0
    redo: float = 1.0  # weight of the lost work in the retraction order (was ``preempt``)
    aging: float = 1.0
    horizon: float = 0.0  # seconds; 0 = 4 x the mean predicted stage service
    age_scale: float = 0.0  # seconds; 0 = the mean predicted critical path of a task
    reserve: float = 2.0  # age, in mean task ages, from which a stage may reserve memory
    name = "topas-greedy"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._views: dict[str, _TaskView] = {}  # task -> its analysis in the synced state
        self._view_cache: dict[str, dict[tuple, _TaskView]] = {}
        self._shapes: dict[str, _Shape] = {}
        self._view_epoch: dict[str, int] = {}
        self._last_admit: list[StageRef] = []  # what the last decision admitted
        self._active: set[str] = set()  # tasks with stages running or just admitted
        self._mean_age: float | None = None  # mean age of the released tasks, per decision
        self._stale: dict[str, None] = {}  # tasks whose agents' residency changed, in order
        self._synced: State | None = None  # the state of the last sync, and its newest stamp
        self._synced_epoch = 0
        self._pred = Predictions(ctx)
        self._mean_path = 0.0  # mean predicted critical path of the tasks seen (no loads)
        self._n_path = 0
        self._board: Scoreboard | None = None
        self._scored: tuple[State, tuple, tuple] | None = None  # the last _scores: its
        # state, the state's version then, and what it returned
        self._resident: frozenset[str] = frozenset()
        self._tasks_of_agent: dict[str, dict[str, None]] = {}  # ordered sets: runs repeat
        self._agents_of: dict[str, frozenset[str]] = {}

    # ------------------------------------------------------------------ estimates

    def _service(self, state: State, ref: StageRef) -> float:
        return self._pred.service(state, ref)

    def _load(self, state: State, agent: str) -> float:
        return self._pred.load(state, agent)

    @property
    def _mean_svc(self) -> float:
        return self._pred.mean_service

    def _age_scale(self) -> float:
        return self.age_scale or max(self._mean_path, 1e-9)

    def _horizon(self) -> float:
        return self.horizon or 4.0 * max(self._mean_svc, 1e-9)

    # ------------------------------------------------------------------ incremental sync

    def _sync(self, state: State) -> Scoreboard:
        """Bring the scoreboard and the per-task views in step with ``state``.

        Only tasks whose epoch changed, new tasks and tasks using an agent whose residency
        changed since the last sync are re-analysed. In the state last synced (the
        engine's, changed in place) the changed tasks are read from the end of the
        stamp-ordered ``task_epoch`` and finished tasks among those that had stages
        running, so a sync costs what changed, not what is queued; any other state, or a
        count that does not add up, gets full set differences.
        """
        board = self._board
        if board is None:
            board = self._board = Scoreboard(state.prefixes)
            self._load_vec = np.array([self._load(state, a) for a in board.agents])
            self._smallest_prefix = min((p.tokens for p in state.prefixes.values()), default=0)
            self._tasks_of_agent = {a: {} for a in board.agents}
        tasks, epoch, seen = state.tasks, state.task_epoch, self._view_epoch
        same = state is self._synced
        if same:
            changed = []
            for tid, e in reversed(epoch.items()):  # newest first
                if e <= self._synced_epoch:
                    break
                changed.append(tid)
            # (a filler may be told of admissions of tasks it has not synced yet)
            gone = sorted(t for t in self._active if t not in tasks and t in board.tasks.of)
            new = [tid for tid in changed if tid not in board.tasks.of]
        else:
            gone = sorted(board.tasks.of.keys() - tasks.keys())
            new = [tid for tid in tasks if tid not in board.tasks.of]
        for tid in gone:
            self._forget(board, tid)
        for tid in new:
            self._register(state, board, tid)
        if len(board.tasks.of) != len(tasks):  # not expected: a full difference
            same = False
            for tid in sorted(board.tasks.of.keys() - tasks.keys()):
                self._forget(board, tid)
            for tid in [t for t in tasks if t not in board.tasks.of]:
                self._register(state, board, tid)
        if same:
            dirty = [tid for tid in changed if seen.get(tid) != epoch[tid]]
        else:
            dirty = [tid for tid in tasks if seen.get(tid) != epoch[tid]]
        resident = frozenset(
            a for a, p in state.prefixes.items() if p.status != PrefixStatus.ABSENT
        )
        for a in sorted(resident ^ self._resident):
            # the move term of its waiting stages now; their tasks' paths (which count
            # the load) within the refresh budget, oldest first
            board.set_agent_load(a, 0.0 if a in resident else self._load(state, a))
            self._stale.update(dict.fromkeys(self._tasks_of_agent[a]))
        self._resident = resident
        self._synced = state
        self._synced_epoch = next(reversed(epoch.values()), 0)
        self._sync_waiting(state, board, same)
        for tid in dirty:
            self._reanalyse(state, board, tid)
            seen[tid] = epoch[tid]
            self._stale.pop(tid, None)
        if len(board.stages.of) != len(state.waiting):  # not expected: a full difference
            for ref in sorted(board.stages.of.keys() - state.waiting.keys()):
                board.drop_stage(ref)
            for tid in sorted({ref[0] for ref in state.waiting.keys() - board.stages.of.keys()}):
                self._reanalyse(state, board, tid)
        for tid in list(itertools.islice(self._stale, REFRESH_BUDGET)):
            del self._stale[tid]
            self._reanalyse(state, board, tid)
        self._active = {ref[0] for ref in state.running}
        return board

    def _register(self, state: State, board: Scoreboard, tid: str) -> None:
        board.add_task(tid, state.tasks[tid].release)
        agents = frozenset(s.agent for s in state.tasks[tid].stages.values())
        self._agents_of[tid] = agents
        for a in agents:
            self._tasks_of_agent[a][tid] = None
        self._shape(state, tid)  # before any analysis of this sync: same means, any order

    def _forget(self, board: Scoreboard, tid: str) -> None:
        board.drop_task(tid)
        for d in (self._views, self._view_cache, self._shapes, self._view_epoch, self._stale):
            d.pop(tid, None)
        for a in self._agents_of.pop(tid):
            self._tasks_of_agent[a].pop(tid, None)

    def _sync_waiting(self, state: State, board: Scoreboard, same: bool) -> None:
        """Drop the stages that left the waiting queue. Stages leave it when admitted, so
        in the state last decided on (``same``) only the last decision's admissions are
        checked; :meth:`_sync` verifies the count and falls back to a full difference."""
        if same:
            gone = [r for r in self._last_admit if r not in state.waiting and r in board.stages.of]
        else:
            gone = sorted(board.stages.of.keys() - state.waiting.keys())
        for ref in gone:
            board.drop_stage(ref)

    def _reanalyse(self, state: State, board: Scoreboard, tid: str) -> None:
        key = (state.task_epoch[tid], self._resident & self._agents_of[tid])
        cache = self._view_cache.setdefault(tid, {})
        view = cache.get(key)
        if view is None:
            view = self._analyse(state, tid)
            if len(cache) >= VIEWS_PER_TASK:
                cache.pop(next(iter(cache)))
            cache[key] = view
        self._views[tid] = view
        board.set_upcoming(tid, view.upcoming)
        inv_len = 1.0 / max(view.length, 1e-9)
        shape = self._shapes[tid]
        for i, tail in view.tails.items():
            ref = shape.refs[i]
            agent = shape.agents[i]
            load = 0.0 if agent in self._resident else shape.load[i]
            board.put_stage(ref, agent, inv_len, view.length - tail, load, state.wait_stamp[ref])

    def _shape(self, state: State, tid: str) -> _Shape:
        """The static part of a task's analysis: its stages in topological order, their
        predicted services and prefix loads, and the DAG as index lists."""
        shape = self._shapes.get(tid)
        if shape is None:
            info = state.tasks[tid]
            sids = list(info.topo_order)
            pos = {sid: i for i, sid in enumerate(sids)}
            stages = [info.stages[sid] for sid in sids]
            shape = self._shapes[tid] = _Shape(
                refs=[(tid, sid) for sid in sids],
                index=pos,
                agents=[s.agent for s in stages],
                svc=[self._service(state, (tid, sid)) for sid in sids],
                load=[self._load(state, s.agent) for s in stages],
                children=[[pos[c] for c in s.children] for s in stages],
                deps=[[pos[d] for d in s.deps] for s in stages],
            )
            tail = longest_tails(
                range(len(sids)), shape.children.__getitem__, shape.svc.__getitem__
            )
            self._n_path += 1
            self._mean_path += (max(tail.values(), default=0.0) - self._mean_path) / self._n_path
        return shape

    def _analyse(self, state: State, tid: str) -> _TaskView:
        """Longest remaining paths (with the loads of absent prefixes), the slack of each
        waiting stage to its task's longest path, and the discounted upcoming reuse."""
        shape = self._shape(state, tid)
        resident = self._resident
        phase = state.phase
        n = len(shape.refs)
        own: list[float | None] = [None] * n  # None: done
        waiting: list[int] = []
        blocked = [False] * n
        for i, ref in enumerate(shape.refs):
            ph = phase[ref]
            if ph is Phase.DONE:
                continue
            o = shape.svc[i]
            if ph is Phase.WAITING or ph is Phase.BLOCKED:
                if shape.agents[i] not in resident:
                    o += shape.load[i]
                if ph is Phase.WAITING:
                    waiting.append(i)
                else:
                    blocked[i] = True
            elif ph is Phase.RUNNING:
                started = state.running[ref].started_at
                if started is not None:  # what is left of it, predicted
                    o = max(o - (state.time - started), 0.1 * o)
            own[i] = o
        tail = [0.0] * n
        for i in range(n - 1, -1, -1):
            o = own[i]
            if o is None:
                continue
            below = 0.0
            for c in shape.children[i]:  # children of an unfinished stage are unfinished
                if tail[c] > below:
                    below = tail[c]
            tail[i] = o + below
        frontier = [tail[i] for i in range(n) if own[i] is not None and not blocked[i]]
        length = max(frontier, default=0.0)
        # the longest path through the other frontier stages, for each waiting stage
        best = sorted(frontier, reverse=True)[:2]
        slack_ref = {}
        for i in waiting:
            if len(best) == 1:
                slack_ref[i] = 0.0
            else:
                slack_ref[i] = best[1] if tail[i] == best[0] else best[0]
        # how soon each unadmitted stage is ready: the longest chain of unfinished deps
        ready_in = [0.0] * n
        upcoming: dict[str, float] = {}
        h = self._horizon()
        for i in range(n):
            if own[i] is None:
                continue
            agent = shape.agents[i]
            if blocked[i]:
                r = 0.0
                for d in shape.deps[i]:
                    od = own[d]
                    if od is not None and ready_in[d] + od > r:
                        r = ready_in[d] + od
                ready_in[i] = r
                upcoming[agent] = max(upcoming.get(agent, 0.0), math.exp(-r / h))
            elif i in slack_ref:  # waiting
                upcoming[agent] = 1.0
        return _TaskView(length, {i: tail[i] for i in waiting}, slack_ref, upcoming, state.time)

    # ------------------------------------------------------------------ the decision

    def _scores(self, state: State) -> tuple[Scoreboard, np.ndarray, dict[str, float]]:
        """The scoreboard, the task weights (per task slot) and the retention values;
        those of the last call while the state is as it was then (the SGLang plugin asks
        for the eviction order of the state it has just decided on)."""
        key = _version(state)
        if self._scored is not None and self._scored[0] is state and self._scored[1] == key:
            return self._scored[2]
        board = self._sync(state)
        weights = board.task_weights(state.time, self.aging, self._age_scale())
        if self.reuse:
            values = board.retention(weights) * self._load_vec
            retain = dict(zip(board.agents, values.tolist(), strict=True))
        else:
            retain = {}
        self._scored = (state, key, (board, weights, retain))
        return board, weights, retain

    def decide(self, state: State) -> Decision:
        board, weights, retain = self._scores(state)
        self._mean_age = None
        plan = state.plan()
        misfits, held = self._admit_greedily(state, board, weights, retain, plan)
        if not (misfits and not self.ctx.predict.discrete):
            # in continuous time, while memory binds admission, a prefetched prompt takes
            # the memory of stages that wait for it: they come first. Measured on the paper
            # setting's tuning seeds (host swap): prefetching anyway costs up to 3.6% mean
            # and 10.7% p99 (DAG-4, TL). In the step model prefetching is kept
            self._prefetch(state, plan, retain)
        self.admitted(plan.admit)
        return dataclasses.replace(plan.decision(), held=held)

    def admit_within(self, state: State, plan: Planner, agents: frozenset[str]) -> tuple:
        """The single pass as a filler (``topas:fill=greedy``): on top of ``plan``, admit
        the waiting stages of ``agents`` only, best first, as :meth:`decide` would, without
        prefetching. Returns the stages it held back. The caller reports what its decision
        admitted through :meth:`admitted`."""
        board, weights, retain = self._scores(state)
        self._mean_age = None
        _, held = self._admit_greedily(state, board, weights, retain, plan, agents)
        return held

    def admitted(self, refs: Sequence[StageRef]) -> None:
        """The stages the decision taken on the last state admitted (what the next sync
        drops from the waiting queue)."""
        self._last_admit = list(refs)
        self._active.update(ref[0] for ref in refs)

    def _admit_greedily(  # type: ignore[no-untyped-def]
        self, state, board, weights, retain, plan, agents=None
    ) -> tuple[int, tuple]:
        """Admit waiting stages best first while they fit (evicting unused prefixes when
        that gains more than their retention is worth, holding back otherwise, and keeping
        memory for a starving stage). Returns how many did not fit as they were, and the
        stages kept out on purpose (held back, or behind a reservation). With ``agents``,
        only those agents' stages are candidates."""
        order = board.order(self._admission_values(board, weights), agents=agents)
        if agents is not None:  # a filler: the plan may admit some already
            taken = set(plan.admit)
            if taken:
                order = (r for r in order if r not in taken)
        evict_rank: list[str] | None = None  # unused prefixes, least retention per token
        # first: sorted at the first misfit (most decisions fill the free slots without one)
        held: list[tuple[StageRef, list[str]]] = []
        reserved_out: list[StageRef] = []
        misfits = 0
        room = None  # free KV plus every unused prefix's, while the plan is unchanged
        unused: list[str] = []
        shadow: _Reservation | None = None
        order = iter(order)
        while plan.free_slots >= 1 and misfits < MAX_MISFITS:
            if shadow is None:
                n = len(plan.admit)
                misfit = plan.take_while_fits(order)  # those that fit as they are
                if len(plan.admit) > n:
                    room = None
                if misfit is None:
                    break
                ref, cost = misfit
            else:
                ref = next(order, None)
                if ref is None:
                    break
                cost = plan.cost(ref)
                if cost <= plan.free_kv:
                    if shadow.allows(self._service(state, ref), cost, state.agent_of(ref)):
                        plan.admit_priced(ref, cost)
                        room = None
                    else:
                        reserved_out.append(ref)
                    continue
            misfits += 1
            if room is None:  # the plan changed: unused prefixes in eviction order, anew
                if evict_rank is None:
                    evict_rank = sorted(
                        state.evictable(),
                        key=lambda a: retain.get(a, 0.0) / state.prefixes[a].tokens,
                    )
                unused = plan.evictable(evict_rank)
                room = plan.free_kv + sum(state.prefixes[a].tokens for a in unused)
            if cost > room:
                # it cannot fit even after evicting every unused prefix: the first such
                # stage in the order gets the memory that running stages free (EASY
                # backfilling: later stages start only if they do not delay it)
                if self.reserve and shadow is None and self._starving(state, board, ref):
                    shadow = self._reservation(state, ref, cost - room)
                continue
            victims = self._victims_for(state, plan, ref, cost, unused)
            if victims is None:
                continue
            gain = self._deferral_gain(ref, weights[board.tasks.of[ref[0]]])
            lost = self.reuse * sum(retain.get(a, 0.0) for a in victims)
            if gain <= lost:
                held.append((ref, victims))  # the prefixes it would evict are worth more
                continue
            if shadow is not None and not shadow.allows(
                self._service(state, ref), cost, state.agent_of(ref)
            ):
                reserved_out.append(ref)
                continue
            for a in victims:
                plan.do_evict(a)
            plan.try_admit(ref)
            room = None
        if held and not plan.admit and not state.running:
            # holding back only pays while something else runs: never idle the server
            ref, victims = held.pop(0)
            for a in victims:
                plan.do_evict(a)
            plan.try_admit(ref)
        return misfits, tuple(ref for ref, _ in held) + tuple(reserved_out)

    def _starving(self, state: State, board: Scoreboard, ref: StageRef) -> bool:
        """Whether ``ref``'s task has waited ``reserve`` times as long as the released tasks
        do on average, and at least ``age_scale``: an outlier the flow leaves behind."""
        age = state.age(ref[0])
        if age < self._age_scale():
            return False
        if self._mean_age is None:  # once per decision
            self._mean_age = state.time - float(board.release[board.live].mean())
        return age >= self.reserve * self._mean_age

    def _reservation(self, state: State, ref: StageRef, shortfall: int) -> _Reservation:
        """When running stages will have freed ``shortfall`` more tokens for ``ref``, by
        their predicted remaining service (a prefix frees with its last running user), and
        how many tokens beyond that will be free then."""
        ends = []
        for r, run in state.running.items():
            ends.append((self._pred.remaining(state, r), run.reserved, state.agent_of(r)))
        ends.sort()
        users = {a: p.users for a, p in state.prefixes.items() if p.users}
        own = state.agent_of(ref)
        freed = 0
        released: set[str] = set()
        for left, tokens, agent in ends:
            freed += tokens
            users[agent] -= 1
            if not users[agent] and agent != own:
                freed += state.prefixes[agent].tokens  # unused now: evictable
                released.add(agent)
            if freed >= shortfall:
                return _Reservation(left, freed - shortfall, frozenset(released))
        return _Reservation(math.inf, 0)

    def _admission_values(self, board: Scoreboard, weights: np.ndarray) -> np.ndarray:
        """Per stage slot, the value of starting it now:
        ``crit(v) * (path / L_j + aging * age_j / (age_scale * q))`` less the movement
        its prefix load causes, ``move * load(v) / (L_j * q)``.

        ``path / L_j`` is Smith's ratio for the sum of JCTs (a cut of the task's longest
        path per second of it: a task near its end goes first); ``crit`` is 1 on the
        task's longest path and decays with the slack to it, over a typical stage service
        ``q``. Aging is added, not multiplied: after ``age_scale`` seconds a task is as
        urgent as one with a single stage left, whatever its own length, so every task's
        wait is bounded."""
        q = max(self._mean_svc, 1e-9)
        w = weights[board.s_task]
        if self.path:
            values = np.exp(-board.s_slack / q) * (self.path * board.s_inv_len + (w - 1.0) / q)
        else:
            values = (w - 1.0) / q
        if self.move:
            values -= self.move * board.s_load * board.s_inv_len / q
        return values

    def _deferral_gain(self, ref: StageRef, weight: float) -> float:
        """Seconds of weighted completion gained by starting ``ref`` now instead of after
        a typical stage service: the expected cut in its task's longest path."""
        tid = ref[0]
        view = self._views[tid]
        i = self._shapes[tid].index[ref[1]]
        q = max(self._mean_svc, 1e-9)
        tail = view.tails[i]
        cut = min(q, max(0.0, q + tail - max(view.slack_ref[i], tail)))
        crit = math.exp(-(view.length - tail) / q)
        return weight * max(cut, q * crit) * max(self.path, 1e-9)

    def eviction_order(self, state: State) -> list[str]:
        """Unused prefixes, least worth keeping first (LRU among equals)."""
        _, _, retain = self._scores(state)
        cands = state.evictable()
        cands.sort(key=lambda a: retain.get(a, 0.0))
        return cands

    def _victims_for(self, state, plan, ref, cost, unused) -> list[str] | None:  # type: ignore[no-untyped-def]
        """The cheapest unused prefixes (``unused``: least retention value per token first)
        whose eviction makes ``ref``, of KV ``cost``, fit; or None."""
        agent = state.agent_of(ref)
        need = cost - plan.free_kv
        chosen, freed = [], 0
        for a in unused:
            if freed >= need:
                break
            if a != agent:
                chosen.append(a)
                freed += state.prefixes[a].tokens
        return chosen if freed >= need else None

    def _prefetch(self, state, plan, retain) -> None:  # type: ignore[no-untyped-def]
        """Load absent prefixes whose near-term reuse outweighs half the load, best first,
        if they fit without evicting anything."""
        if not (self.reuse and retain):
            return
        board = self._board
        values = np.fromiter(retain.values(), float, len(retain))
        worth = np.flatnonzero(
            (values > 0.0) & (self.reuse * values >= self.move * 0.5 * self._load_vec)
        )
        for i in worth[np.argsort(-values[worth], kind="stable")].tolist():
            if plan.free_kv < self._smallest_prefix:
                break
            agent = board.agents[i]
            if plan.status(agent) == PrefixStatus.ABSENT:
                plan.do_load(agent)

    # ------------------------------------------------------------------ retraction

    def retraction_order(self, state: State, candidates) -> list[StageRef]:  # type: ignore[no-untyped-def]
        """Cheapest loss first. A retraction costs, in weighted seconds, the generated work
        it must redo (``redo``) plus its task's Smith-ratio value ``w_j * q / L_j`` times
        a typical stage service ``q`` (``path``): a task near its end is kept running."""
        board, weights, _ = self._scores(state)
        q = max(self._mean_svc, 1e-9)

        def cost(ref: StageRef) -> tuple[float, str, str]:
            tid = ref[0]
            w = float(weights[board.tasks.of[tid]])
            done = state.running[ref].generated / max(1, state.stage(ref).predicted_output)
            lost = self.redo * w * self._service(state, ref) * min(1.0, done)
            value = self.path * w * q * q / max(self._views[tid].length, 1e-9)
            return (lost + value, tid, ref[1])

        return sorted(candidates, key=cost)
