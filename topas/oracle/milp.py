"""The oracle's time-indexed MILP: the step model (DESIGN rules 1-12) in PuLP, solved by
CBC or HiGHS.

Each constraint family is built by its own function, named as in ``docs/oracle.md``.
:func:`solve_milp` returns the solver's answer as it is: its status, read honestly (PuLP
reports a time-limited CBC or HiGHS run as "Optimal", so the real solver status and bound
are read), the solution it found and its proven bound. :func:`topas.oracle.solve`
verifies and reconciles it. A solver answering "infeasible" on a validated instance means
the model is wrong and raises :class:`~topas.oracle.problem.OracleError`.
"""

from __future__ import annotations

import math
import re
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pulp

from topas.oracle.problem import OracleError, OracleSolution, StepProblem

# --------------------------------------------------------------------------- the MILP


@dataclass
class TimeIndexedModel:
    """Variables of the time-indexed MILP over steps ``0..T-1``.

    ``x[v][t]``: stage v starts at step t; ``h[a][t]``: prefix a is held (loading or
    resident) at t; ``z[a][t]``: a load of a starts at t; ``u[a][t]``: a is resident
    (usable) at t; ``C[j]``: completion step of task j.
    """

    problem: StepProblem
    T: int
    lp: pulp.LpProblem
    x: dict[int, dict[int, pulp.LpVariable]]
    h: dict[str, list[pulp.LpVariable]]
    z: dict[str, list[pulp.LpVariable]]
    u: dict[str, list[pulp.LpVariable]]
    C: list[pulp.LpVariable]

    def running(self, v: int, t: int) -> pulp.LpAffineExpression:
        """1 if stage v runs at step t: it started in ``(t - d_v, t]``."""
        d = self.problem.stages[v].duration
        return pulp.lpSum(var for tau, var in self.x[v].items() if t - d < tau <= t)


def build_milp(problem: StepProblem, T: int, upper_bound: int | None = None) -> TimeIndexedModel:
    lp = pulp.LpProblem("topas_step_oracle", pulp.LpMinimize)
    x = _start_variables(problem, T)
    agents = problem.used_agents()
    h = {a: [pulp.LpVariable(f"h_{a}_{t}", cat="Binary") for t in range(T)] for a in agents}
    z = {a: [pulp.LpVariable(f"z_{a}_{t}", cat="Binary") for t in range(T)] for a in agents}
    u = {a: [pulp.LpVariable(f"u_{a}_{t}", cat="Binary") for t in range(T)] for a in agents}
    C = [
        pulp.LpVariable(f"C_{j}", lowBound=0, upBound=T, cat="Integer")
        for j in range(len(problem.releases))
    ]
    m = TimeIndexedModel(problem, T, lp, x, h, z, u, C)
    _objective(m, upper_bound)
    _assignment(m)
    _precedence(m)
    _completion(m)
    _prefix_lifecycle(m)
    _host_channel(m)
    _prefix_resident_while_running(m)
    _kv_capacity(m)
    _max_running(m)
    return m


def _start_variables(problem: StepProblem, T: int) -> dict[int, dict[int, pulp.LpVariable]]:
    """Start windows: earliest start from release and critical path, latest from the
    horizon minus the stage's tail (it and the chain after it must end by T)."""
    x = {}
    for v, s in enumerate(problem.stages):
        lo, hi = problem.earliest_start(v), T - s.tail
        if hi < lo:
            raise OracleError(f"horizon {T} too short for stage {s.ref}")
        x[v] = {t: pulp.LpVariable(f"x_{v}_{t}", cat="Binary") for t in range(lo, hi + 1)}
    return x


def _objective(m: TimeIndexedModel, upper_bound: int | None) -> None:
    """min sum_j (C_j - r_j); optionally <= a known feasible objective."""
    obj = pulp.lpSum(m.C) - sum(m.problem.releases)
    m.lp += obj
    if upper_bound is not None:
        m.lp += obj <= upper_bound, "upper_bound"
    for j, lb in enumerate(m.problem.task_lower_bound(j) for j in range(len(m.C))):
        m.lp += m.C[j] >= m.problem.releases[j] + lb, f"task_bound_{j}"


def _assignment(m: TimeIndexedModel) -> None:
    """Every stage starts exactly once."""
    for v, xs in m.x.items():
        m.lp += pulp.lpSum(xs.values()) == 1, f"assign_{v}"


def _precedence(m: TimeIndexedModel) -> None:
    """Rule 4, disaggregated: v can have started by t only if each dep d started by t - d_d."""
    for v, s in enumerate(m.problem.stages):
        for d in s.deps:
            dd = m.problem.stages[d].duration
            for t in m.x[v]:
                m.lp += (
                    pulp.lpSum(var for tau, var in m.x[v].items() if tau <= t)
                    <= pulp.lpSum(var for tau, var in m.x[d].items() if tau <= t - dd),
                    f"prec_{d}_{v}_{t}",
                )


