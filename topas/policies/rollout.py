"""``topas-rollout``: TOPAS with a rollout, post-decision states judged by simulation.

TOPAS scores a post-decision state with a one-step estimate: the cut in each task's
longest remaining path, reuse, movement. Where that estimate is myopic (a prompt drained
a step before two of its stages arrive, a prefetch made too early or too late, a switch
of the served agent), the decision it picks can cost more later than one it passed
over. A rollout judges candidate decisions by their consequences instead (Bertsekas's
rollout with several base heuristics):

- **Candidates.** The decisions of the base policies (``bases``, TOPAS first); TOPAS's
  next-best post-decision states (``alternatives``: each a different resident set
  ``R'``, best-scored first); and perturbations of TOPAS's decision (``variants``): one
  prefetch more (an absent prompt that a known stage will use, with unused prompts
  evicted where it does not fit otherwise), its last admission left out, its prefetches
  left out, and nothing started at all until the next event.
- **Rollouts.** Each distinct candidate is applied in the forward model
  (:mod:`topas.forward`: the simulator resumed from the state, the released tasks with
  their predicted lengths, no arrivals) and followed by a copy of each base policy
  (``cross``; else of the base that proposed it, TOPAS for the others) until every known
  task is done. A candidate's cost is the sum of the known tasks' JCTs under its best
  continuation. A rollout stops as soon as it cannot beat the best so far (a floor under
  its sum of JCTs passes it: ``Engine.resumed``'s ``cutoff``), which changes no choice.
- **Choice.** The cheapest candidate is decided; ties go to the earlier candidate, so
  TOPAS's own decision stands unless a rollout shows a better one. A decision that serves
  a starving stage first (TOPAS's reservation) is taken as it is, so the starvation bound
  holds as it does for TOPAS.

With every task known and exact predictions (the step model of the optimality-gap
study with all arrivals at once) the rollout is never worse than any of its bases (the
cost-improvement property, checked under hypothesis in ``tests/test_rollout.py``); with
arrivals it plans for the tasks in view.

A rollout costs a simulation per candidate and continuation, so it is made only while the
released tasks have at most ``max_stages`` unfinished stages; above that TOPAS decides
alone (the other bases are consulted only when a rollout is made). With ``narrow_stages``
(off by default) a *narrow* rollout is made above ``max_stages``, up to that many
unfinished stages: the decisions of the first ``narrow_bases`` bases only (TOPAS's and
``topas-greedy``'s with the default bases), each continued by each of them, no
alternatives and no perturbations. Deterministic: the bases and the forward model are.
docs/topas.md has the measurements and the choice of every default.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from topas.errors import InputError
from topas.instance import StageRef
from topas.params import split_outside, unwrap
from topas.policies.base import Policy, PolicyContext
from topas.policies.search import TOPAS
from topas.state import Decision, Phase, Planner, PrefixStatus, State

DEFAULT_BASES = (
    "(topas:fill=search,stall=0,drain_load=0,token_floor=0)+topas-greedy+lpm+parrot-fcfs"
)
"""The base policies of ``topas-rollout`` (docs/topas.md has how they were chosen). Its
TOPAS is the one it was tuned and measured with, before ``fill=auto``, ``stall=1``,
``drain_load=1`` and ``token_floor=1`` became TOPAS's defaults (2026-12-07). The first
two change nothing over a host link or in the step model, and with them as its base the
rollout was within the CI of this one on tuning seeds (docs/topas.md, "The defaults of
2026-12-07"); the rollout over a TOPAS with ``drain_load=1`` is not measured."""

CUTOFF_SLACK_S = 1e-6
"""A rollout stops once its JCTs are sure to sum past the best so far plus this much (s).
It is far above the rounding between the engine's running sum and the final one, so a
stopped rollout could not have won (a win needs a cost 1e-9 s below the best), and the
choice is the one that running every rollout to its end makes."""


@dataclass
class Rollout(Policy):
    """TOPAS with a rollout over candidate decisions (module doc)."""

    bases: str = DEFAULT_BASES  # registered policy specs joined by "+", one with parameters
    # of its own in parentheses (a spec's commas split its parameters); the first is TOPAS
    cross: bool = True  # every base continues every candidate (else only its proposer)
    alternatives: int = 4  # TOPAS's next-best post-decision states among the candidates
    variants: bool = True  # perturbations of TOPAS's decision among the candidates
    max_stages: int = 64  # roll out while the released tasks have at most this many stages left
    narrow_stages: int = 0  # above max_stages, a narrow rollout up to this many (0: none)
    narrow_bases: int = 2  # the narrow rollout's candidates and continuations: the first bases
    name = "topas-rollout"

    def check(self) -> None:
        """Build the base policies from ``bases`` into ``policies`` (each checked by
        ``make_policy``) and check them; :meth:`reset` (through ``Policy.reset``) so gets
        a fresh set for each run, built once."""
        from topas.policies import make_policy

        try:
            names = [unwrap(n) for n in split_outside(self.bases, "+")]
        except ValueError as e:
            raise InputError(f"bases: {e}") from None
        if not all(names):
            raise InputError(f"bases: expected policy specs joined by '+', got {self.bases!r}")
        if min(self.max_stages, self.alternatives, self.narrow_stages) < 0:
            raise InputError("max_stages, alternatives and narrow_stages must be >= 0")
        if not 1 <= self.narrow_bases <= len(names):
            raise InputError(f"narrow_bases must be between 1 and the {len(names)} bases")
        policies = [make_policy(n) for n in names]
        if not isinstance(policies[0], TOPAS):
            raise InputError(f"bases: the first base must be a TOPAS spec, got {names[0]!r}")
        if any(isinstance(p, Rollout) for p in policies):
            raise InputError("bases: a rollout cannot be a base of a rollout")
        self.policies = policies

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)  # check() builds self.policies afresh
        from topas.forward import Forward  # the simulator, lazily (topas.forward's doc)

        for p in self.policies:
            p.reset(ctx)
        self.forward = Forward(ctx)
        self.chosen: Policy = self.policies[0]  # whose decision was taken last
        self.rollouts = 0  # simulations run, over the run (for the bench)

    def decide(self, state: State) -> Decision:
        topas = self.policies[0]
        assert isinstance(topas, TOPAS)
        choice = topas.decide(state)
        self.chosen = topas
        stages = sum(state.unfinished.values())
        full = stages <= self.max_stages
        if not topas.reserving and state.tasks and (full or stages <= self.narrow_stages):
            bases = self.policies if full else self.policies[: self.narrow_bases]
            decisions = [choice, *(p.decide(state) for p in bases[1:])]
            proposers = list(range(len(decisions)))
            extra = []  # TOPAS's alternatives and perturbations: the full rollout's only
            if full:
                extra = topas.alternatives(state, self.alternatives)
                if self.variants:
                    extra += variants(state, choice)
            decisions += extra
            proposers += [0] * len(extra)
            candidates = distinct(decisions)
            if len(candidates) > 1:
                i = self._best(state, candidates, decisions, proposers, bases)
                choice, self.chosen = decisions[i], bases[proposers[i]]
        self.forward.note(state, choice)
        return choice

    def _best(
        self,
        state: State,
        candidates: Sequence[int],
        decisions: Sequence[Decision],
        proposers: Sequence[int],
        bases: Sequence[Policy],
    ) -> int:
        """The candidate whose best rollout, continued by ``bases``, has the least sum of
        the known tasks' JCTs."""
        instance = self.forward.instance(state)
        frozen = [self.forward.freeze(p, state) for p in bases]
        best, best_cost = candidates[0], math.inf
        for i in candidates:
            for j in range(len(bases)) if self.cross else (proposers[i],):
                cutoff = best_cost + CUTOFF_SLACK_S  # stop a rollout that cannot win
                cost = self.forward.jct_sum(state, instance, decisions[i], frozen[j], cutoff)
                self.rollouts += 1
                if cost < best_cost - 1e-9:  # infinite: the base waits for an arrival
                    best, best_cost = i, cost
        return best

    def eviction_order(self, state: State) -> list[str]:
        return self.chosen.eviction_order(state)

    def retraction_order(self, state: State, candidates: Sequence[StageRef]) -> list[StageRef]:
        return self.chosen.retraction_order(state, candidates)


