"""Exact oracle, interval formulation: the step model (DESIGN rules 1-12) in OR-Tools CP-SAT.

Minimises the sum of task JCTs ``sum_j (C_j - r_j)`` in steps. Each constraint family
is built by its own function below, named as in ``docs/oracle_cpsat.md``:

- stage intervals ``[S_v, S_v + d_v)`` in tight windows (:func:`_add_stages`),
  precedence (:func:`_add_precedence`), task completions (:func:`_add_completions`);
- prefix *residency slots*: per agent ``a`` up to ``K_a = |V_a|`` optional intervals
  ``[L_k, E_k)`` holding ``p_a``, resident from ``R_k = L_k + l_a``
  (:func:`_add_slots`), ordered in time with the present ones first
  (:func:`_add_slot_order`); in host mode one transfer at a time
  (:func:`_add_host_channel`);
- every stage in exactly one present slot of its agent that covers it
  (:func:`_add_assignment`);
- KV capacity and ``max_running`` per step as cumulative constraints
  (:func:`_add_capacity`, :func:`_add_max_running`);
- symmetry breaking for identical stages of a task (:func:`_add_identical_stage_order`)
  and the objective with its lower and upper bounds (:func:`_add_objective`).

:func:`solve_cpsat` returns ``(status, solution, lower_bound, stats)`` as the solver found
them; :func:`topas.oracle.solve` verifies the solution (:func:`~topas.verify.verify_step`)
and recomputes its objective (:func:`~topas.schedule.evaluate`). The bounds it uses, the
hint's and the serial schedule's, are verified here before they bound anything.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from topas.oracle.problem import (
    OracleError,
    OracleSolution,
    StepProblem,
    horizon,
    objective_of,
    serial_solution,
    verified,
)

# --------------------------------------------------------------------------- static data


def earliest_starts(problem: StepProblem) -> list[int]:
    """``es_v``: release, deps' earliest ends, and ``l_a`` (nothing is resident at step 0,
    so a stage of agent ``a`` starts at ``l_a`` at the earliest)."""
    es = [0] * len(problem.stages)
    for ids in problem.task_stages:
        for v in _topo(problem, ids):
            s = problem.stages[v]
            es[v] = max(
                problem.earliest_start(v),
                problem.load[s.agent],
                max((es[d] + problem.stages[d].duration for d in s.deps), default=0),
            )
    return es


def task_lower_bounds(problem: StepProblem, es: list[int] | None = None) -> list[int]:
    """Per-task JCT bounds: ``max_v (es_v + tail_v) - r_j``, never below
    :meth:`StepProblem.task_lower_bound`."""
    es = earliest_starts(problem) if es is None else es
    out = []
    for j, ids in enumerate(problem.task_stages):
        own = max(es[v] + problem.stages[v].tail for v in ids) - problem.releases[j]
        out.append(max(own, problem.task_lower_bound(j)))
    return out


def _topo(problem: StepProblem, ids: tuple[int, ...]) -> list[int]:
    """The stages ``ids`` of one task in an order where deps come first."""
    done: set[int] = set()
    order: list[int] = []

    def visit(v: int) -> None:
        if v in done:
            return
        done.add(v)
        for d in problem.stages[v].deps:
            visit(d)
        order.append(v)

    for v in ids:
        visit(v)
    return order


def _descendants(problem: StepProblem) -> list[set[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for v, s in enumerate(problem.stages):
        for d in s.deps:
            children[d].append(v)
    out: list[set[int]] = [set() for _ in problem.stages]
    for ids in problem.task_stages:
        for v in reversed(_topo(problem, ids)):
            for c in children[v]:
                out[v].add(c)
                out[v] |= out[c]
    return out


def identical_groups(problem: StepProblem) -> list[list[int]]:
    """Groups (size >= 2) of interchangeable stages of one task: same agent, duration,
    KV, deps and children. Swapping two of them maps a schedule onto one of equal cost."""
    children: dict[int, set[int]] = defaultdict(set)
    for v, s in enumerate(problem.stages):
        for d in s.deps:
            children[d].add(v)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for v, s in enumerate(problem.stages):
        key = (
            s.task,
            s.agent,
            s.duration,
            s.kv,
            frozenset(s.deps),
            frozenset(children[v]),
        )
        groups[key].append(v)
    return [sorted(g) for g in groups.values() if len(g) > 1]


# --------------------------------------------------------------------------- the model


@dataclass
class Slot:
    """A residency slot ``k`` of agent ``a``: load start ``L``, resident from ``R``, end ``E``."""

    agent: str
    present: cp_model.IntVar
    load_start: cp_model.IntVar
    end: cp_model.IntVar
    interval: cp_model.IntervalVar


@dataclass
class Model:
    """The CP-SAT model and its variables, by the names of the formulation."""

    problem: StepProblem
    T: int  # horizon: every interval lies in [0, T)
    es: list[int]  # earliest starts
    deadline: list[int]  # per task, latest completion C_j
    task_lb: list[int]  # per task, JCT lower bound
    strengthen: bool = True  # add the valid strengthening (False: the plain formulation)
    cp: cp_model.CpModel = field(default_factory=cp_model.CpModel)
    S: list[cp_model.IntVar] = field(default_factory=list)  # stage starts
    stage_iv: list[cp_model.IntervalVar] = field(default_factory=list)
    C: list[cp_model.IntVar] = field(default_factory=list)  # task completions
    slots: dict[str, list[Slot]] = field(default_factory=dict)
    x: dict[int, dict[int, cp_model.IntVar]] = field(default_factory=dict)  # v -> k -> bool
    y: dict[int, cp_model.IntVar] = field(default_factory=dict)  # v -> its slot index
    objective: cp_model.LinearExpr | int = 0

    def agent_stages(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = defaultdict(list)
        for v, s in enumerate(self.problem.stages):
            out[s.agent].append(v)
        return out


def _add_stages(m: Model) -> None:
    """``S_v in [es_v, min(T, D_j) - tail_v]``; interval ``[S_v, S_v + d_v)``."""
    p = m.problem
    for v, s in enumerate(p.stages):
        hi = min(m.T, m.deadline[s.task]) - s.tail
        if hi < m.es[v]:
            raise OracleError(
                f"stage {s.ref}: empty start window [{m.es[v]}, {hi}] (horizon {m.T}); "
                "the upper bound is below a lower bound"
            )
        S = m.cp.new_int_var(m.es[v], hi, f"S[{v}]")
        m.S.append(S)
        m.stage_iv.append(m.cp.new_fixed_size_interval_var(S, s.duration, f"stage[{v}]"))


def _add_precedence(m: Model) -> None:
    """``S_v >= S_d + d_d`` for every dep ``d`` of ``v`` (rule 4)."""
    p = m.problem
    for v, s in enumerate(p.stages):
        for d in s.deps:
            m.cp.add(m.S[v] >= m.S[d] + p.stages[d].duration)


def _add_completions(m: Model) -> None:
    """``C_j = max_{v sink of j} (S_v + d_v)``, ``C_j in [r_j + LB_j, D_j]`` (rule 8)."""
    p = m.problem
    for j, ids in enumerate(p.task_stages):
        r = p.releases[j]
        C = m.cp.new_int_var(r + m.task_lb[j], m.deadline[j], f"C[{j}]")
        has_child = {d for v in ids for d in p.stages[v].deps}
        sinks = [v for v in ids if v not in has_child]
        m.cp.add_max_equality(C, [m.S[v] + p.stages[v].duration for v in sinks])
        m.C.append(C)


def _add_slots(m: Model) -> None:
    """Per agent ``a``, ``K_a = |V_a|`` optional slots: presence ``P_k``, load start
    ``L_k``, end ``E_k >= R_k = L_k + l_a``; the interval ``[L_k, E_k)`` holds ``p_a``.
    ``K_a = |V_a|`` is always enough: a slot without stages can be dropped."""
    p = m.problem
    for a, vs in m.agent_stages().items():
        la = p.load[a]
        dmin = min(p.stages[v].duration for v in vs)
        # canonically a load starts l_a before its slot's first use, so L >= min es - l_a;
        # with the host channel a load may have to start earlier (the channel is busy
        # later) and only L >= 0 holds
        lo_l = max(0, min(m.es[v] for v in vs) - la) if m.strengthen and not p.host else 0
        hi_e = max(min(m.T, m.deadline[p.stages[v].task]) for v in vs)
        slots = []
        for k in range(len(vs)):
            P = m.cp.new_bool_var(f"P[{a},{k}]")
            L = m.cp.new_int_var(lo_l, hi_e - la - dmin, f"L[{a},{k}]")
            E = m.cp.new_int_var(lo_l + la + dmin, hi_e, f"E[{a},{k}]")
            size = m.cp.new_int_var(la + dmin, hi_e - lo_l, f"len[{a},{k}]")
            iv = m.cp.new_optional_interval_var(L, size, E, P, f"slot[{a},{k}]")
            # an absent slot is pinned, so the search never branches on it
            m.cp.add(L == lo_l).only_enforce_if(~P)
            m.cp.add(E == lo_l + la + dmin).only_enforce_if(~P)
            slots.append(Slot(a, P, L, E, iv))
        m.slots[a] = slots


def _add_slot_order(m: Model) -> None:
    """Slots of an agent never overlap; present slots come first and in time order:
    ``P_{k+1} => P_k`` and ``P_{k+1} => L_{k+1} >= E_k``."""
    for slots in m.slots.values():
        m.cp.add_no_overlap([s.interval for s in slots])
        for a, b in zip(slots, slots[1:], strict=False):
            m.cp.add_implication(b.present, a.present)
            m.cp.add(b.load_start >= a.end).only_enforce_if(b.present)


def _add_host_channel(m: Model) -> None:
    """Host mode: one transfer at a time. ``NoOverlap`` of the optional transfer intervals
    ``[L_k, L_k + l_a)`` (present with ``P_k``) of every agent's slots."""
    p = m.problem
    if not p.host:
        return
    transfers = []
    for a, slots in m.slots.items():
        for k, sl in enumerate(slots):
            transfers.append(
                m.cp.new_optional_fixed_size_interval_var(
                    sl.load_start, p.load[a], sl.present, f"transfer[{a},{k}]"
                )
            )
    m.cp.add_no_overlap(transfers)


