"""What both oracle formulations share: the step-model data, bounds, horizon, results.

:class:`StepProblem` turns an :class:`~topas.instance.Instance` into the integer data of
the step model (DESIGN rules 1-2): release steps, stage durations, KV sizes, load
durations, and per-stage earliest starts from releases and critical paths.
:func:`horizon` bounds the steps any optimal schedule can use, from a feasible
objective. :class:`OracleSolution` is what a formulation hands back (stage starts and
prefix residency intervals, in steps); :func:`to_schedule` makes it a
:class:`~topas.schedule.Schedule`, so the objective is recomputed by
:func:`~topas.schedule.evaluate` and feasibility checked by
:func:`~topas.verify.verify_step`, without the solver.

Never imports the policies it judges: the feasible starting schedule comes from the
caller (``topas.oracle.solve`` runs the baselines).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from topas.errors import InputError
from topas.instance import HostLoad, Instance, StageRef, longest_tails
from topas.kv import step_need, step_peak_kv
from topas.schedule import (
    PrefixInterval,
    Schedule,
    ScheduleError,
    StageRun,
    evaluate,
    prefix_hits,
)
from topas.timing import StepTiming
from topas.verify import verify_step

STATUSES = ("optimal", "feasible", "timeout")


BACKENDS = ("cpsat", "cbc", "highs")
"""The exact solvers behind ``topas.oracle.solve`` (CP-SAT, and the MILP through
PuLP with CBC or HiGHS); the command line's choices come from here."""


class OracleError(RuntimeError):
    """The solver contradicted the model (e.g. 'infeasible' for a validated instance)."""


@dataclass(frozen=True)
class StepStage:
    """A stage in step units."""

    ref: StageRef
    task: int  # index into StepProblem.tasks
    agent: str
    duration: int  # d_v
    kv: int  # input + output tokens held while it runs
    deps: tuple[int, ...]  # indices into StepProblem.stages
    head: int  # longest chain of durations before it within its task
    tail: int  # d_v plus the longest chain of durations after it


@dataclass(frozen=True)
class StepProblem:
    """The integer data of the step model for one instance."""

    instance: Instance
    step_s: float
    capacity: int
    max_running: int | None
    releases: tuple[int, ...]  # per task, in steps
    stages: tuple[StepStage, ...]
    prefix: dict[str, int]  # agent -> p_a
    load: dict[str, int]  # agent -> l_a
    task_stages: tuple[tuple[int, ...], ...]  # per task, its stage indices
    host: bool = False  # host loads: one transfer at a time, [L, L + l_a) pairwise disjoint

    @classmethod
    def of(cls, instance: Instance) -> StepProblem:
        st = StepTiming.of(instance)
        index: dict[StageRef, int] = {}
        for t in instance.tasks:
            for s in t.stages:
                index[(t.id, s.id)] = len(index)
        stages: list[StepStage] = []
        task_stages = []
        for j, t in enumerate(instance.tasks):
            dur = {s.id: st.stage_steps(s.input_tokens, s.output_tokens) for s in t.stages}
            head: dict[str, int] = {}
            for sid in t.topo_order:
                deps = t.stage_by_id[sid].deps
                head[sid] = max((head[d] + dur[d] for d in deps), default=0)
            tail = longest_tails(t.topo_order, t.children.__getitem__, dur.__getitem__)
            ids = []
            for s in t.stages:
                ids.append(len(stages))
                stages.append(
                    StepStage(
                        ref=(t.id, s.id),
                        task=j,
                        agent=s.agent,
                        duration=dur[s.id],
                        kv=step_need(s.input_tokens, s.output_tokens),
                        deps=tuple(index[(t.id, d)] for d in s.deps),
                        head=head[s.id],
                        tail=tail[s.id],
                    )
                )
            task_stages.append(tuple(ids))
        return cls(
            instance=instance,
            step_s=st.step_s,
            capacity=instance.server.kv_capacity_tokens,
            max_running=instance.server.max_running,
            releases=tuple(st.release(t.arrival) for t in instance.tasks),
            stages=tuple(stages),
            prefix={a.id: a.prefix_tokens for a in instance.agents},
            load=dict(st.load_steps),
            task_stages=tuple(task_stages),
            host=isinstance(instance.server.prefix_load, HostLoad),
        )

    def earliest_start(self, v: int) -> int:
        """Release plus the chain of durations before ``v`` (a load may precede release)."""
        s = self.stages[v]
        return self.releases[s.task] + s.head

    def task_lower_bound(self, j: int) -> int:
        """A task's JCT is at least its critical path, plus the load of its first
        stage's prefix when the task is released at step 0 (nothing is resident then).
        It ignores the host channel, a further restriction, so it stays valid there."""
        ids = self.task_stages[j]
        cp = max(self.stages[v].tail for v in ids)
        if self.releases[j] == 0:
            roots = [v for v in ids if not self.stages[v].deps]
            cp = max(
                cp,
                min(self.load[self.stages[v].agent] + self.stages[v].tail for v in roots),
            )
        return cp

    def lower_bound(self) -> int:
        """Sum of the per-task bounds: a trivial bound on the objective."""
        return sum(self.task_lower_bound(j) for j in range(len(self.releases)))

    def used_agents(self) -> list[str]:
        return sorted({s.agent for s in self.stages})


