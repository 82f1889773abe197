"""The TOPAS policy: prefix retention and admission decided together.

At a scheduling point TOPAS builds a post-decision state greedily and scores each step of
the construction with the terms of ``DESIGN.md``:

- **path**: per task ``j`` the longest remaining service path ``L_j`` in predicted seconds,
  including the load time of every prefix on it that is not resident. Admitting a waiting
  stage that lies on (or near) that path cuts the task's expected completion by the
  deferral it avoids; by Smith's rule for the sum of JCTs the value of that cut is taken per
  second of remaining path, so a task near its end goes first (``w_j * crit(v) / L_j``).
- **reuse**: a resident prefix is worth the reloads it saves its agent's stages that are
  ready or become ready within ``horizon`` (discounted by how soon):
  ``R(a) = load_s(a) * sum_u w_u * exp(-ready_in(u) / horizon)``.
- **move**: an admission that needs its prefix loaded pays ``load_s``; an eviction forfeits
  the evicted prefix's reuse value.
- **preempt**: the retraction victim minimises the work lost plus its task's path value.
- **aging**: ``w_j = 1 + aging * age_j / age_scale``, so no task waits without bound.

Every term has a weight (``path``, ``reuse``, ``move``, ``preempt``, ``aging``); 0
switches it off: ``topas:reuse=0,aging=0``. Per-task paths are cached by the task's epoch
and the residency of its agents, so only tasks that changed are recomputed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from topas.instance import StageRef
from topas.policies.base import Policy, PolicyContext
from topas.state import Decision, Phase, PrefixStatus, State
from topas.timing import predicted_load_s, predicted_service_s


@dataclass
class _TaskView:
    """The cached path analysis of one task."""

    key: tuple
    length: float  # L_j: longest remaining path, seconds (loads of non-resident prefixes in)
    tails: dict[str, float]  # waiting stage -> its own service + load + longest path after it
    slack_ref: dict[str, float]  # waiting stage -> longest path over the task's other frontier
    upcoming: dict[str, float]  # agent -> sum of exp(-ready_in/horizon) over unadmitted stages


@dataclass
class TOPAS(Policy):
    """Task-oriented, prefix-aware scheduling (see the module docstring)."""

    path: float = 1.0
    reuse: float = 1.0
    move: float = 1.0
    preempt: float = 1.0
    aging: float = 1.0
    horizon: float = 0.0  # seconds; 0 = 4 x the mean predicted stage service
    age_scale: float = 0.0  # seconds; 0 = 20 x the mean predicted stage service
    name = "topas"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._views: dict[str, _TaskView] = {}
        self._svc: dict[StageRef, float] = {}
        self._load_s: dict[str, float] = {}
        self._mean_svc = 0.0
        self._n_svc = 0

    # ------------------------------------------------------------------ estimates

    def _service(self, state: State, ref: StageRef) -> float:
        s = self._svc.get(ref)
        if s is None:
            info = state.stage(ref)
            s = predicted_service_s(
                self.ctx.server, self.ctx.timing, info.input_tokens, info.predicted_output
            )
            self._svc[ref] = s
            self._n_svc += 1
            self._mean_svc += (s - self._mean_svc) / self._n_svc
        return s

    def _load(self, state: State, agent: str) -> float:
        s = self._load_s.get(agent)
        if s is None:
            tokens = state.prefixes[agent].tokens
            s = self._load_s[agent] = predicted_load_s(self.ctx.server, self.ctx.timing, tokens)
        return s

    def _horizon(self) -> float:
        return self.horizon or 4.0 * max(self._mean_svc, 1e-9)

    def _weight(self, state: State, tid: str) -> float:
        if not self.aging:
            return 1.0
        scale = self.age_scale or 20.0 * max(self._mean_svc, 1e-9)
        return 1.0 + self.aging * state.age(tid) / scale

    # ------------------------------------------------------------------ per-task paths

    def _view(self, state: State, tid: str) -> _TaskView:
        info = state.tasks[tid]
        agents = {s.agent for s in info.stages.values()}
        resident = frozenset(a for a in agents if state.prefixes[a].status != PrefixStatus.ABSENT)
        key = (state.task_epoch[tid], resident)
        view = self._views.get(tid)
        if view is not None and view.key == key:
            return view
        view = self._analyse(state, tid, resident, key)
        self._views[tid] = view
        return view

    def _analyse(self, state: State, tid: str, resident: frozenset, key: tuple) -> _TaskView:
        info = state.tasks[tid]
        phase = {sid: state.phase[(tid, sid)] for sid in info.stages}
        own: dict[str, float] = {}
        for sid, s in info.stages.items():
            if phase[sid] == Phase.DONE:
                continue
            own[sid] = self._service(state, (tid, sid))
            if phase[sid] in (Phase.WAITING, Phase.BLOCKED) and s.agent not in resident:
                own[sid] += self._load(state, s.agent)
        tail: dict[str, float] = {}
        for sid in reversed(info.topo_order):
            if sid in own:
                below = (tail[c] for c in info.stages[sid].children if c in tail)
                tail[sid] = own[sid] + max(below, default=0.0)
        frontier = {sid: tail[sid] for sid in own if phase[sid] != Phase.BLOCKED}
        length = max(frontier.values(), default=0.0)
        waiting = [sid for sid in frontier if phase[sid] == Phase.WAITING]
        # the longest path through the other frontier stages, for each waiting stage
        best = sorted(frontier.values(), reverse=True)
        slack_ref = {}
        for sid in waiting:
            t = frontier[sid]
            slack_ref[sid] = best[1] if len(best) > 1 and t == best[0] else best[0]
            if len(best) == 1:
                slack_ref[sid] = 0.0
        # how soon each unadmitted stage is ready: the longest chain of unfinished deps
        ready_in: dict[str, float] = {}
        upcoming: dict[str, float] = {}
        h = self._horizon()
        for sid in info.topo_order:
            if sid not in own:
                continue
            s = info.stages[sid]
            if phase[sid] == Phase.BLOCKED:
                ready_in[sid] = max(
                    (ready_in.get(d, 0.0) + own[d] for d in s.deps if d in own), default=0.0
                )
            else:
                ready_in[sid] = 0.0
            if phase[sid] in (Phase.WAITING, Phase.BLOCKED):
                upcoming[s.agent] = upcoming.get(s.agent, 0.0) + math.exp(-ready_in[sid] / h)
        return _TaskView(key, length, {sid: tail[sid] for sid in waiting}, slack_ref, upcoming)

    # ------------------------------------------------------------------ the decision

    def decide(self, state: State) -> Decision:
        for tid in [t for t in self._views if t not in state.tasks]:
            del self._views[tid]
        views = {tid: self._view(state, tid) for tid in state.tasks}
        weights = {tid: self._weight(state, tid) for tid in state.tasks}
        retain = self._retention_values(state, views, weights)
        order = sorted(
            state.waiting,
            key=lambda r: (-self._admission_value(state, r, views, weights), state.waiting[r]),
        )
        plan = state.plan()
        held: list[tuple[StageRef, list[str]]] = []
        for ref in order:
            if plan.free_slots < 1:
                break
            if plan.fits(ref):
                plan.try_admit(ref)
                continue
            victims = self._victims_for(state, plan, ref, retain)
            if victims is None:
                continue  # cannot fit even after evicting every unused prefix
            gain = self._deferral_gain(state, ref, views, weights)
            lost = self.reuse * sum(retain.get(a, 0.0) for a in victims)
            if gain <= lost:
                held.append((ref, victims))  # the prefixes it would evict are worth more
                continue
            for a in victims:
                plan.do_evict(a)
            plan.try_admit(ref)
        if held and not plan.admit and not state.running:
            # holding back only pays while something else runs: never idle the server
            ref, victims = held[0]
            for a in victims:
                plan.do_evict(a)
            plan.try_admit(ref)
        self._prefetch(state, plan, retain)
        return plan.decision()

    def _admission_value(self, state, ref, views, weights) -> float:  # type: ignore[no-untyped-def]
        """Smith-ratio value of starting ``ref`` now: weighted path cut per second of path,
        less the movement its prefix load causes."""
        tid, sid = ref
        view = views[tid]
        length = max(view.length, 1e-9)
        w = weights[tid]
        value = 0.0
        if self.path:
            value += self.path * w * self._criticality(view, sid) / length
        else:
            value += w / length if self.aging else 0.0
        agent = state.agent_of(ref)
        if self.move and state.prefixes[agent].status == PrefixStatus.ABSENT:
            value -= self.move * self._load(state, agent) / length / max(self._mean_svc, 1e-9)
        return value

    def _criticality(self, view: _TaskView, sid: str) -> float:
        """1 on the longest path; decays with the slack to it."""
        slack = view.length - view.tails[sid]
        return math.exp(-slack / max(self._mean_svc, 1e-9))

    def _deferral_gain(self, state, ref, views, weights) -> float:  # type: ignore[no-untyped-def]
        """Seconds of weighted completion gained by starting now instead of after a typical
        stage service: the expected cut in the task's longest path."""
        tid, sid = ref
        view = views[tid]
        q = self._mean_svc
        cut = min(q, max(0.0, q + view.tails[sid] - max(view.slack_ref[sid], view.tails[sid])))
        return weights[tid] * max(cut, q * self._criticality(view, sid)) * max(self.path, 1e-9)

    def _retention_values(self, state, views, weights) -> dict[str, float]:  # type: ignore[no-untyped-def]
        """R(a): reloads saved by keeping agent a's prefix, near-term stages discounted."""
        if not self.reuse:
            return {}
        total: dict[str, float] = {}
        for tid, view in views.items():
            w = weights[tid]
            for agent, s in view.upcoming.items():
                total[agent] = total.get(agent, 0.0) + w * s
        return {a: v * self._load(state, a) for a, v in total.items()}

    def eviction_order(self, state: State) -> list[str]:
        """Unused prefixes, least worth keeping first (LRU among equals)."""
        views = {tid: self._view(state, tid) for tid in state.tasks}
        weights = {tid: self._weight(state, tid) for tid in state.tasks}
        retain = self._retention_values(state, views, weights)
        cands = state.evictable()
        cands.sort(key=lambda a: retain.get(a, 0.0))
        return cands

    def _victims_for(self, state, plan, ref, retain) -> list[str] | None:  # type: ignore[no-untyped-def]
        """The cheapest set of unused prefixes whose eviction makes ``ref`` fit, or None."""
        agent = state.agent_of(ref)
        need = plan.cost(ref) - plan.free_kv
        cands = [a for a in plan.evictable() if a != agent]
        cands.sort(key=lambda a: retain.get(a, 0.0) / state.prefixes[a].tokens)
        chosen, freed = [], 0
        for a in cands:
            if freed >= need:
                break
            chosen.append(a)
            freed += state.prefixes[a].tokens
        return chosen if freed >= need else None

    def _prefetch(self, state, plan, retain) -> None:  # type: ignore[no-untyped-def]
        """Load absent prefixes whose near-term reuse outweighs the load, if they fit."""
        if not (self.reuse and retain):
            return
        ranked = sorted(retain.items(), key=lambda kv: -kv[1])
        for agent, value in ranked:
            if plan.status(agent) != PrefixStatus.ABSENT:
                continue
            if self.reuse * value >= self.move * self._load(state, agent) * 0.5:
                plan.do_load(agent)

    # ------------------------------------------------------------------ retraction

    def choose_victim(self, state: State, candidates) -> StageRef:  # type: ignore[no-untyped-def]
        """Retract the stage whose loss costs least: generated work it must redo plus
        its task's path value."""

        def cost(ref: StageRef) -> tuple[float, str, str]:
            tid = ref[0]
            view = self._view(state, tid)
            w = self._weight(state, tid)
            svc = self._service(state, ref)
            info = state.stage(ref)
            done = state.running[ref].generated / max(1, info.predicted_output)
            lost = self.preempt * w * svc * min(1.0, done)
            value = self.path * w / max(view.length, 1e-9)
            return (lost + value, tid, ref[1])

        return min(candidates, key=cost)