def _add_assignment(m: Model) -> None:
    """Each stage ``v`` of agent ``a`` lies in exactly one present slot ``k`` of ``a``:
    ``x_vk => P_k``, ``x_vk => L_k + l_a <= S_v``, ``x_vk => S_v + d_v <= E_k`` (rule 4);
    a present slot holds at least one stage. Slot index ``y_v = sum_k k x_vk``; slots
    being ordered in time, ``y_w <= y_v`` when ``w`` precedes ``v`` (same agent), and
    ``y_v`` is at most the number of other stages of ``a`` that are not descendants of
    ``v`` (every earlier slot holds one of them)."""
    p = m.problem
    desc = _descendants(p)
    for a, vs in m.agent_stages().items():
        la = p.load[a]
        slots = m.slots[a]
        members: dict[int, list[cp_model.IntVar]] = defaultdict(list)
        for v in vs:
            d = p.stages[v].duration
            others = len(vs) - 1
            if m.strengthen:
                others = sum(1 for w in vs if w != v and w not in desc[v])
            row: dict[int, cp_model.IntVar] = {}
            for k, sl in enumerate(slots):
                if k > others:
                    break
                x = m.cp.new_bool_var(f"x[{v},{k}]")
                m.cp.add_implication(x, sl.present)
                m.cp.add(sl.load_start + la <= m.S[v]).only_enforce_if(x)
                m.cp.add(m.S[v] + d <= sl.end).only_enforce_if(x)
                row[k] = x
                members[k].append(x)
            m.cp.add_exactly_one(row.values())
            m.x[v] = row
            if m.strengthen:
                m.y[v] = m.cp.new_int_var(0, max(row), f"y[{v}]")
                m.cp.add(m.y[v] == sum(k * x for k, x in row.items()))
        if not m.strengthen:
            continue
        for k, sl in enumerate(slots):
            m.cp.add_bool_or(members[k]).only_enforce_if(sl.present)
        for v in vs:
            for w in vs:
                if v in desc[w]:
                    m.cp.add(m.y[w] <= m.y[v])


