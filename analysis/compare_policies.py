"""Compare the baselines and TOPAS over workload families and load factors.

For every workload, load factor and seed one instance is generated
(``topas.workloads.generate``) and simulated under every policy with the calibrated
timing model. The seeds are the same for every policy, so comparisons are paired: per
point (workload, load) and per metric (mean JCT, p99 JCT) TOPAS is compared with the best
baseline there, the one with the lowest mean over seeds; the change is the mean over
seeds of TOPAS / best - 1 with a 95% CI (Student t, n-1 df).

    python analysis/compare_policies.py [--workloads chain,fanout,mixed,metagpt-sop,metagpt-tl]
        [--loads 0.5,0.8,1.0,1.2] [--seeds 5 | --seeds 20,23,27] [--tasks 200]
        [--policies fcfs,lpm,cpf,atlas,kvflow,topas] [--proposed topas] [--tuning]
        [--jobs N] [--kv-scale 1.0] [--prediction-error 0] [--movement recompute|swap]
        [--out results/compare] [--no-progress] [--resume]

``--seeds N`` means the first N reporting seeds (20, 21, ...); ``--kv-scale`` multiplies
each instance's default KV budget; ``--prediction-error SIGMA`` multiplies the output
length every policy is told (each stage's prediction, else the truth) by log-normal(0,
SIGMA) noise, drawn from the seed so that every policy is told the same (the simulator
runs the true lengths; default 0: no noise). ``--movement`` moves the prefixes by recompute
or host swap instead of each workload's profile's own way, with the same tasks and
arrivals (the load factor charges a recompute to a task's demand, so drawing at the same
load with the other movement would change the arrival rate as well). Policies other
than ``topas`` and its variants (``topas:...``, ``topas-greedy``, ``topas-base``) count as
baselines.
``--proposed`` names the spec compared with the best baseline (default ``topas``; a
variant to measure it the same way). Tuning seeds are refused unless
``--tuning`` says the run is for choosing defaults (its summary says so, and no reported
figure may come from it). Writes OUT/{config.json, runs.csv, summary.md, jct_vs_load.png}
(each file atomically, after every run has finished) and prints summary.md. Finished runs
are kept in OUT/.checkpoint.pkl as they arrive (deleted at the end): after an interruption
the same command with ``--resume`` runs only the missing ones. Bad input: one
``error: ...`` line on stderr, exit status 2, nothing created.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex  # noqa: E402

from topas.profiles import MOVEMENTS  # noqa: E402
from topas.studies import md_table  # noqa: E402

PROPOSED = "topas"
METRICS = (("mean_jct", "mean JCT"), ("p99_jct", "p99 JCT"))
DEFAULT_LOADS = "0.5,0.8,1.0,1.2"


def build_parser() -> ex.Parser:
    ap = ex.Parser(description=__doc__.splitlines()[0])
    ex.add_grid_options(
        ap,
        workloads=",".join(ex.STUDY_WORKLOADS),
        loads=DEFAULT_LOADS,
        policies=ex.compared_policies(),
        out="results/compare",
    )
    ap.add_argument("--proposed", default=PROPOSED, help="the spec compared with the best baseline")
    ap.add_argument("--kv-scale", default="1.0", help="multiplies the default KV budget")
    ap.add_argument(
        "--prediction-error",
        default="0",
        help="log-normal sigma of the noise on the output lengths policies are told (default 0)",
    )
    ap.add_argument(
        "--movement",
        choices=MOVEMENTS,
        default=None,
        help="how prefixes move (default: each profile's own); arrivals stay the profile's",
    )
    return ap


def config_from_args(args: Any) -> dict[str, Any]:
    """Validated parameters (raises :class:`experiments.CliError`)."""
    cfg = ex.grid_config(args)
    cfg["kv_scale"] = ex.parse_positive_float(args.kv_scale, "--kv-scale")
    cfg["prediction_error"] = ex.parse_float(
        args.prediction_error, "--prediction-error", 0.0, strict=False
    )
    cfg["movement"] = args.movement
    if args.proposed != PROPOSED and args.proposed not in cfg["policies"]:
        raise ex.CliError(f"--proposed: {args.proposed!r} is not in --policies")
    if args.proposed != PROPOSED and not ex.is_topas(args.proposed):
        raise ex.CliError(f"--proposed: {args.proposed!r} is a baseline, not a TOPAS spec")
    cfg["proposed"] = args.proposed if args.proposed in cfg["policies"] else None
    cfg["baselines"] = [p for p in cfg["policies"] if not ex.is_topas(p)]
    ex.check_instances(
        cfg["workloads"], cfg["seeds"], cfg["loads"][0], cfg["tasks"], cfg["kv_scale"]
    )
    return cfg


def make_jobs(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every run of the study; also those of the studies that reuse its instances
    (``jct_by_size.py``, ``shadow_decisions.py``), whose configs have no noise."""
    noise = {"prediction_error": cfg["prediction_error"]} if cfg.get("prediction_error") else {}
    moved = {"movement": cfg["movement"]} if cfg.get("movement") else {}
    return [
        {
            "workload": w,
            "load": load,
            "seed": s,
            "spec": p,
            "num_tasks": cfg["tasks"],
            "kv_scale": cfg["kv_scale"],
            **noise,
            **moved,
            **ex.profile_kwargs(cfg),
        }
        for w in cfg["workloads"]
        for load in cfg["loads"]
        for s in cfg["seeds"]
        for p in cfg["policies"]
    ]


