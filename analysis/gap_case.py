"""One instance of the optimality-gap study, a policy's schedule beside the oracle's.

Where ``python analysis/optimality_gap.py`` reports a large gap, this shows why: the
instance (KV budget, prompts, stages), then the policy's step-model schedule and the
proven optimum's, step by step (admission, start and end of every stage; when each prompt
was loaded, resident and evicted), and each task's JCT under both. The instance is the
study's own: pick ``family``, ``tasks`` and ``instance_seed`` from a row of its
``runs.csv``.

    python analysis/gap_case.py chain --tasks 4 --instance-seed 4000 [--policy topas]
        [--backend cpsat] [--time-limit 30] [--profile NAME] [--plot case.png]

Prints text; ``--plot`` also draws both schedules (a Gantt chart per schedule: the
tasks' stage runs and the prompts' residency, one colour per agent) to a PNG, written
atomically. Exit status 2 with one line on bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex  # noqa: E402

from topas.errors import InputError
from topas.instance import Instance, StageRef, write_atomic
from topas.oracle import solve
from topas.oracle.problem import BACKENDS
from topas.policies import make_policy
from topas.runs import policy_objectives
from topas.schedule import Metrics, Schedule, StageRun, evaluate
from topas.workloads import small_instance


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family", help="a workload family (see `topas workloads`)")
    ap.add_argument("--tasks", type=int, required=True, help="tasks in the instance")
    ap.add_argument("--instance-seed", type=int, required=True, help="runs.csv's instance_seed")
    ap.add_argument("--policy", default="topas", help="policy spec (default topas)")
    ap.add_argument("--backend", choices=BACKENDS, default="cpsat")
    ap.add_argument("--time-limit", type=float, default=30.0, help="oracle seconds")
    ap.add_argument("--profile", default=None, help="the study's --profile, if it had one")
    ap.add_argument(
        "--plot", default=None, metavar="PNG", help="also draw both schedules to this PNG file"
    )
    return ap


def describe(inst: Instance) -> list[str]:
    """The instance in a few lines: budget, prompts, tasks and their stages."""
    lines = [
        f"instance {inst.name}: KV budget {inst.server.kv_capacity_tokens} tokens, "
        f"prefill chunk {inst.server.chunk_tokens}, prompt moves: "
        f"{inst.server.prefix_load.kind}",
        "prompts: " + ", ".join(f"{a.id} {a.prefix_tokens}" for a in inst.agents),
    ]
    for t in inst.tasks:
        stages = "; ".join(
            f"{s.id} {s.agent} in {s.input_tokens} out {s.output_tokens}"
            + (f" after {','.join(s.deps)}" if s.deps else "")
            for s in t.stages
        )
        lines.append(f"task {t.id} arrives {t.arrival:g}: {stages}")
    return lines


def timeline(title: str, sched: Schedule, m: Metrics) -> list[str]:
    """A schedule's stage runs (by admission) and prompt intervals (by load; ``until``: its
    eviction, or the end of the schedule); ``m``: its metrics."""
    lines = [f"== {title}: sum of JCTs {m.objective_steps} steps"]
    for r in sorted(sched.runs, key=lambda r: (r.admit, r.task, r.stage)):
        notes = ("preempted " if r.preempted else "") + ("hit" if r.prefix_hit else "")
        lines.append(
            f"  {r.task}/{r.stage:4s} {r.agent:8s} admit {r.admit:4.0f}  start {r.start:4.0f}"
            f"  end {r.end:4.0f}  {notes}".rstrip()
        )
    for p in sorted(sched.prefixes, key=lambda p: (p.load_start, p.agent)):
        unused = "  (evicted as it became resident)" if p.end <= p.resident_from else ""
        lines.append(
            f"  prompt {p.agent:8s} load {p.load_start:4.0f}  resident {p.resident_from:4.0f}"
            f"  until {p.end:4.0f}{unused}"
        )
    return lines


def draw(panels: Sequence[tuple[str, Schedule]], inst: Instance) -> bytes:
    """Both schedules as PNG bytes, one panel each on a shared step axis: per task a row of
    its stage runs (from start to end; the wait for the prompt from admission to start,
    light; a preempted run hatched), per agent a row of its prompt's residency (the load
    light), every agent in its own colour."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    agents = [a.id for a in inst.agents]
    colour = {a: f"C{i % 10}" for i, a in enumerate(agents)}
    rows = [t.id for t in inst.tasks] + [f"prompt {a}" for a in agents]
    y = {name: len(rows) - 1 - i for i, name in enumerate(rows)}
    fig = Figure(figsize=(10, 1.2 + 0.32 * len(rows) * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (title, sched) in zip(axes, panels, strict=True):
        lane, lanes = _lanes(sched.runs)
        for r in sched.runs:
            c, k = colour[r.agent], lanes[r.task]
            h = 0.7 / k  # overlapping runs of one task share its row, one lane each
            low = y[r.task] - 0.35 + h * lane[r.ref]
            if r.start > r.admit:
                ax.broken_barh([(r.admit, r.start - r.admit)], (low, h), color=c, alpha=0.25)
            ax.broken_barh(
                [(r.start, r.end - r.start)],
                (low, h),
                color=c,
                edgecolor="black",
                lw=0.5,
                hatch="//" if r.preempted else None,
            )
            mid = ((r.start + r.end) / 2, low + h / 2)
            ax.text(*mid, r.stage, ha="center", va="center", fontsize=6 if k < 3 else 5)
        for p in sched.prefixes:
            row, c = y[f"prompt {p.agent}"], colour[p.agent]
            ax.broken_barh(
                [(p.load_start, p.resident_from - p.load_start)],
                (row - 0.3, 0.6),
                color=c,
                alpha=0.25,
            )
            ax.broken_barh([(p.resident_from, p.end - p.resident_from)], (row - 0.3, 0.6), color=c)
        ax.set_yticks(range(len(rows)), list(reversed(rows)), fontsize=7)
        ax.set_title(title, fontsize="medium", loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("step")
    fig.legend(
        handles=[Patch(color=colour[a], label=a) for a in agents],
        loc="outside right upper",
        fontsize="small",
    )
    return ex.figure_png(fig)


def _lanes(runs: Sequence[StageRun]) -> tuple[dict[StageRef, int], dict[str, int]]:
    """A lane per run within its task's row (the first whose last run ended by its
    admission; runs in admission order) and the lanes each task needs."""
    lane: dict[StageRef, int] = {}
    ends: dict[str, list[float]] = {}
    for r in sorted(runs, key=lambda r: (r.admit, r.stage)):
        free = ends.setdefault(r.task, [])
        i = next((i for i, e in enumerate(free) if e <= r.admit), len(free))
        if i == len(free):
            free.append(r.end)
        else:
            free[i] = r.end
        lane[r.ref] = i
    return lane, {tid: max(1, len(e)) for tid, e in ends.items()}


def jct_table(policy: str, ours: Metrics, best: Metrics) -> list[str]:
    a, b = ours.jct, best.jct
    lines = [f"task  {policy}  optimum  difference"]
    for tid in a:
        lines.append(f"{tid:5s} {a[tid]:6.0f}  {b[tid]:7.0f}  {a[tid] - b[tid]:+10.0f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.tasks < 1:
            raise InputError(f"--tasks: expected at least 1, got {args.tasks}")
        if args.time_limit <= 0:
            raise InputError(f"--time-limit: expected seconds > 0, got {args.time_limit:g}")
        inst = small_instance(
            args.family, seed=args.instance_seed, num_tasks=args.tasks, profile=args.profile
        )
        make_policy(args.policy)  # a bad spec: one line, before anything runs
        if args.plot is not None and not args.plot.endswith(".png"):
            raise InputError(f"--plot: a .png file expected, got {args.plot!r}")
    except (InputError, ValueError) as e:
        print(f"gap_case: error: {e}", file=sys.stderr)
        return 2
    _, ours = policy_objectives(inst, [args.policy], seed=args.instance_seed)[args.policy]
    result = solve(  # one thread, as the study solves: the same optimum found every run
        inst, backend=args.backend, time_limit=args.time_limit, threads=1, warm_start=ours
    )
    mine = evaluate(ours)
    lines = describe(inst) + [""] + timeline(args.policy, ours, mine) + [""]
    panels = [(f"{args.policy}: sum of JCTs {mine.objective_steps} steps", ours)]
    if result.schedule is None:
        lines.append(f"oracle ({args.backend}): {result.status}, no schedule")
    else:
        if result.status == "optimal":
            label = "proven optimal"
        else:
            label = f"{result.status}, lower bound {result.lower_bound}"
        best = evaluate(result.schedule)
        lines += timeline(f"oracle ({args.backend}, {label})", result.schedule, best)
        lines += [""] + jct_table(args.policy, mine, best)
        title = f"oracle ({args.backend}, {label}): sum of JCTs {best.objective_steps} steps"
        panels.append((title, result.schedule))
    if args.plot is not None:
        try:
            write_atomic(args.plot, draw(panels, inst))
        except OSError as e:
            print(f"gap_case: error: --plot: {e}", file=sys.stderr)
            return 2
        lines += ["", f"wrote {args.plot}"]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