def _add_capacity(m: Model) -> None:
    """Rule 6: per step, running stages' KV plus loading or resident prefixes ``<= M``."""
    p = m.problem
    ivs = list(m.stage_iv)
    demands = [s.kv for s in p.stages]
    for a, slots in m.slots.items():
        for sl in slots:
            ivs.append(sl.interval)
            demands.append(p.prefix[a])
    m.cp.add_cumulative(ivs, demands, p.capacity)


def _add_max_running(m: Model) -> None:
    """Rule 6: per step, running stages ``<= B`` (loads do not count)."""
    B = m.problem.max_running
    if B is None or B >= len(m.stage_iv):
        return
    if B == 1:
        m.cp.add_no_overlap(m.stage_iv)
    else:
        m.cp.add_cumulative(m.stage_iv, [1] * len(m.stage_iv), B)


def _add_identical_stage_order(m: Model) -> None:
    """Interchangeable stages of a task start in index order: ``S_v <= S_w`` for
    ``v < w`` in one :func:`identical_groups` group (and so ``y_v <= y_w``)."""
    for g in identical_groups(m.problem):
        for v, w in zip(g, g[1:], strict=False):
            m.cp.add(m.S[v] <= m.S[w])
            m.cp.add(m.y[v] <= m.y[w])


def _add_objective(m: Model, upper_bound: int | None) -> None:
    """``min sum_j (C_j - r_j)``, with ``sum_j LB_j <= objective <= UB``."""
    p = m.problem
    obj = sum(m.C) - sum(p.releases)
    m.cp.add(obj >= sum(m.task_lb))
    if upper_bound is not None:
        m.cp.add(obj <= upper_bound)
    m.objective = obj
    m.cp.minimize(obj)


