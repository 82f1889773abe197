"""Ablation of TOPAS's terms and its sensitivity to output-length prediction error.

Part A (ablation): full TOPAS and each variant with one term switched off
(``topas:progress=0``, ``move=0``, ``reuse=0``, ``redo=0``, ``revoke=0``, ``aging=0``,
``reserve=0``, ``visit=0``), the search without a choice of residency (``search=all``),
without drains (``drain=0``), without the drain discount (``drain_discount=0``), without
a prompt waiting for drained memory (``drain_load=0``) or with
voluntary retraction (``retract=1``), and TOPAS-base (``topas-base``) at one (high) load
factor; per workload the change in mean and p99 JCT of each variant against full TOPAS,
paired over seeds (mean of variant / full - 1, in %, with a 95% CI, Student t with n-1
df). Positive: switching the term off hurts, so the term helps.

Part B (prediction error): each sweep policy with the output lengths it is told multiplied
by log-normal(0, sigma) noise (``simulate(..., prediction_error=sigma)``, drawn from the
seed, so every policy is told the same lengths); change against the same policy at
sigma 0, paired over seeds. Sigma 0 is always included.

    python analysis/ablation.py [--workloads chain,fanout,mixed,metagpt-sop,metagpt-tl]
        [--load 1.2] [--seeds 5 | --seeds 20,23,27] [--tuning] [--tasks 200]
        [--sigmas 0,0.25,0.5,1.0] [--sweep-policies topas,lpm,kvflow] [--jobs N]
        [--kv-scale 1.0] [--out results/ablation] [--no-progress] [--resume]

Calibrated timing. A run both parts need (full TOPAS at sigma 0) runs once. Writes
OUT/{config.json, runs.csv, summary.md, ablation.png, prediction_error.png} (each file
atomically, after every run has finished) and prints summary.md. Bad input: one
``error: ...`` line on stderr, exit status 2, nothing created.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex  # noqa: E402

from topas.studies import md_table  # noqa: E402

FULL = "topas"
METRICS = (("mean_jct", "mean JCT"), ("p99_jct", "p99 JCT"))


def build_parser() -> ex.Parser:
    ap = ex.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(ex.STUDY_WORKLOADS), help="comma-separated")
    ex.add_profile_option(ap)
    ap.add_argument("--load", default="1.2", help="load factor (default: high load)")
    ap.add_argument("--seeds", default="5", help=ex.SEEDS_HELP)
    ex.add_tuning_option(ap)
    ap.add_argument("--tasks", default="200", help="tasks per instance")
    ap.add_argument("--sigmas", default="0,0.25,0.5,1.0", help="prediction-error sigmas")
    ap.add_argument("--sweep-policies", default="topas,lpm,kvflow", help="policy specs")
    ap.add_argument("--jobs", default=None, help="parallel processes (default: CPU count)")
    ap.add_argument("--kv-scale", default="1.0", help="multiplies the default KV budget")
    ap.add_argument("--out", default="results/ablation", help="output folder")
    ex.add_run_options(ap)
    return ap


def config_from_args(args: Any) -> dict[str, Any]:
    """Validated parameters (raises :class:`experiments.CliError`)."""
    sigmas = ex.parse_floats(args.sigmas, "--sigmas", 0.0, strict=False)
    cfg: dict[str, Any] = {
        "workloads": ex.parse_workloads(args.workloads),
        "load": ex.parse_positive_float(args.load, "--load"),
        "seeds": ex.study_seeds(args),
        "tuning": bool(args.tuning),
        "tasks": ex.parse_positive_int(args.tasks, "--tasks"),
        "sigmas": sorted({0.0, *sigmas}),
        "sweep_policies": ex.parse_policies(args.sweep_policies, "--sweep-policies"),
        "variants": ex.ablation_variants(),
        "jobs": ex.parse_jobs(args.jobs),
        "kv_scale": ex.parse_positive_float(args.kv_scale, "--kv-scale"),
        "out": str(ex.check_out(args.out)),
        "profile": ex.parse_profile(args.profile),
    }
    ex.check_instances(cfg["workloads"], cfg["seeds"], cfg["load"], cfg["tasks"], cfg["kv_scale"])
    return cfg


def _job(cfg: Mapping[str, Any], w: str, seed: int, spec: str, sigma: float) -> dict[str, Any]:
    return {
        "workload": w,
        "load": cfg["load"],
        "seed": seed,
        "spec": spec,
        "num_tasks": cfg["tasks"],
        "prediction_error": sigma,
        "kv_scale": cfg["kv_scale"],
        **ex.profile_kwargs(cfg),
    }


def make_jobs(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Part A's variants at sigma 0, then part B's policies at every sigma; without repeats."""
    part_a = [
        _job(cfg, w, s, v, 0.0)
        for w in cfg["workloads"]
        for s in cfg["seeds"]
        for v in cfg["variants"]
    ]
    part_b = [
        _job(cfg, w, s, p, sigma)
        for w in cfg["workloads"]
        for s in cfg["seeds"]
        for p in cfg["sweep_policies"]
        for sigma in cfg["sigmas"]
    ]
    return ex.unique_jobs(part_a + part_b)