def horizon(problem: StepProblem, upper_bound: int) -> int:
    """Steps ``0..T-1`` suffice for any schedule with objective <= ``upper_bound``.

    Task ``j`` ends by ``r_j + UB - sum_{i != j} LB_i``, since every other task takes at
    least its lower bound.
    """
    lbs = [problem.task_lower_bound(j) for j in range(len(problem.releases))]
    total = sum(lbs)
    return max(r + upper_bound - (total - lb) for r, lb in zip(problem.releases, lbs, strict=True))


@dataclass
class OracleSolution:
    """A formulation's answer in steps: stage starts and prefix residency intervals."""

    starts: dict[int, int]  # stage index -> start step
    residency: list[tuple[str, int, int]]  # (agent, load start, end) with end exclusive


@dataclass
class OracleResult:
    """What :func:`topas.oracle.solve` returns.

    ``status``: ``optimal`` (proved by the solver), ``feasible`` (a schedule, not proved
    optimal: ``lower_bound`` bounds the optimum) or ``timeout`` (no schedule found).
    ``objective`` and ``lower_bound`` are sums of JCTs in steps.
    """

    status: str
    objective: int | None
    lower_bound: int
    runtime: float
    schedule: Schedule | None
    backend: str = ""
    horizon: int = 0
    stats: dict[str, float | int | str] = field(default_factory=dict)

    @property
    def solver_gap(self) -> float | None:
        """The solver's relative gap between its objective and its bound (0 when proved
        optimal); not a policy's optimality gap (:mod:`topas.studies.gap`)."""
        if self.objective is None:
            return None
        return (self.objective - self.lower_bound) / max(1, self.objective)


def to_schedule(problem: StepProblem, sol: OracleSolution) -> Schedule:
    """The Schedule of a solution (stages are admitted at their start, as in rule 3)."""
    step = problem.step_s
    sched = Schedule(instance=problem.instance, timing="step", step_s=step)
    for agent, load_start, end in sol.residency:
        ready = load_start + problem.load[agent]
        sched.prefixes.append(
            PrefixInterval(agent, load_start * step, ready * step, max(end, ready) * step)
        )
    sched.prefixes.sort(key=lambda p: (p.load_start, p.agent))
    for v, s in enumerate(problem.stages):
        start = sol.starts[v]
        end = start + s.duration
        sched.runs.append(
            StageRun(s.ref[0], s.ref[1], s.agent, start * step, start * step, end * step)
        )
    sched.runs = [  # admitted at its start: a hit where the prefix is resident by then
        dataclasses.replace(run, prefix_hit=hit)
        for run, hit in zip(sched.runs, prefix_hits(sched), strict=True)
    ]
    sched.peak_kv_tokens = step_peak_kv(sched)
    return sched


