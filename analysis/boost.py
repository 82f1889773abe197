"""``Boost``: FCFS with small tasks boosted, a probe of the mean/p99 trade-off.

Past saturation `spf` (task-level SRPT) has the lowest mean JCT of the registered
baselines and `parrot-fcfs` (application-level FCFS) the lowest p99. In the M/G/1 queue
with light-tailed job sizes FCFS has the optimal decay rate of the response-time tail,
and Yu and Scully's gamma-Boost ("Strongly Tail-Optimal Scheduling in the Light-Tailed
M/G/1", SIGMETRICS 2024, arXiv 2404.08826) keeps that rate and brings the tail's
constant down to the optimal one, serving small jobs much sooner than FCFS does. It
serves jobs in order of a *boosted* arrival time ``release - b(size)``, with ``b(s) =
(1/gamma) * ln(1 / (1 - exp(-gamma * s)))``, so a small job is served as if it had
arrived earlier and a large one nearly at its arrival.

This probe applies that order to tasks: a task's size is its predicted work when it is
first seen (the sum of ``PolicyContext.predict.service_s`` over its stages, `spf`'s
measure), and ``scale`` is ``1 / gamma`` in seconds. ``scale`` near 0 gives
`parrot-fcfs`'s order; a large ``scale`` orders by size (shortest task first, by its
size at release rather than what remains). Sweeping ``scale`` traces a mean/p99 curve
between the two, to set beside ``analysis/guarded_spf.py``'s. It is a research probe,
not a registered baseline; studies load it by its module spec,
``boost:Boost:scale=60``, which resolves wherever ``analysis/`` is on ``sys.path``.

The boost is computed with the task's size at release, so a task's key does not change
while it runs (the order is static, as in the paper). Ties go by when the stage became
ready, then ids; admission and eviction are the baselines' (in order while the stage
fits, LRU eviction on demand).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from topas.errors import InputError
from topas.policies.base import PolicyContext, admit_in_order
from topas.policies.baselines import SPF, by_task_value
from topas.state import Decision, State

MIN_SIZE_S = 1e-9
"""A task with no predicted work counts as this small (its boost is then finite)."""


def boost_s(size_s: float, scale_s: float) -> float:
    """gamma-Boost's boost of a job of ``size_s`` seconds, with ``gamma = 1 / scale_s``:
    ``scale * ln(1 / (1 - exp(-size / scale)))`` (0 where ``scale`` is 0)."""
    if scale_s == 0:
        return 0.0
    return -scale_s * math.log1p(-math.exp(-max(size_s, MIN_SIZE_S) / scale_s))


@dataclass
class Boost(SPF):
    """Tasks by boosted release, ``release - boost_s(size, scale)`` (module doc)."""

    scale: float = 60.0  # 1 / gamma, in seconds
    name = "boost"

    def check(self) -> None:
        if not self.scale >= 0 or math.isinf(self.scale):
            raise InputError(f"scale: must be a finite number of seconds >= 0, got {self.scale!r}")

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._key: dict[str, float] = {}

    def decide(self, state: State) -> Decision:
        tasks, keys = state.tasks, self._key
        for tid in [t for t in keys if t not in tasks]:
            del keys[tid]
        remaining = None  # spf's measure, made only when a task is first seen

        def key(tid: str) -> float:
            nonlocal remaining
            if tid not in keys:  # first seen: nothing of it has run, so this is its size
                remaining = remaining or self.remaining(state)
                keys[tid] = tasks[tid].release - boost_s(remaining(tid), self.scale)
            return keys[tid]

        order = by_task_value(state, key)
        return admit_in_order(state, order, self.eviction_order(state)).decision()
