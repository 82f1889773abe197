"""JCT by task size: which tasks pay for a policy's mean JCT.

For every workload, load factor and seed one instance is generated and simulated under
every policy with the calibrated timing model (the instances of
``analysis/compare_policies.py``). Each instance's tasks are ranked by their demand
(``topas.workloads.task_demand_s``: server-seconds at the best throughput, with the
decode regime of the whole instance; ties by task id) and split into ``--groups`` groups
of equal size (the first groups one task larger where the count does not divide), the
smallest tasks first. A run's row holds each group's mean JCT and mean demand beside the
run's mean and p99 JCT. The summary gives, per (workload, load), each policy's mean JCT
per group (mean over seeds), so a mean that lies between two policies' can be traced to
the tasks that pay for it; jct_by_size.png draws the same.

    python analysis/jct_by_size.py [--workloads metagpt-tl] [--loads 1.2] [--seeds 5 |
        --seeds 20,23] [--tasks 200] [--groups 4] [--policies spf,parrot-fcfs,lpm,topas,
        topas-greedy] [--tuning] [--jobs N] [--out results/jct_by_size] [--no-progress]
        [--resume]

``--seeds N`` means the first N reporting seeds (20, 21, ...); tuning seeds are refused
unless ``--tuning``. Writes OUT/{config.json, runs.csv, summary.md, jct_by_size.png}
(each file atomically, after every run has finished) and prints summary.md. Bad input:
one ``error: ...`` line on stderr, exit status 2, nothing created.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_policies as cp  # noqa: E402
import experiments as ex  # noqa: E402

from topas.instance import Instance  # noqa: E402
from topas.schedule import evaluate  # noqa: E402
from topas.studies import md_table  # noqa: E402
from topas.workloads import decode_regime, task_demand_s  # noqa: E402

DEFAULT_POLICIES = "spf,parrot-fcfs,lpm,topas,topas-greedy"


def build_parser() -> ex.Parser:
    ap = ex.Parser(description=__doc__.splitlines()[0])
    ex.add_grid_options(
        ap,
        workloads="metagpt-tl",
        loads="1.2",
        policies=DEFAULT_POLICIES,
        out="results/jct_by_size",
    )
    ap.add_argument("--groups", default="4", help="task-size groups per instance")
    return ap


def config_from_args(args: Any) -> dict[str, Any]:
    """Validated parameters (raises :class:`experiments.CliError`)."""
    cfg = ex.grid_config(args)
    cfg["groups"] = ex.parse_positive_int(args.groups, "--groups")
    cfg["kv_scale"] = 1.0  # compare_policies' jobs: the default budget
    if cfg["groups"] > cfg["tasks"]:
        raise ex.CliError(f"--groups: {cfg['groups']} groups of {cfg['tasks']} tasks")
    ex.check_instances(
        cfg["workloads"], cfg["seeds"], cfg["loads"][0], cfg["tasks"], cfg["kv_scale"]
    )
    return cfg


def make_jobs(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """compare_policies' runs (the same instances), each with the number of groups."""
    return [{**job, "groups": cfg["groups"]} for job in cp.make_jobs(cfg)]


# --------------------------------------------------------------------------- one run


def task_demands(inst: Instance) -> dict[str, float]:
    """Each task's demand (:func:`topas.workloads.task_demand_s`) with the decode regime of
    the whole instance, as the load factor's rate uses it."""
    agents = {a.id: a for a in inst.agents}
    regime = decode_regime([s for t in inst.tasks for s in t.stages], agents, inst.server)
    return {t.id: task_demand_s(t, agents, inst.server, regime) for t in inst.tasks}


def size_groups(demand: Mapping[str, float], groups: int) -> list[list[str]]:
    """Task ids by demand, smallest first (ties by id), in ``groups`` groups of equal size
    (``numpy.array_split``: the first ones a task larger where it does not divide)."""
    ranked = sorted(demand, key=lambda tid: (demand[tid], tid))
    return [list(part) for part in np.array_split(np.array(ranked, dtype=object), groups)]


