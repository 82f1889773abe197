"""The exact oracle: optimal step-model schedules for small instances.

One entry point, :func:`solve`, over two independent formulations of the step model
(DESIGN.md rules 1-12), both minimising the sum of task JCTs in steps:

- :mod:`topas.oracle.milp`: a time-indexed MILP built with PuLP, solved by CBC or HiGHS;
- :mod:`topas.oracle.cpsat`: an interval model solved by OR-Tools CP-SAT.

:mod:`topas.oracle.problem` holds what they share: the problem data, the horizon, the
solution and result types, the warm start and the one normalisation
(:func:`~topas.oracle.problem.trim_residency`).

:func:`solve` is the one place where an answer becomes a result: a warm start is
verified before it bounds anything; the backend's solution is normalised, rebuilt as a
:class:`~topas.schedule.Schedule`, checked by :func:`~topas.verify.verify_step` and its
objective recomputed by :func:`~topas.schedule.evaluate`, once, without the solver; and
the status is reconciled with the bound. Statuses are honest: ``optimal`` only when the
solver proved it (or its bound meets the objective), ``feasible`` with the best bound
otherwise, ``timeout`` when no schedule was found.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from topas.errors import InputError
from topas.instance import Instance
from topas.oracle.problem import (
    BACKENDS,
    STATUSES,
    OracleError,
    OracleResult,
    OracleSolution,
    StepProblem,
    horizon,
    objective_of,
    serial_solution,
    solution_from_schedule,
    to_schedule,
    trim_residency,
    verified,
    warm_hint,
)
from topas.schedule import Schedule

__all__ = [
    "BACKENDS",
    "STATUSES",
    "OracleError",
    "OracleResult",
    "OracleSolution",
    "StepProblem",
    "horizon",
    "objective_of",
    "serial_solution",
    "solution_from_schedule",
    "solve",
    "to_schedule",
    "trim_residency",
    "verified",
    "warm_hint",
]


def solve(
    instance: Instance,
    backend: str = "cpsat",
    time_limit: float = 60.0,
    threads: int = 2,
    warm_start: Schedule | Callable[[Instance], Schedule] | None = None,
    log: bool = False,
) -> OracleResult:
    """Minimise the sum of JCTs of ``instance`` in the step model.

    ``warm_start``: a feasible step-model schedule that bounds the horizon and seeds the
    solver (verified first), or a function that makes one from the instance (such as
    :func:`topas.runs.best_baseline_schedule`: the oracle never imports the policies it
    judges); without it a serial schedule is used.
    ``time_limit`` is in seconds of solver time; 0 returns ``timeout`` at once.
    """
    if backend not in BACKENDS:
        raise InputError(f"unknown oracle backend {backend!r}; choose from {', '.join(BACKENDS)}")
    t0 = time.perf_counter()
    problem = StepProblem.of(instance)
    if callable(warm_start):
        warm_start = warm_start(instance)
    if warm_start is not None and not isinstance(warm_start, Schedule):
        raise InputError(
            f"warm_start: expected a Schedule or a function of the instance, got {warm_start!r}"
        )
    hint = warm_hint(problem, warm_start) if warm_start else serial_solution(problem)
    upper = objective_of(problem, hint)
    T = horizon(problem, upper)
    trivial = problem.lower_bound()
    if time_limit <= 0:
        return OracleResult("timeout", None, trivial, time.perf_counter() - t0, None, backend, T)
    if backend == "cpsat":
        from topas.oracle.cpsat import solve_cpsat

        status, sol, bound, stats = solve_cpsat(
            problem, time_limit, threads, upper_bound=upper, hint=hint, log=log
        )
    else:
        from topas.oracle.milp import solve_milp

        status, sol, bound, stats = solve_milp(
            problem, T, backend, time_limit, threads, upper, hint, log
        )
    runtime = time.perf_counter() - t0
    if sol is None:
        return OracleResult("timeout", None, max(bound, trivial), runtime, None, backend, T, stats)
    schedule, objective = verified(problem, trim_residency(problem, sol), backend)
    claimed = stats.get("objective")
    if claimed is not None and claimed != objective:
        raise OracleError(f"{backend}: objective {claimed} but evaluate() gives {objective}")
    return OracleResult(
        *_reconcile(status, bound, trivial, objective), runtime, schedule, backend, T, stats
    )


def _reconcile(status: str, bound: int, trivial: int, objective: int) -> tuple[str, int, int]:
    """(status, objective, lower bound) from a backend's answer: a proof of optimality
    makes the bound the objective; any bound is raised to the trivial one and capped by
    the objective; a bound that meets the objective proves it (sums of JCTs in steps are
    integers)."""
    if status == "optimal":
        bound = objective
    bound = min(max(bound, trivial), objective)
    return ("optimal" if bound == objective else status), objective, bound