def distinct(decisions: Sequence[Decision]) -> list[int]:
    """The index of the first decision of each distinct plan: what it preempts, evicts and
    loads (as sets), what it admits (in order: the prefill order) and when it wakes."""
    seen: dict[tuple, int] = {}
    for i, d in enumerate(decisions):
        key = (frozenset(d.preempt), frozenset(d.evict), frozenset(d.load), d.admit, d.wake_at)
        seen.setdefault(key, i)
    return sorted(seen.values())


def variants(state: State, decision: Decision) -> list[Decision]:
    """Perturbations of ``decision`` (module doc), each applicable to ``state``: one
    prefetch more, for each absent prompt that a known unfinished stage uses (with unused
    prompts evicted, least recently used first, where it does not fit otherwise); its last
    admission left out; its prefetches left out; nothing started until the next event."""
    out = []
    ahead = (Phase.WAITING, Phase.BLOCKED)
    needed = {state.agent_of(ref) for ref, ph in state.phase.items() if ph in ahead}
    for agent in sorted(needed):
        plan = _replay(state, decision)
        if plan is None or plan.status(agent) is not PrefixStatus.ABSENT:
            continue
        spare = plan.evictable()
        evicted = []
        while not plan.do_load(agent) and spare:
            victim = spare.pop(0)
            plan.do_evict(victim)
            evicted.append(victim)
        if plan.status(agent) is PrefixStatus.LOADING:
            out.append(
                dataclasses.replace(
                    decision, evict=decision.evict + tuple(evicted), load=decision.load + (agent,)
                )
            )
    if decision.admit:
        out.append(dataclasses.replace(decision, admit=decision.admit[:-1]))
    if decision.load:
        out.append(dataclasses.replace(decision, load=()))
    out.append(Decision(held=decision.held))
    return out


def _replay(state: State, decision: Decision) -> Planner | None:
    """A plan of ``decision`` on ``state`` (what it leaves free and resident), or None
    where the plan disagrees with the state's own accounting."""
    plan = state.plan()
    for ref in decision.preempt:
        plan.do_preempt(ref)
    for agent in decision.evict:
        plan.do_evict(agent)
    for agent in decision.load:
        if not plan.do_load(agent):
            return None
    for ref in decision.admit:
        if not plan.try_admit(ref, ()):
            return None
    return plan
