"""``OneAgent``: serve one agent's stages at a time, a probe of TOPAS's residency choice.

Issue 11 motivated the search over resident prefix sets with a crude policy that admits
only one agent's stages at a time: the other agents' prompts drain and are evicted, so
the batch grows by their memory. This is that policy, written out so that it can be
compared with TOPAS on equal terms. It is a research probe, not a registered baseline
(no serving system ships it); studies load it by its module spec, ``one_agent:OneAgent``,
which resolves wherever ``analysis/`` is on ``sys.path`` (the analysis scripts put it
there)::

    python analysis/reproduce_paper.py \
        --policies fcfs,lpm,cpf,atlas,kvflow,spf,parrot-fcfs,las,one_agent:OneAgent,topas

The rules (a polling server, one queue per agent):

- **Visit.** One agent ``a`` is served at a time. Its waiting stages are admitted in
  FCFS order (the order they became ready) while they fit, stopping at the first that
  does not, as SGLang's ``PrefillAdder`` does; unused prompts of other agents are evicted
  on demand, least recently used first. Every other agent's waiting stages are ``held``.
- **Exhaustive service** (the default): the visit lasts while ``a`` has any waiting
  stage, those that become ready during it included. An agent whose stages keep coming
  can hold the server for as long as they come (the simulator's instances are finite,
  so every run ends). ``gated=True`` is gated service: a visit serves only the stages
  that were ready when it began, so every visit is finite and no stage waits for ever.
  Exhaustive was the better of the two at loads 1.0 and 1.5 (tuning seeds 1000-1002) on
  Chain-3, DAG-4, DAG-10-Wide and MetaGPT-TL-paper (e.g. ``dag-10-wide`` at 1.5: mean
  JCT 117 s against 136 s) and on MetaGPT-SOP-paper's p99; SOP's mean was 0.0% and 3.6%
  worse.
- **Next visit.** When the visit is over, the next agent is the one whose oldest waiting
  stage has waited longest (``next=oldest``, the default), a resident prompt first on
  ties (ties of time, then agent id). ``next=most`` visits the agent with the most
  waiting stages instead (largest queue first; ties by the oldest stage, then as
  above), so that a visit's switch is paid for by the longest run of full batches. On
  tuning seeds 1000-1002 (the paper's five workloads, 200 tasks, loads 1.0 and 1.5) its
  mean JCT was lower at nine points of ten and equal at the tenth (DAG-10-Wide at 1.5,
  where its p99 was 3% higher); on MetaGPT-TL-paper at load 1.5 mean / p99 JCT were
  622 / 1095 s against 789 / 1184 s (and TOPAS's 702 / 1296 s).

Deterministic: a decision depends only on the state and the visit in progress.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from topas.errors import InputError
from topas.instance import StageRef
from topas.policies.base import Policy, PolicyContext, admit_in_order
from topas.policies.baselines import fcfs_order
from topas.state import Decision, PrefixStatus, State

NEXT_RULES = ("oldest", "most")


@dataclass
class OneAgent(Policy):
    """One agent's stages at a time: exhaustive (or gated) polling (module doc)."""

    gated: bool = False  # a visit serves only the stages ready when it began
    next: str = "oldest"  # the next visit: oldest | most (module doc)
    name = "one-agent"

    def check(self) -> None:
        if self.next not in NEXT_RULES:
            raise InputError(f"next: unknown rule {self.next!r} (valid: {', '.join(NEXT_RULES)})")

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self.agent: str | None = None  # the agent being visited
        self.since = 0.0  # when its visit began

    def decide(self, state: State) -> Decision:
        order = fcfs_order(state)
        if not order:
            return Decision()
        mine = self._visit(state, order)
        evict = [a for a in self.eviction_order(state) if a != self.agent]
        decision = admit_in_order(state, mine, evict).decision()
        served = set(mine)
        return dataclasses.replace(decision, held=tuple(r for r in order if r not in served))

    def _visit(self, state: State, order: list[StageRef]) -> list[StageRef]:
        """The waiting stages the current visit serves (a new visit when it is over)."""
        mine = self._served(state, order)
        if mine:
            return mine
        self.agent = self._next_agent(state, order)
        self.since = state.time
        return self._served(state, order)

    def _served(self, state: State, order: list[StageRef]) -> list[StageRef]:
        agent = self.agent
        if agent is None:
            return []
        return [
            r
            for r in order
            if state.agent_of(r) == agent and (not self.gated or state.waiting[r] <= self.since)
        ]

    def _next_agent(self, state: State, order: list[StageRef]) -> str:
        """The agent of the longest-waiting stage (with ``next=most``: the agent with the
        most waiting stages, then that); a resident prompt first on ties."""
        oldest: dict[str, float] = {}
        count: Counter[str] = Counter()
        for r in order:  # FCFS: the first stage of each agent is its oldest
            agent = state.agent_of(r)
            oldest.setdefault(agent, state.waiting[r])
            count[agent] += 1
        most = self.next == "most"

        def key(agent: str) -> tuple[int, float, bool, str]:
            absent = state.prefixes[agent].status is PrefixStatus.ABSENT
            return (-count[agent] if most else 0, oldest[agent], absent, agent)

        return min(oldest, key=key)