def _completion(m: TimeIndexedModel) -> None:
    """C_j >= S_v + d_v for the sinks of task j (every other stage ends before a sink)."""
    for v, s in enumerate(m.problem.stages):
        if any(v in m.problem.stages[w].deps for w in m.problem.task_stages[s.task]):
            continue
        m.lp += (
            m.C[s.task] >= pulp.lpSum((t + s.duration) * var for t, var in m.x[v].items()),
            f"completion_{v}",
        )


def _prefix_lifecycle(m: TimeIndexedModel) -> None:
    """Rules 3 and 5: a prefix becomes held only by a load, which starts when it is absent
    and cannot be evicted while loading; it is resident l_a steps after the load start,
    and stays resident only while held."""
    p = m.problem
    for a in m.h:
        h, z, u, la = m.h[a], m.z[a], m.u[a], p.load[a]
        for t in range(m.T):
            prev_h = h[t - 1] if t else 0
            prev_u = u[t - 1] if t else 0
            m.lp += h[t] <= prev_h + z[t], f"held_needs_load_{a}_{t}"
            m.lp += z[t] <= 1 - prev_h, f"load_when_absent_{a}_{t}"
            m.lp += u[t] <= h[t], f"resident_is_held_{a}_{t}"
            m.lp += u[t] <= prev_u + (z[t - la] if t >= la else 0), f"resident_after_load_{a}_{t}"
            for k in range(la):  # held from its start L through L + l_a - 1 at least
                if t + k < m.T:
                    m.lp += z[t] <= h[t + k], f"no_evict_loading_{a}_{t}_{k}"


def _host_channel(m: TimeIndexedModel) -> None:
    """Host mode: one transfer at a time. A load started at L transfers in steps
    ``L .. L + l_a - 1``, so at every step t at most one ``z[a][t - k]``, ``k < l_a``, is set."""
    p = m.problem
    if not p.host:
        return
    for t in range(m.T):
        m.lp += (
            pulp.lpSum(m.z[a][t - k] for a in m.z for k in range(p.load[a]) if t - k >= 0) <= 1,
            f"host_channel_{t}",
        )


def _prefix_resident_while_running(m: TimeIndexedModel) -> None:
    """Rule 4: a stage's prefix is resident at every step it runs."""
    for v, s in enumerate(m.problem.stages):
        first = min(m.x[v])
        last = max(m.x[v]) + s.duration - 1
        for t in range(first, min(last, m.T - 1) + 1):
            m.lp += m.running(v, t) <= m.u[s.agent][t], f"resident_{v}_{t}"


def _kv_capacity(m: TimeIndexedModel) -> None:
    """Rule 6: held prefixes plus running stages fit in the KV budget at every step."""
    p = m.problem
    for t in range(m.T):
        m.lp += (
            pulp.lpSum(p.prefix[a] * m.h[a][t] for a in m.h)
            + pulp.lpSum(s.kv * m.running(v, t) for v, s in enumerate(p.stages))
            <= p.capacity,
            f"kv_{t}",
        )


def _max_running(m: TimeIndexedModel) -> None:
    """Rule 6: at most B stages run at a step (loads do not count)."""
    if m.problem.max_running is None:
        return
    for t in range(m.T):
        m.lp += (
            pulp.lpSum(m.running(v, t) for v in range(len(m.problem.stages)))
            <= m.problem.max_running,
            f"slots_{t}",
        )


def _set_hint(m: TimeIndexedModel, hint: OracleSolution) -> None:
    """MIP start from a feasible solution (CBC reads it with warmStart)."""
    for v, xs in m.x.items():
        for t, var in xs.items():
            var.setInitialValue(1 if hint.starts[v] == t else 0)
    for a in m.h:
        held = [0] * m.T
        starts = [0] * m.T
        ready = [0] * m.T
        for agent, load, end in hint.residency:
            if agent != a:
                continue
            starts[load] = 1
            for t in range(load, min(end, m.T)):
                held[t] = 1
                ready[t] = 1 if t >= load + m.problem.load[a] else 0
        for t in range(m.T):
            m.h[a][t].setInitialValue(held[t])
            m.z[a][t].setInitialValue(starts[t])
            m.u[a][t].setInitialValue(ready[t])
    for j, ids in enumerate(m.problem.task_stages):
        m.C[j].setInitialValue(max(hint.starts[v] + m.problem.stages[v].duration for v in ids))