def build_model(problem: StepProblem, upper_bound: int, strengthen: bool = True) -> Model:
    """The whole model, for schedules of objective ``<= upper_bound`` (a proven bound).

    ``strengthen=False`` leaves out every valid strengthening (tight windows, per-task
    bounds and deadlines, slot-index reasoning, symmetry breaking): the plain
    formulation, kept to check that the strengthening never cuts off an optimum.
    """
    if strengthen:
        es = earliest_starts(problem)
        lbs = task_lower_bounds(problem, es)
    else:
        es = [problem.earliest_start(v) for v in range(len(problem.stages))]
        lbs = [0] * len(problem.releases)
    T = horizon(problem, upper_bound)
    # task j ends by r_j + UB - sum_{i != j} LB_i (the others take at least their bound)
    total = sum(lbs)
    deadline = [
        min(T, r + upper_bound - (total - lb)) if strengthen else T
        for r, lb in zip(problem.releases, lbs, strict=True)
    ]
    T = max(deadline)
    m = Model(problem=problem, T=T, es=es, deadline=deadline, task_lb=lbs, strengthen=strengthen)
    _add_stages(m)
    _add_precedence(m)
    _add_completions(m)
    _add_slots(m)
    _add_slot_order(m)
    _add_host_channel(m)
    _add_assignment(m)
    _add_capacity(m)
    _add_max_running(m)
    if strengthen:
        _add_identical_stage_order(m)
    _add_objective(m, upper_bound)
    return m


# --------------------------------------------------------------------------- hints, output


def canonical_form(problem: StepProblem, sol: OracleSolution) -> OracleSolution:
    """The same schedule in the model's canonical form: identical stages in index order,
    every residency interval shrunk to ``[min S - l_a, max E)`` of the stages it serves,
    unused intervals dropped. Never worse: it only frees memory. In host mode the load
    start stays (a later transfer could collide with another); only the end shrinks."""
    starts = dict(sol.starts)
    for g in identical_groups(problem):
        for v, t in zip(g, sorted(starts[v] for v in g), strict=True):
            starts[v] = t
    by_agent: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for a, L, E in sol.residency:
        by_agent[a].append((L, E))
    residency = []
    for a, ivs in by_agent.items():
        la = problem.load[a]
        for L, E in sorted(ivs):
            served = [
                (starts[v], starts[v] + s.duration)
                for v, s in enumerate(problem.stages)
                if s.agent == a and L + la <= starts[v] and starts[v] + s.duration <= E
            ]
            if served:
                start = L if problem.host else min(b for b, _ in served) - la
                residency.append((a, start, max(e for _, e in served)))
    residency.sort(key=lambda r: (r[0], r[1]))
    return OracleSolution(starts=starts, residency=residency)