def serial_solution(problem: StepProblem) -> OracleSolution:
    """One stage at a time in (release, topological) order, each with its own load: always
    feasible since every stage fits with its prefix (validation). Each load starts after
    the previous stage ends, so at most one load is in flight at any step: the transfers
    are disjoint, as the host channel requires."""
    t = 0
    starts: dict[int, int] = {}
    residency = []
    order = sorted(
        range(len(problem.stages)),
        key=lambda v: (
            problem.releases[problem.stages[v].task],
            problem.stages[v].task,
            problem.stages[v].head,
            v,
        ),
    )
    for v in order:
        s = problem.stages[v]
        load = max(t, problem.releases[s.task] - problem.load[s.agent], 0)
        start = max(load + problem.load[s.agent], problem.releases[s.task])
        starts[v] = start
        t = start + s.duration
        residency.append((s.agent, load, t))
    return OracleSolution(starts, residency)


def objective_of(problem: StepProblem, sol: OracleSolution) -> int:
    """Sum of JCTs in steps, by plain arithmetic."""
    total = 0
    for j, ids in enumerate(problem.task_stages):
        end = max(sol.starts[v] + problem.stages[v].duration for v in ids)
        total += end - problem.releases[j]
    return total


def verified(problem: StepProblem, sol: OracleSolution, what: str) -> tuple[Schedule, int]:
    """The schedule of ``sol``, checked by :func:`~topas.verify.verify_step`, and its sum of
    JCTs in steps recomputed by :func:`~topas.schedule.evaluate`, without the solver.
    Raises :class:`OracleError` naming ``what`` (the backend) if it breaks the step model."""
    schedule = to_schedule(problem, sol)
    try:
        verify_step(schedule)
    except ScheduleError as e:
        raise OracleError(f"{what}: the schedule breaks the step model: {e}") from e
    objective = evaluate(schedule).objective_steps
    assert objective is not None
    return schedule, objective


# --------------------------------------------------------------------------- start points


def warm_hint(problem: StepProblem, warm_start: Schedule) -> OracleSolution:
    """The warm start as a solution, checked by the independent step verifier before its
    objective bounds anything (an infeasible one would cut off the optimum)."""
    try:
        hint = solution_from_schedule(problem, warm_start)
        verify_step(to_schedule(problem, hint))
    except (ScheduleError, OracleError) as e:
        raise InputError(f"warm_start: not a feasible step-model schedule: {e}") from None
    return hint


def solution_from_schedule(problem: StepProblem, schedule: Schedule) -> OracleSolution:
    """A simulated step schedule as an oracle solution (final runs; KV from start only,
    so it stays feasible in the oracle's model, which charges less than rule 9). A load's
    start is its transfer's, ``resident_from - l_a`` (a host load queued behind another
    was requested earlier and held its KV from the request)."""
    if schedule.timing != "step":
        raise InputError("warm_start must be a step-model schedule")
    index = {s.ref: v for v, s in enumerate(problem.stages)}
    step = problem.step_s
    starts = {index[r.ref]: round(r.start / step) for r in schedule.completed().values()}
    residency = [
        (p.agent, round(p.resident_from / step) - problem.load[p.agent], round(p.end / step))
        for p in schedule.prefixes
    ]
    return trim_residency(problem, OracleSolution(starts, residency))


def trim_residency(problem: StepProblem, sol: OracleSolution) -> OracleSolution:
    """Drop residency intervals no stage uses and end each at its last use: the same
    objective, never more memory."""
    uses: dict[int, int] = {}
    for v, start in sol.starts.items():
        s = problem.stages[v]
        for k, (agent, load, end) in enumerate(sol.residency):
            if (
                agent == s.agent
                and load + problem.load[agent] <= start
                and start + s.duration <= end
            ):
                uses[k] = max(uses.get(k, 0), start + s.duration)
                break
        else:
            raise OracleError(
                f"stage {s.ref} starts at {start} outside every residency of {s.agent}"
            )
    kept = [(a, load, uses[k]) for k, (a, load, _) in enumerate(sol.residency) if k in uses]
    return OracleSolution(dict(sol.starts), sorted(kept, key=lambda x: (x[1], x[0])))