def extract(m: TimeIndexedModel) -> OracleSolution:
    starts = {
        v: next(t for t, var in xs.items() if (var.value() or 0) > 0.5) for v, xs in m.x.items()
    }
    residency = []
    for a, h in m.h.items():
        t = 0
        while t < m.T:
            if (h[t].value() or 0) > 0.5:
                s = t
                while t < m.T and (h[t].value() or 0) > 0.5:
                    t += 1
                residency.append((a, s, t))
            else:
                t += 1
    return OracleSolution(starts, residency)


def solve_milp(
    problem: StepProblem,
    T: int,
    backend: str,
    time_limit: float,
    threads: int,
    upper_bound: int | None,
    hint: OracleSolution | None,
    log: bool = False,
) -> tuple[str, OracleSolution | None, int, dict]:
    """Build and solve the time-indexed MILP with CBC or HiGHS.

    Returns (status, solution or None, proven lower bound, stats).
    """
    t0 = time.perf_counter()
    m = build_milp(problem, T, upper_bound)
    stats: dict = {
        "variables": len(m.lp.variables()),
        "constraints": len(m.lp.constraints),
        "build_s": time.perf_counter() - t0,
    }
    if backend == "cbc":
        status, bound = _run_cbc(m, time_limit, threads, hint, log)
    else:
        status, bound = _run_highs(m, time_limit, threads, log)
    stats["solver_status"] = status
    if status == "infeasible":
        raise OracleError(
            f"{backend} reports the step model infeasible for {problem.instance.name!r}: a "
            "validated instance always has a serial schedule, so the formulation is wrong"
        )
    if status in ("optimal", "feasible"):
        sol = extract(m)
        return status, sol, math.ceil(bound - 1e-6), stats
    return "timeout", None, math.ceil(bound - 1e-6), stats


def _run_cbc(m, time_limit, threads, hint, log) -> tuple[str, float]:  # type: ignore[no-untyped-def]
    """CBC through PuLP. Its time limit is soft: CBC checks it between phases, so the root
    LP of a large model can overrun it. A CBC crash on the MIP start is retried without it."""
    if hint is not None:
        _set_hint(m, hint)
    try:
        text = _cbc_once(m, time_limit, threads, hint is not None)
    except pulp.PulpSolverError:
        if hint is None:
            raise OracleError("cbc failed to run on this model") from None
        text = _cbc_once(m, time_limit, threads, False)
    if log:
        print(text)
    return _cbc_status(m.lp, text)


def _cbc_once(m, time_limit, threads, warm: bool) -> str:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "cbc.log"
        with warnings.catch_warnings():  # PuLP 3 deprecates the bundled-CBC class name
            warnings.simplefilter("ignore", DeprecationWarning)
            solver = pulp.PULP_CBC_CMD(
                msg=False,
                timeLimit=max(1, math.ceil(time_limit)),
                threads=threads,
                warmStart=warm,
                logPath=str(log_path),
                keepFiles=False,
            )
            m.lp.solve(solver)
        return log_path.read_text() if log_path.exists() else ""


def _cbc_status(lp: pulp.LpProblem, text: str) -> tuple[str, float]:
    """The real CBC outcome from its log: PuLP calls a time-limited run 'Optimal'."""
    result = re.search(r"Result - (.*)", text)
    result_line = result.group(1).lower() if result else ""
    objective = pulp.value(lp.objective)
    bound_match = re.search(r"Lower bound:\s*(-?[\d.eE+-]+)", text)
    # the solver never sees the objective's constant (-sum of releases): add it back
    bound = float(bound_match.group(1)) + lp.objective.constant if bound_match else -math.inf
    if "infeasible" in result_line:
        return "infeasible", -math.inf
    if "optimal solution found" in result_line:
        return "optimal", float(objective)
    has_solution = lp.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if has_solution and objective is not None:
        return "feasible", bound if bound > -math.inf else 0.0
    return "timeout", bound if bound > -math.inf else 0.0


def _run_highs(m, time_limit, threads, log) -> tuple[str, float]:  # type: ignore[no-untyped-def]
    solver = pulp.HiGHS(msg=log, timeLimit=float(time_limit), threads=threads)
    m.lp.solve(solver)
    h = m.lp.solverModel
    status = h.getModelStatus()
    info = h.getInfo()
    name = h.modelStatusToString(status).lower()
    bound = float(info.mip_dual_bound) + m.lp.objective.constant  # the constant is not passed
    if "infeasible" in name:
        return "infeasible", -math.inf
    if name == "optimal":
        return "optimal", float(info.objective_function_value) + m.lp.objective.constant
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    if has_solution:
        return "feasible", bound if math.isfinite(bound) else 0.0
    return "timeout", bound if math.isfinite(bound) else 0.0