def _slot_of(problem: StepProblem, sol: OracleSolution) -> dict[int, int]:
    """Stage -> index of its agent's (time-ordered) residency interval covering it."""
    by_agent: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for a, L, E in sol.residency:
        by_agent[a].append((L, E))
    out = {}
    for v, s in enumerate(problem.stages):
        ivs = sorted(by_agent[s.agent])
        S = sol.starts[v]
        for k, (L, E) in enumerate(ivs):
            if L + problem.load[s.agent] <= S and S + s.duration <= E:
                out[v] = k
                break
    return out


def _add_hint(m: Model, sol: OracleSolution) -> None:
    """Hint every variable from a feasible solution in canonical form."""
    p = m.problem
    slot_of = _slot_of(p, sol)
    by_agent: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for a, L, E in sol.residency:
        by_agent[a].append((L, E))
    for v in range(len(p.stages)):
        m.cp.add_hint(m.S[v], sol.starts[v])
        k = slot_of.get(v, -1)
        for kk, x in m.x[v].items():
            m.cp.add_hint(x, kk == k)
        if k >= 0 and v in m.y:
            m.cp.add_hint(m.y[v], k)
    for j, ids in enumerate(p.task_stages):
        m.cp.add_hint(m.C[j], max(sol.starts[v] + p.stages[v].duration for v in ids))
    for a, slots in m.slots.items():
        ivs = sorted(by_agent[a])
        for k, sl in enumerate(slots):
            m.cp.add_hint(sl.present, k < len(ivs))
            if k < len(ivs):
                m.cp.add_hint(sl.load_start, ivs[k][0])
                m.cp.add_hint(sl.end, ivs[k][1])


def _extract(m: Model, solver: cp_model.CpSolver) -> OracleSolution:
    p = m.problem
    starts = {v: int(solver.value(m.S[v])) for v in range(len(p.stages))}
    residency = []
    for a, slots in m.slots.items():
        la = p.load[a]
        for k, sl in enumerate(slots):
            if not solver.boolean_value(sl.present):
                continue
            served = [
                v
                for v, row in m.x.items()
                if p.stages[v].agent == a and k in row and solver.boolean_value(row[k])
            ]
            if not served:  # cannot happen: a present slot holds a stage
                continue
            # shrink to the stages it serves (the solver may leave E_k or L_k loose); in
            # host mode L_k stays: it is the transfer's slot on the channel
            if p.host:
                L = int(solver.value(sl.load_start))
            else:
                L = min(starts[v] for v in served) - la
            E = max(starts[v] + p.stages[v].duration for v in served)
            residency.append((a, L, E))
    residency.sort(key=lambda r: (r[0], r[1]))
    return OracleSolution(starts=starts, residency=residency)


# --------------------------------------------------------------------------- solve

_STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible"}

DUAL_WORKERS = ("default_lp", "core")
"""The two full CP-SAT subsolvers used when ``threads == 2``."""


