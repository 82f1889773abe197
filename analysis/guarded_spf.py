"""``GuardedSPF``: task-level SRPT with an age guard, a probe of the mean/p99 trade-off.

Past saturation `spf` (task-level SRPT) has the lowest mean JCT of the registered
baselines and `parrot-fcfs` (application-level FCFS) the lowest p99, and issue 11 asks
TOPAS to match both at once. This probe asks whether the simplest hybrid of the two
can: SRPT, except that a task older than ``guard`` seconds goes before every younger
one, guarded tasks in release order (Parrot's order). ``guard=none`` (the default) is
`spf`; ``guard=0`` is `parrot-fcfs`. Sweeping ``guard`` traces the mean/p99 frontier of the
family. It is a research probe, not a registered baseline; studies load it by its module
spec, ``guarded_spf:GuardedSPF:guard=300``, which resolves wherever ``analysis/`` is on
``sys.path`` (the analysis scripts put it there).

Within each class the order is that of `spf` or `parrot-fcfs`, ties broken by when the
stage became ready, then ids; admission and eviction are the baselines' (in order while
the stage fits, LRU eviction on demand). The decision asks to be consulted again
(``wake_at``) when the next unguarded task with a waiting stage reaches the guard, so
it depends only on the state and the time.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from topas.errors import InputError
from topas.policies.base import admit_in_order
from topas.policies.baselines import SPF, by_task_value
from topas.state import Decision, State

# The calibrated engine releases a task up to 1e-12 s before its arrival: a task counts
# as past the guard within this much, so that ``guard=0`` guards every released task.
TOLERANCE_S = 1e-9


@dataclass
class GuardedSPF(SPF):
    """Task-level SRPT; tasks older than ``guard`` seconds first, by release (module doc)."""

    guard: float | None = None  # seconds since release after which a task goes first
    name = "guarded-spf"

    def check(self) -> None:
        if self.guard is not None and not self.guard >= 0:
            raise InputError(f"guard: must be >= 0 seconds, got {self.guard!r}")

    def decide(self, state: State) -> Decision:
        remaining = self.remaining(state)
        tasks, now = state.tasks, state.time
        guard = math.inf if self.guard is None else self.guard

        def key(tid: str) -> tuple[int, float]:
            release = tasks[tid].release
            if now - release >= guard - TOLERANCE_S:
                return (0, release)
            return (1, remaining(tid))

        order = by_task_value(state, key)
        decision = admit_in_order(state, order, self.eviction_order(state)).decision()
        due = [
            tasks[tid].release + guard
            for tid in {ref[0] for ref in state.waiting}
            if now - tasks[tid].release < guard - TOLERANCE_S
        ]
        wake = min(due) if due and math.isfinite(guard) else None
        return dataclasses.replace(decision, wake_at=wake)