# --------------------------------------------------------------------------- part A


def ablation_changes(
    rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], workload: str, metric: str
) -> dict[str, tuple[float, float]]:
    """variant -> (change % vs full TOPAS, CI half-width), at sigma 0."""
    base = {"workload": workload, "prediction_error": 0.0}
    return {
        v: ex.paired_change(rows, {**base, "policy": v}, {**base, "policy": FULL}, metric)
        for v in cfg["variants"]
        if v != FULL
    }


def _marked(change: float, half: float) -> str:
    cell = ex.fmt_change(change, half)
    return cell + " *" if ex.significant(change, half) else cell


def ablation_table(rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], w: str) -> str:
    changes = {m: ablation_changes(rows, cfg, w, m) for m, _ in METRICS}
    header = ["variant"]
    for _, label in METRICS:
        header += [f"{label} (s)", "change % vs full"]
    body = []
    for v in cfg["variants"]:
        point = ex.select(rows, workload=w, policy=v, prediction_error=0.0)
        row: list[Any] = [f"{v} (full)" if v == FULL else v]
        for m, _ in METRICS:
            cell = "—" if v == FULL else _marked(*changes[m][v])
            row += [ex.fmt_s(ex.mean_of(point, m)), cell]
        body.append(row)
    return md_table(header, body)


def ablation_overview(rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any]) -> str:
    """Mean-JCT change of every variant (rows) in every workload (columns)."""
    changes = {w: ablation_changes(rows, cfg, w, "mean_jct") for w in cfg["workloads"]}
    body = [
        [v] + [_marked(*changes[w][v]) for w in cfg["workloads"]]
        for v in cfg["variants"]
        if v != FULL
    ]
    return md_table(["variant", *cfg["workloads"]], body)


# --------------------------------------------------------------------------- part B


def sweep_table(rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], w: str) -> str:
    header = ["policy", "sigma"]
    for _, label in METRICS:
        header += [f"{label} (s)", "change % vs sigma 0"]
    body = []
    for p in cfg["sweep_policies"]:
        ref = {"workload": w, "policy": p, "prediction_error": 0.0}
        for sigma in cfg["sigmas"]:
            here = {**ref, "prediction_error": sigma}
            row: list[Any] = [p, f"{sigma:g}"]
            for m, _ in METRICS:
                cell = "—" if sigma == 0 else _marked(*ex.paired_change(rows, here, ref, m))
                row += [ex.fmt_s(ex.mean_of(ex.select(rows, **here), m)), cell]
            body.append(row)
    return md_table(header, body)


# --------------------------------------------------------------------------- summary