def solve_cpsat(
    problem: StepProblem,
    time_limit: float,
    threads: int = 2,
    upper_bound: int | None = None,
    hint: OracleSolution | None = None,
    log: bool = False,
    *,
    params: dict | None = None,
    strengthen: bool = True,
) -> tuple[str, OracleSolution | None, int, dict]:
    """Minimise the sum of JCTs (steps) of ``problem`` with CP-SAT.

    Returns ``(status, solution, lower_bound, stats)``: ``status`` is ``optimal``,
    ``feasible`` (a schedule, not proved optimal) or ``timeout`` (no schedule);
    ``lower_bound`` is the best proven bound on the optimum (``<=`` the objective).
    ``upper_bound`` (a proven bound, e.g. a baseline's objective) caps the objective and
    sets the horizon; without it the bound is the better of a valid ``hint`` and
    :func:`serial_solution`. ``hint`` is a feasible solution given to CP-SAT as a hint;
    if the solver finds nothing in time, a valid hint is returned as ``feasible``. The
    returned solution is the solver's, unverified: :func:`topas.oracle.solve` checks it.
    ``params`` are extra CP-SAT parameters (a list replaces a repeated field);
    ``strengthen=False`` solves the plain formulation (see :func:`build_model`).

    Raises :class:`OracleError` when CP-SAT calls the model infeasible or invalid: a
    validated instance always has a serial schedule, so the model would be wrong.
    """
    t0 = time.perf_counter()
    hint_sol = hint_obj = None
    if hint is not None:
        try:
            hint_sol = canonical_form(problem, hint)
            hint_obj = verified(problem, hint_sol, "hint")[1]
        except (OracleError, KeyError) as e:  # a broken hint is only ignored
            hint_sol = hint_obj = None
            hint_error = str(e)
        else:
            hint_error = ""
    serial = canonical_form(problem, serial_solution(problem))
    serial_obj = verified(problem, serial, "serial")[1]
    if serial_obj != objective_of(problem, serial):
        raise OracleError(
            f"serial schedule: objective {objective_of(problem, serial)} but "
            f"evaluate() gives {serial_obj}"
        )
    # every proven bound caps the objective and shrinks the horizon
    ub = min(b for b in (upper_bound, serial_obj, hint_obj) if b is not None)
    if ub < problem.lower_bound():
        raise OracleError(
            f"upper bound {ub} is below the trivial lower bound {problem.lower_bound()}"
        )
    m = build_model(problem, ub, strengthen=strengthen)
    if hint_sol is not None and hint_obj is not None and hint_obj <= ub:
        _add_hint(m, hint_sol)
    elif serial_obj <= ub:
        _add_hint(m, serial)
    build_s = time.perf_counter() - t0

    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.max_time_in_seconds = max(0.0, float(time_limit))
    prm.num_workers = max(1, int(threads))
    prm.log_search_progress = log
    prm.random_seed = 0
    if prm.num_workers == 2:
        # measured (docs/oracle_cpsat.md): on two threads, CP-SAT's default search beside
        # its core-based objective search proves more than the default portfolio
        # (one full search plus interleaved LNS), and its lower bounds are far better
        prm.subsolvers.extend(DUAL_WORKERS)
        prm.num_full_subsolvers = 2
    for k, v in (params or {}).items():
        if isinstance(v, list | tuple):  # a repeated field: replaced
            del getattr(prm, k)[:]
            getattr(prm, k).extend(v)
        else:
            setattr(prm, k, v)
    code = solver.solve(m.cp)
    name = solver.status_name(code)
    proto = m.cp.proto
    stats: dict = {
        "backend": "cpsat",
        "solver_status": name,
        "horizon": m.T,
        "upper_bound": ub,
        "num_variables": len(proto.variables),
        "num_constraints": len(proto.constraints),
        "num_slots": sum(len(s) for s in m.slots.values()),
        "build_s": build_s,
        "solver_wall_s": solver.wall_time,
        "branches": solver.num_branches,
        "conflicts": solver.num_conflicts,
        "solution_source": "solver",
    }
    if hint is not None:
        stats["hint_objective"] = hint_obj if hint_obj is not None else "invalid"
        if hint_obj is None:
            stats["hint_error"] = hint_error
    if code in (cp_model.INFEASIBLE, cp_model.MODEL_INVALID):
        detail = m.cp.validate() if code == cp_model.MODEL_INVALID else ""
        raise OracleError(
            f"CP-SAT says {name} for instance {problem.instance.name!r} with upper bound "
            f"{ub} (horizon {m.T}): a validated instance always has a serial schedule, so "
            f"the interval model is wrong. {detail}"
        )
    trivial_lb = max(problem.lower_bound(), sum(m.task_lb))
    bound = solver.best_objective_bound
    lb = trivial_lb
    if math.isfinite(bound):
        lb = max(lb, math.ceil(bound - 1e-6))
    if code in _STATUS:
        sol = _extract(m, solver)
        obj = int(round(solver.objective_value))  # topas.oracle.solve checks it
        status = _STATUS[code]
        if status == "optimal":
            lb = obj
        lb = min(lb, obj)
        stats["objective"] = obj
        stats["lower_bound"] = lb
        return status, sol, lb, stats
    # UNKNOWN: the solver found nothing in time
    if hint_sol is not None and hint_obj is not None:
        stats["solution_source"] = "hint"
        stats["objective"] = hint_obj
        lb = min(lb, hint_obj)
        stats["lower_bound"] = lb
        return "feasible", hint_sol, lb, stats
    stats["lower_bound"] = lb
    return "timeout", None, lb, stats
