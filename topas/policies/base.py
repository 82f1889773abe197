"""The policy interface and the shared admission mechanism of the baselines."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from topas.instance import ServerSpec, StageRef
from topas.state import Decision, Planner, State


@dataclass(frozen=True)
class PolicyContext:
    """What a policy knows before the run: the server and the timing mode."""

    server: ServerSpec
    timing: str  # "step" or "calibrated"
    seed: int = 0


class Policy:
    """A scheduling policy: ``decide(state) -> Decision``.

    ``event_driven``: the decision depends only on the discrete state, so the step
    engine need not consult the policy at steps where nothing happened (DESIGN rule
    12 otherwise consults it at every step where a stage waits or a load could help).
    Policies whose decisions change with time alone set it to False or use
    ``Decision.wake_at``.
    """

    name: str = "policy"
    event_driven: bool = True

    def reset(self, ctx: PolicyContext) -> None:
        """Called once before a run."""
        self.ctx = ctx

    def decide(self, state: State) -> Decision:
        raise NotImplementedError

    def eviction_order(self, state: State) -> list[str]:
        """Unused resident prefixes, first to evict first (default LRU)."""
        return state.evictable()

    def choose_victim(self, state: State, candidates: Sequence[StageRef]) -> StageRef:
        """The stage to retract when decode memory runs out.

        Default is SGLang's ``retract_decode`` order: fewest decoded tokens first,
        then the longest input.
        """
        return min(
            candidates,
            key=lambda r: (state.running[r].generated, -state.stage(r).input_tokens, r),
        )

    def spec(self) -> str:
        """The spec string that rebuilds this policy."""
        return self.name


def admit_in_order(
    state: State,
    order: Iterable[StageRef],
    evict_order: Sequence[str] | None = None,
    stop_at_first_misfit: bool = True,
) -> Planner:
    """Admit stages in ``order`` while they fit, evicting unused prefixes on demand.

    With ``stop_at_first_misfit`` admission stops at the first stage that does not
    fit, as SGLang's ``PrefillAdder`` does; otherwise it skips it and goes on.
    """
    plan = state.plan()
    for ref in order:
        if plan.free_slots < 1:
            break
        if not plan.try_admit(ref, evict_order):
            if stop_at_first_misfit:
                break
    return plan