def summarize(
    rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], command: str, wall_s: float
) -> str:
    lines = [
        "# TOPAS ablation and prediction-error sweep",
        "",
        f"Command: `{command}`",
        "",
        f"Calibrated timing; load factor {cfg['load']:g}; {cfg['tasks']} tasks per instance; "
        f"seeds {ex.fmt_list(cfg['seeds'])} (the same instances for every run); KV budget x"
        f"{cfg['kv_scale']:g}. {ex.runtime_line(rows, wall_s, cfg['jobs'])}",
        "",
        *ex.tuning_lines(cfg),
        "Changes are paired over seeds: mean of X / reference - 1, in %, ± the 95% CI "
        "half-width (Student t, n-1 df). `*`: the CI excludes 0 and the change is at least "
        f"{ex.NEGLIGIBLE_PCT:g}%.",
        "",
        "## A. Ablation: each term switched off",
        "",
        "Reference: full TOPAS. Positive: switching the term off hurts (the term helps).",
        "",
        "### Mean JCT change % vs full TOPAS",
        "",
        ablation_overview(rows, cfg),
    ]
    for w in cfg["workloads"]:
        lines += ["", f"### {w}", "", ablation_table(rows, cfg, w)]
    lines += [
        "",
        "## B. Prediction error",
        "",
        "The output lengths a policy is told are the truth times log-normal(0, sigma) noise; "
        "reference: the same policy at sigma 0. The calibrated engine's KV reservation at "
        "admission also uses the told lengths (SGLang reserves input + predicted output), so "
        "policies that ignore predictions in their order are affected too.",
    ]
    for w in cfg["workloads"]:
        lines += ["", f"### {w}", "", sweep_table(rows, cfg, w)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- plots


def bar_colour(i: int) -> Any:
    """The ``i``-th variant's bar colour: tab20's ten dark shades, then its ten light ones,
    so that up to 20 variants never share a colour (the default cycle repeats after 10)."""
    from matplotlib import colormaps

    return colormaps["tab20"]((2 * i) % 20 + (i // 10) % 2)


def plot_ablation(rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any]) -> bytes:
    """Grouped bars: per workload one bar per variant, change % vs full TOPAS ± CI."""
    import numpy as np
    from matplotlib.figure import Figure

    ws = cfg["workloads"]
    variants = [v for v in cfg["variants"] if v != FULL]
    fig = Figure(figsize=(max(6.5, 1.6 * len(ws) + 4.0), 6.5), layout="constrained")
    axes = fig.subplots(len(METRICS), 1, squeeze=False)
    x = np.arange(len(ws))
    width = 0.8 / len(variants)
    for (metric, label), ax in zip(METRICS, axes[:, 0], strict=True):
        changes = {w: ablation_changes(rows, cfg, w, metric) for w in ws}
        for i, v in enumerate(variants):
            ys = [changes[w][v][0] for w in ws]
            errs = [0.0 if math.isnan(changes[w][v][1]) else changes[w][v][1] for w in ws]
            pos = x - 0.4 + width * (i + 0.5)
            ax.bar(pos, ys, width, yerr=errs, capsize=2, label=v, color=bar_colour(i))
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(x, ws)
        ax.set_ylabel(f"{label} change vs full TOPAS (%)")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Ablation at load {cfg['load']:g} (positive: the term helps)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    return ex.figure_png(fig)


def plot_prediction_error(rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any]) -> bytes:
    """One panel per workload: mean JCT vs sigma, one line per sweep policy."""
    from matplotlib.figure import Figure

    ws, sigmas = cfg["workloads"], cfg["sigmas"]
    fig = Figure(figsize=(3.2 * len(ws) + 1.5, 3.6), layout="constrained")
    axes = fig.subplots(1, len(ws), squeeze=False)
    for ax, w in zip(axes[0], ws, strict=True):
        for i, p in enumerate(cfg["sweep_policies"]):
            ys = [
                ex.mean_of(ex.select(rows, workload=w, policy=p, prediction_error=s), "mean_jct")
                for s in sigmas
            ]
            ax.plot(sigmas, ys, label=p, **ex.line_style(i, p == FULL))
        ax.set_title(w, fontsize="medium")
        ax.set_xlabel("prediction error sigma")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean JCT (s)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    return ex.figure_png(fig)


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    plots = {"ablation.png": plot_ablation, "prediction_error.png": plot_prediction_error}
    return ex.run_study(
        "ablation",
        "analysis/ablation.py",
        argv,
        cfg,
        make_jobs(cfg),
        summarize,
        plots,
        not args.no_progress,
        args.resume,
    )


if __name__ == "__main__":
    sys.exit(ex.run_cli(main))
