"""Poisson task arrivals, by rate or by load factor.

The load factor is ``rho = rate * mean_task_demand_s`` (one server), with the demand of
:func:`topas.workloads._common.task_demand_s`; so ``load=1.0`` asks for tasks as fast as
the server could serve them at its best throughput.
"""

from __future__ import annotations

import math

import numpy as np

from topas.errors import InputError

DEFAULT_LOAD = 0.8
"""Chosen: a busy but stable server, where queueing and prefix retention both matter."""


def rate_for_load(load: float, mean_demand_s: float) -> float:
    """Arrival rate (tasks per second, or per step) that gives load factor ``load``."""
    if not (math.isfinite(load) and load > 0):
        raise InputError(f"load: must be a finite number > 0, got {load!r}")
    if not mean_demand_s > 0:
        raise InputError(f"mean task demand must be > 0, got {mean_demand_s!r}")
    return load / mean_demand_s


def poisson_arrivals(
    rng: np.random.Generator, num_tasks: int, rate: float, *, integer: bool = False
) -> list[float] | list[int]:
    """Arrival times of a Poisson process of ``rate``, the first task at time 0.

    Interarrival gaps are exponential with mean ``1/rate``. Times are rounded to
    microseconds, or, with ``integer=True`` (step timing), floored to whole steps.
    """
    if not (math.isfinite(rate) and rate > 0):
        raise InputError(f"rate: must be a finite number > 0, got {rate!r}")
    gaps = rng.exponential(1.0 / rate, size=max(0, num_tasks - 1))
    times = np.concatenate([[0.0], np.cumsum(gaps)])[:num_tasks]
    if integer:
        return [int(math.floor(t + 1e-9)) for t in times]
    return [round(float(t), 6) for t in times]