# --------------------------------------------------------------------------- summary


def compare_point(
    rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], metric: str
) -> dict[str, Any]:
    """TOPAS against the best baseline for ``metric`` among ``rows`` (one point)."""
    best = ex.best_baseline(rows, cfg["baselines"], metric)
    change, half = ex.paired_change(rows, {"policy": cfg["proposed"]}, {"policy": best}, metric)
    return {
        "best": best,
        "best_value": ex.mean_of(ex.select(rows, policy=best), metric),
        "value": ex.mean_of(ex.select(rows, policy=cfg["proposed"]), metric),
        "change": change,
        "half": half,
    }


def comparisons(
    rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], workload: str
) -> dict[float, dict[str, dict[str, Any]]]:
    """load -> metric -> :func:`compare_point`."""
    out: dict[float, dict[str, dict[str, Any]]] = {}
    for load in cfg["loads"]:
        point = ex.select(rows, workload=workload, load=load)
        out[load] = {m: compare_point(point, cfg, m) for m, _ in METRICS}
    return out


def _change_cell(c: Mapping[str, Any]) -> str:
    cell = ex.fmt_change(c["change"], c["half"])
    return cell + " **worse**" if ex.worse_beyond_ci(c["change"], c["half"]) else cell


def workload_table(comp: Mapping[float, Mapping[str, Mapping[str, Any]]]) -> str:
    header = ["load"]
    for _, label in METRICS:
        header += [f"best baseline ({label})", f"its {label} (s)", f"TOPAS {label} (s)", "change %"]
    body = []
    for load, by_metric in comp.items():
        row: list[Any] = [f"{load:g}"]
        for m, _ in METRICS:
            c = by_metric[m]
            row += [c["best"], ex.fmt_s(c["best_value"]), ex.fmt_s(c["value"]), _change_cell(c)]
        body.append(row)
    return md_table(header, body)


def headline(workload: str, comp: Mapping[float, Mapping[str, Mapping[str, Any]]]) -> str:
    """Change vs the best baseline averaged over loads, and at the highest load."""
    top = max(comp)
    parts = []
    for m, label in METRICS:
        avg = sum(comp[load][m]["change"] for load in comp) / len(comp)
        c = comp[top][m]
        parts.append(
            f"{label} {avg:+.1f}% averaged over loads, "
            f"{ex.fmt_change(c['change'], c['half'])}% at load {top:g} (vs {c['best']})"
        )
    return f"- **{workload}**: " + "; ".join(parts) + "."


def means_table(rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], metric: str) -> str:
    header = ["workload", "load", *cfg["policies"]]
    body = []
    for w in cfg["workloads"]:
        for load in cfg["loads"]:
            point = ex.select(rows, workload=w, load=load)
            body.append(
                [w, f"{load:g}"]
                + [
                    ex.fmt_s(ex.mean_of(ex.select(point, policy=p), metric))
                    for p in cfg["policies"]
                ]
            )
    return md_table(header, body)