def run_sized(job: Mapping[str, Any]) -> dict[str, Any]:
    """One run's row: the point, its mean and p99 JCT, and per size group ``i`` (1: the
    smallest tasks) its tasks' mean JCT ``g{i}_jct`` and mean demand ``g{i}_demand_s``."""
    start = time.perf_counter()
    inst, schedule = ex.simulate_point(**{k: v for k, v in job.items() if k != "groups"})
    metrics = evaluate(schedule)
    row: dict[str, Any] = {
        "workload": job["workload"],
        "load": job["load"],
        "seed": job["seed"],
        "policy": job["spec"],
        "num_tasks": job["num_tasks"],
        "kv_capacity_tokens": inst.server.kv_capacity_tokens,
        "mean_jct": metrics.mean_jct,
        "p99_jct": metrics.p99_jct,
    }
    demand = task_demands(inst)
    for i, part in enumerate(size_groups(demand, job["groups"]), start=1):
        row[f"g{i}_jct"] = float(np.mean([metrics.jct[tid] for tid in part]))
        row[f"g{i}_demand_s"] = float(np.mean([demand[tid] for tid in part]))
    row["runtime_s"] = time.perf_counter() - start
    return row


# --------------------------------------------------------------------------- summary


def group_means(
    rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], workload: str, load: float, spec: str
) -> list[float]:
    """``spec``'s mean JCT per size group at one point, each a mean over the seeds."""
    point = ex.select(rows, workload=workload, load=load, policy=spec)
    return [ex.mean_of(point, f"g{i}_jct") for i in range(1, cfg["groups"] + 1)]


def point_table(
    rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], w: str, load: float
) -> str:
    k = cfg["groups"]
    header = ["policy", *(f"group {i}" for i in range(1, k + 1)), "all tasks", "p99"]
    body = []
    for spec in cfg["policies"]:
        point = ex.select(rows, workload=w, load=load, policy=spec)
        cells = [ex.fmt_s(x) for x in group_means(rows, cfg, w, load, spec)]
        body.append(
            [
                f"`{spec}`",
                *cells,
                ex.fmt_s(ex.mean_of(point, "mean_jct")),
                ex.fmt_s(ex.mean_of(point, "p99_jct")),
            ]
        )
    first = ex.select(rows, workload=w, load=load, policy=cfg["policies"][0])
    demand = ", ".join(f"{ex.mean_of(first, f'g{i}_demand_s'):.2f}" for i in range(1, k + 1))
    return md_table(header, body) + f"\n\nMean demand per group (server-seconds): {demand}.\n"


def summarize(
    rows: list[dict[str, Any]], cfg: Mapping[str, Any], command: str, wall_s: float
) -> str:
    k = cfg["groups"]
    lines = [
        "# JCT by task size",
        "",
        f"Command: `{command}`",
        "",
        f"Calibrated timing; {cfg['tasks']} tasks per instance; seeds "
        f"{ex.fmt_list(cfg['seeds'])} (the same instances for every policy). "
        + ex.runtime_line(rows, wall_s, cfg["jobs"]),
        *ex.tuning_lines(cfg),
        "",
        f"Each instance's tasks ranked by demand (server-seconds at the best throughput) and "
        f"split into {k} groups of equal size, group 1 the smallest; each cell is a policy's "
        "mean JCT over a group's tasks in seconds, averaged over the seeds; 'all tasks' is "
        "the mean JCT and 'p99' the p99 JCT, each averaged over the seeds.",
        "",
    ]
    lines += ex.point_sections(cfg, lambda w, load: point_table(rows, cfg, w, load))
    return "\n".join(lines)


def plot_by_size(rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any]) -> bytes:
    """One panel per (workload, load): mean JCT per size group, one line per policy."""
    from matplotlib.figure import Figure

    points = [(w, load) for w in cfg["workloads"] for load in cfg["loads"]]
    fig = Figure(figsize=(3.4 * len(points) + 1.5, 3.4), layout="constrained")
    axes = fig.subplots(1, len(points), squeeze=False)[0]
    groups = list(range(1, cfg["groups"] + 1))
    for ax, (w, load) in zip(axes, points, strict=True):
        values = []
        for i, spec in enumerate(cfg["policies"]):
            ys = group_means(rows, cfg, w, load, spec)
            values += ys
            ax.plot(groups, ys, label=spec, **ex.line_style(i, spec == "topas"))
        if values and min(values) > 0 and max(values) / min(values) > 10:
            ax.set_yscale("log")
        ax.set_xticks(groups)
        ax.set_title(f"{w}, load {load:g}", fontsize="medium")
        ax.set_xlabel("task-size group (1: smallest)")
        ax.set_ylabel("mean JCT (s)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    return ex.figure_png(fig)


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    return ex.run_study(
        "jct by size",
        "analysis/jct_by_size.py",
        argv,
        cfg,
        make_jobs(cfg),
        summarize,
        {"jct_by_size.png": plot_by_size},
        not args.no_progress,
        args.resume,
        runner=run_sized,
    )


if __name__ == "__main__":
    sys.exit(ex.run_cli(main))