def overall_table(rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any]) -> str:
    """Per TOPAS spec in ``--policies``: its change against the best baseline averaged over
    every (workload, load) point, and the points where it is worse beyond the CI, per
    metric."""
    header = ["TOPAS spec"]
    for _, label in METRICS:
        header += [f"{label} change %, averaged", "worse beyond the CI"]
    body = []
    for spec in (p for p in cfg["policies"] if ex.is_topas(p)):
        one = {**cfg, "proposed": spec}
        cs = [point for w in cfg["workloads"] for point in comparisons(rows, one, w).values()]
        row: list[Any] = [f"`{spec}`"]
        for m, _ in METRICS:
            row.append(f"{sum(c[m]['change'] for c in cs) / len(cs):+.1f}")
            worse = sum(ex.worse_beyond_ci(c[m]["change"], c[m]["half"]) for c in cs)
            row.append(f"{worse}/{len(cs)}")
        body.append(row)
    return md_table(header, body)


def summarize(
    rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], command: str, wall_s: float
) -> str:
    lines = [
        "# TOPAS vs the best baseline",
        "",
        f"Command: `{command}`",
        "",
        f"Calibrated timing; {cfg['tasks']} tasks per instance; seeds {ex.fmt_list(cfg['seeds'])}"
        " (the same instances for every policy); KV budget x"
        f"{cfg['kv_scale']:g}{ex.predictions_note(cfg['prediction_error'])}"
        f"{ex.movement_note(cfg['movement'])}. "
        f"{ex.runtime_line(rows, wall_s, cfg['jobs'])}",
        "",
    ]
    lines += ex.tuning_lines(cfg)
    if cfg["proposed"] and cfg["baselines"]:
        if cfg["proposed"] != PROPOSED:
            lines += [f"TOPAS here is `{cfg['proposed']}`.", ""]
        lines += [
            "Change = mean over seeds of TOPAS / best baseline - 1, in %, ± the 95% CI "
            "half-width (Student t, n-1 df); negative: TOPAS is better. The best baseline "
            "is the one with the lowest mean over seeds at that point, chosen per metric. "
            "**worse**: TOPAS is worse beyond the CI (by at least "
            f"{ex.NEGLIGIBLE_PCT:g}%).",
            "",
            "## Headlines",
            "",
        ]
        comps = {w: comparisons(rows, cfg, w) for w in cfg["workloads"]}
        lines += [headline(w, comps[w]) for w in cfg["workloads"]]
        lines += ["", "Every TOPAS spec, over every point:", "", overall_table(rows, cfg)]
        lines += ["", "## One baseline better on both metrics", ""]
        lines += ex.dominance_section(rows, cfg, METRICS)
        for w in cfg["workloads"]:
            lines += ["", f"## {w}", "", workload_table(comps[w])]
    else:
        lines.append("No comparison: it needs `topas` and at least one baseline in --policies.")
    for metric, label in METRICS:
        lines += ["", f"## {label} per policy (s, mean over seeds)", ""]
        lines.append(means_table(rows, cfg, metric))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- plot


def plot_jct_vs_load(rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any]) -> bytes:
    """One column per workload; rows: mean and p99 JCT vs load, one line per policy."""
    from matplotlib.figure import Figure

    ws, loads = cfg["workloads"], cfg["loads"]
    fig = Figure(figsize=(3.2 * len(ws) + 1.5, 6.0), layout="constrained")
    axes = fig.subplots(len(METRICS), len(ws), squeeze=False)
    for col, w in enumerate(ws):
        for row_i, (metric, label) in enumerate(METRICS):
            ax = axes[row_i][col]
            values = []
            for i, p in enumerate(cfg["policies"]):
                ys = [
                    ex.mean_of(ex.select(rows, workload=w, load=x, policy=p), metric) for x in loads
                ]
                values += ys
                ax.plot(loads, ys, label=p, **ex.line_style(i, p == cfg["proposed"]))
            positive = [v for v in values if v > 0]
            if positive and max(positive) / min(positive) > 10:
                ax.set_yscale("log")
            ax.set_title(w if row_i == 0 else "", fontsize="medium")
            ax.set_xlabel("load factor")
            ax.set_ylabel(f"{label} (s)" if col == 0 else "")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    return ex.figure_png(fig)


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    plots = {"jct_vs_load.png": plot_jct_vs_load}
    return ex.run_study(
        "compare policies",
        "analysis/compare_policies.py",
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
