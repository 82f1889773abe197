"""Reproduce the TOPAS paper's comparison in its own setting, and put our cuts beside its.

The paper (arXiv 2608.25523) serves Qwen2.5-32B on one A100-80GB with SGLang and
reports, per workload and metric, TOPAS's cut in JCT against the best baseline. This
study runs the same five workloads (``chain-3``, ``dag-4``, ``dag-10-wide``,
``metagpt-sop-paper``, ``metagpt-tl-paper``) in the profile ``qwen2.5-32b/a100-80gb``
(prefixes moved by swap over PCIe Gen4) with every registered baseline, over loads from
light to past saturation and paired seeds, and writes three parts:

1. **comparison**: per workload, load and metric (mean, p99 JCT), TOPAS against the best
   of all registered baselines at that point (lowest mean over seeds), as a cut in %
   (positive: TOPAS is faster) with a 95% CI over seeds, beside the paper's number;
2. **ablation** on ``metagpt-tl-paper``: TOPAS against TOPAS-base (no reuse, no aging);
3. **regime map** on ``dag-4``: the cut in mean JCT against the best baseline over
   (sum of prefixes / KV budget) x load x movement (swap, recompute), as a heat map.
   Both movements run the same tasks and arrivals at a (budget, load, seed): those of the
   profile's own movement (swap) at that load factor (``experiments.make_instance``
   with a ``movement``). The load factor charges a recompute each task's prompts
   (docs/workloads.md), so the recompute half's servers run hotter than its column
   says; drawn at the recompute's own load factor the policies nearly tie there
   (docs/topas.md, "The regime map's two halves").

    python analysis/reproduce_paper.py [--quick] [--seeds 10] [--tasks 200] [--loads ...]
        [--ratios ...] [--map-seeds 5] [--profile NAME] [--jobs N] [--out results/paper]
        [--no-progress] [--resume]

Seeds are reporting seeds (below ``experiments.TUNING_SEED_MIN``; defaults are tuned on
seeds above it). ``--quick`` is a smoke version (a minute on 2 cores) that exercises every
part. Writes OUT/{config.json, runs.csv, summary.md, regime_map.png, cuts.png} atomically
after every run and prints summary.md. Bad input: one ``error: ...`` line, exit status 2.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex  # noqa: E402

from topas.studies import md_table
from topas.workloads import generate  # noqa: E402

PROFILE = "qwen2.5-32b/a100-80gb"
PROPOSED = "topas"
BASE_SWITCHES = "reuse=0,aging=0"
"""TOPAS-base, as in the paper's ablation: the proposed policy without reuse and aging."""
METRICS = (("mean_jct", "mean JCT"), ("p99_jct", "p99 JCT"))
WORKLOADS = ("chain-3", "dag-4", "dag-10-wide", "metagpt-sop-paper", "metagpt-tl-paper")
ABLATION_WORKLOAD = "metagpt-tl-paper"
MAP_WORKLOAD = "dag-4"
MOVEMENTS = ("swap", "recompute")

PAPER_CUTS: dict[str, tuple[float, float, str]] = {
    "chain-3": (27.5, 31.7, "best baseline per metric"),
    "dag-4": (39.8, 49.4, "best baseline per metric"),
    "dag-10-wide": (27.7, 30.8, "best baseline per metric"),
    "metagpt-sop-paper": (9.8, 4.5, "vs SPF; +6.7% request throughput"),
    "metagpt-tl-paper": (22.0, 26.6, "best baseline per metric"),
}
"""The paper's cuts in mean and p99 JCT (%) against the best baseline (its abstract and
evaluation as publicly summarised); the load it measured at is not stated there."""

DEFAULTS = {
    "loads": "0.5,0.8,1.0,1.2,1.5",
    "seeds": "10",
    "tasks": "200",
    "ratios": "0.2,0.35,0.5,0.65,0.8",
    "map_seeds": "5",
}
QUICK = {"loads": "1.0", "seeds": "2", "tasks": "8", "ratios": "0.5", "map_seeds": "1"}


def build_parser() -> ex.Parser:
    ap = ex.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke version (about a minute)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    ap.add_argument("--profile", default=PROFILE, help=f"server profile (default {PROFILE})")
    ap.add_argument("--loads", default=None, help=f"load factors (default {DEFAULTS['loads']})")
    ap.add_argument(
        "--seeds",
        default=None,
        help="N (the first N reporting seeds, 20 onwards) or a comma list (default 10)",
    )
    ap.add_argument(
        "--tasks", default=None, help=f"tasks per instance (default {DEFAULTS['tasks']})"
    )
    ap.add_argument(
        "--ratios",
        default=None,
        help=f"regime map: sum of prefixes / KV budget (default {DEFAULTS['ratios']})",
    )
    ap.add_argument("--map-seeds", default=None, help="regime map seeds (default 5)")
    ap.add_argument(
        "--policies", default=None, help="baselines and TOPAS (default: every baseline, --proposed)"
    )
    ap.add_argument(
        "--proposed", default=PROPOSED, help="the TOPAS variant compared (default topas)"
    )
    ap.add_argument(
        "--topas-base",
        default=None,
        help=f"the ablation's TOPAS-base (default: --proposed with {BASE_SWITCHES})",
    )
    ap.add_argument("--jobs", default=None, help="parallel processes (default: CPU count)")
    ap.add_argument("--out", default="results/paper", help="output folder")
    ex.add_run_options(ap)
    return ap


def config_from_args(args: Any) -> dict[str, Any]:
    """Validated parameters (raises :class:`experiments.CliError`)."""
    base = QUICK if args.quick else DEFAULTS

    def pick(name: str, default: str) -> str:
        value = getattr(args, name)
        return base.get(name, default) if value is None else value

    proposed = args.proposed
    if not ex.is_topas(proposed):
        raise ex.CliError(f"--proposed: {proposed!r} is not a TOPAS variant")
    default = ",".join([*ex.BASELINES, proposed])
    policies = ex.parse_policies(args.policies or default, "--policies")
    if proposed not in policies:
        raise ex.CliError(f"--policies: must include {proposed!r}")
    cfg: dict[str, Any] = {
        "quick": bool(args.quick),
        "profile": ex.parse_profile(args.profile),
        "workloads": ex.parse_workloads(args.workloads),
        "loads": ex.parse_floats(pick("loads", DEFAULTS["loads"]), "--loads", 0.0, strict=True),
        "seeds": ex.check_report_seeds(ex.parse_seeds(pick("seeds", DEFAULTS["seeds"]))),
        "tasks": ex.parse_positive_int(pick("tasks", DEFAULTS["tasks"]), "--tasks"),
        "ratios": ex.parse_floats(pick("ratios", DEFAULTS["ratios"]), "--ratios", 0.0, strict=True),
        "map_seeds": ex.check_report_seeds(
            ex.parse_seeds(pick("map_seeds", DEFAULTS["map_seeds"]), "--map-seeds"), "--map-seeds"
        ),
        "policies": policies,
        "baselines": [p for p in policies if not ex.is_topas(p)],
        "proposed": proposed,
        "topas_base": topas_base(proposed, args.topas_base),
        "jobs": ex.parse_jobs(args.jobs),
        "out": str(ex.check_out(args.out)),
    }
    if not cfg["baselines"]:
        raise ex.CliError("--policies: needs at least one baseline beside topas")
    if max(cfg["ratios"]) >= 1:
        raise ex.CliError("--ratios: the prefixes must leave room for requests (each < 1)")
    cfg["map_kv"] = {f"{r:g}": map_budget(r, cfg["tasks"], cfg["profile"]) for r in cfg["ratios"]}
    return cfg


def topas_base(proposed: str, given: str | None) -> str:
    """The ablation's TOPAS-base: ``given``, or ``proposed``'s family with the switches
    of :data:`BASE_SWITCHES` (bad input where that is not a policy spec, e.g. for a
    policy without those switches, before anything runs)."""
    spec = given or f"{proposed.partition(':')[0]}:{BASE_SWITCHES}"
    hint = "" if given else " (name one with --topas-base)"
    return ex.parse_policies(spec, "--topas-base" + hint)[0]


def map_budget(ratio: float, num_tasks: int, profile: str) -> int:
    """The KV budget at which the map workload's prefixes take ``ratio`` of it; bad input
    when a stage could then not fit beside its prefix."""
    inst = generate(MAP_WORKLOAD, num_tasks=1, seed=0, profile=profile)
    prefixes = sum(a.prefix_tokens for a in inst.agents)
    kv = math.ceil(prefixes / ratio)
    try:
        generate(MAP_WORKLOAD, num_tasks=num_tasks, seed=0, kv_capacity_tokens=kv, profile=profile)
    except ValueError as e:
        raise ex.CliError(f"--ratios {ratio:g}: {e}") from None
    return kv


# --------------------------------------------------------------------------- jobs


def _job(cfg: Mapping[str, Any], workload: str, load: float, seed: int, spec: str, **extra: Any):  # type: ignore[no-untyped-def]
    """One run: keyword arguments of ``experiments.run_point``, on the study's profile (so
    a run two parts share is one job, and every part follows ``--profile``)."""
    return {
        "workload": workload,
        "load": load,
        "seed": seed,
        "spec": spec,
        "num_tasks": cfg["tasks"],
        **extra,
        **ex.profile_kwargs(cfg),
    }


def comparison_jobs(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        _job(cfg, w, load, s, p)
        for w in cfg["workloads"]
        for load in cfg["loads"]
        for s in cfg["seeds"]
        for p in cfg["policies"]
    ]


def ablation_jobs(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    if ABLATION_WORKLOAD not in cfg["workloads"]:
        return []
    return [
        _job(cfg, ABLATION_WORKLOAD, load, s, p)
        for load in cfg["loads"]
        for s in cfg["seeds"]
        for p in (cfg["proposed"], cfg["topas_base"])
    ]


def map_jobs(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        _job(
            cfg,
            MAP_WORKLOAD,
            load,
            s,
            p,
            movement=movement,
            kv_capacity_tokens=cfg["map_kv"][f"{ratio:g}"],
        )
        for movement in MOVEMENTS
        for ratio in cfg["ratios"]
        for load in cfg["loads"]
        for s in cfg["map_seeds"]
        for p in cfg["policies"]
    ]


def make_jobs(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every run of the three parts, each once (the comparison's swap runs at the default
    budget are not repeated by the map, whose budgets are set explicitly)."""
    return ex.unique_jobs([*comparison_jobs(cfg), *ablation_jobs(cfg), *map_jobs(cfg)])


# --------------------------------------------------------------------------- analysis


def is_default_point(row: Mapping[str, Any]) -> bool:
    return "movement" not in row or row.get("movement") in (None, "")


def cut_point(
    rows: Sequence[Mapping[str, Any]],
    cfg: Mapping[str, Any],
    metric: str,
    against: str | None = None,
) -> dict[str, Any]:
    """TOPAS's cut against ``against`` (default: the best baseline for ``metric``) among
    the rows of one point: ``cut`` = -(TOPAS / other - 1) in %, with its CI half-width."""
    other = against or ex.best_baseline(rows, cfg["baselines"], metric)
    change, half = ex.paired_change(rows, {"policy": cfg["proposed"]}, {"policy": other}, metric)
    return {
        "other": other,
        "other_value": ex.mean_of(ex.select(rows, policy=other), metric),
        "value": ex.mean_of(ex.select(rows, policy=cfg["proposed"]), metric),
        "cut": -change,
        "half": half,
    }


def verdict(cut: float, half: float) -> str:
    if not ex.significant(cut, half):
        return "tie"
    return "win" if cut > 0 else "**loss**"


def fmt_cut(c: Mapping[str, Any]) -> str:
    return f"{ex.fmt_change(c['cut'], c['half'])} ({verdict(c['cut'], c['half'])})"


def comparison_cuts(
    rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any]
) -> dict[str, dict[float, dict[str, dict[str, Any]]]]:
    """workload -> load -> metric -> :func:`cut_point` (default-budget swap runs only)."""
    main = [r for r in rows if is_default_point(r)]
    return {
        w: {
            load: {m: cut_point(ex.select(main, workload=w, load=load), cfg, m) for m, _ in METRICS}
            for load in cfg["loads"]
        }
        for w in cfg["workloads"]
    }


def side_by_side(cuts: Mapping[str, Mapping[float, Mapping[str, Mapping[str, Any]]]]) -> str:
    header = ["workload"]
    for _, label in METRICS:
        header += [f"paper {label} cut %", "ours, peak over loads (load)", "ours, mean over loads"]
    header.append("paper's baseline")
    body = []
    for w, by_load in cuts.items():
        paper = PAPER_CUTS.get(w)
        row: list[Any] = [w]
        for i, (m, _) in enumerate(METRICS):
            peak_load = max(by_load, key=lambda x: by_load[x][m]["cut"])
            peak = by_load[peak_load][m]
            avg = sum(by_load[x][m]["cut"] for x in by_load) / len(by_load)
            row += [
                "n/a" if paper is None else f"{paper[i]:.1f}",
                f"{fmt_cut(peak)} at {peak_load:g} vs {peak['other']}",
                f"{avg:+.1f}",
            ]
        row.append("" if paper is None else paper[2])
        body.append(row)
    return md_table(header, body)


def workload_table(by_load: Mapping[float, Mapping[str, Mapping[str, Any]]]) -> str:
    header = ["load"]
    for _, label in METRICS:
        header += [f"best baseline ({label})", "its (s)", "TOPAS (s)", "cut %"]
    body = []
    for load, by_metric in by_load.items():
        row: list[Any] = [f"{load:g}"]
        for m, _ in METRICS:
            c = by_metric[m]
            row += [c["other"], ex.fmt_s(c["other_value"]), ex.fmt_s(c["value"]), fmt_cut(c)]
        body.append(row)
    return md_table(header, body)


def tally(cuts: Mapping[str, Mapping[float, Mapping[str, Mapping[str, Any]]]]) -> str:
    counts = {"win": 0, "tie": 0, "**loss**": 0}
    for by_load in cuts.values():
        for by_metric in by_load.values():
            for c in by_metric.values():
                counts[verdict(c["cut"], c["half"])] += 1
    return (
        f"Over every (workload, load, metric) point: {counts['win']} wins, {counts['tie']} ties "
        f"(CI includes 0), {counts['**loss**']} losses against the best baseline."
    )


def ablation_table(rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any]) -> str:
    main = [r for r in rows if is_default_point(r)]
    header = ["load"] + [f"TOPAS vs TOPAS-base, {label} cut %" for _, label in METRICS]
    body = []
    for load in cfg["loads"]:
        point = ex.select(main, workload=ABLATION_WORKLOAD, load=load)
        body.append(
            [f"{load:g}"]
            + [fmt_cut(cut_point(point, cfg, m, cfg["topas_base"])) for m, _ in METRICS]
        )
    return md_table(header, body)


def map_cuts(
    rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any]
) -> dict[str, dict[tuple[float, float], dict[str, Any]]]:
    """movement -> (ratio, load) -> the mean-JCT cut against the best baseline."""
    out: dict[str, dict[tuple[float, float], dict[str, Any]]] = {}
    rows = [r for r in rows if not is_default_point(r)]
    for movement in MOVEMENTS:
        grid = {}
        for ratio in cfg["ratios"]:
            kv = cfg["map_kv"][f"{ratio:g}"]
            for load in cfg["loads"]:
                point = ex.select(
                    rows, workload=MAP_WORKLOAD, movement=movement, kv_capacity_tokens=kv, load=load
                )
                grid[(ratio, load)] = cut_point(point, cfg, "mean_jct")
        out[movement] = grid
    return out


def map_table(grids: Mapping[str, Mapping[tuple[float, float], Mapping[str, Any]]], cfg) -> str:
    header = ["movement", "prefixes / KV budget", *(f"load {x:g}" for x in cfg["loads"])]
    body = []
    for movement, grid in grids.items():
        for ratio in cfg["ratios"]:
            cells = [grid[(ratio, load)] for load in cfg["loads"]]
            body.append(
                [movement, f"{ratio:g}"]
                + [f"{ex.fmt_change(c['cut'], c['half'])} vs {c['other']}" for c in cells]
            )
    return md_table(header, body)


def summarize(
    rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], command: str, wall_s: float
) -> str:
    cuts = comparison_cuts(rows, cfg)
    lines = [
        "# TOPAS in the paper's setting, beside the paper's numbers",
        "",
        f"Command: `{command}`",
        "",
        f"Profile `{cfg['profile']}` (docs/profiles.md), calibrated timing, prefixes moved by "
        f"swap unless the map says otherwise; {cfg['tasks']} tasks per instance; reporting "
        f"seeds {ex.fmt_list(cfg['seeds'])} (no default was chosen on them: tuning seeds are "
        f"{ex.SEED_SPLIT['tuning']}); TOPAS is `{cfg['proposed']}`; baselines: "
        f"{', '.join(cfg['baselines'])}. "
        f"{ex.runtime_line(rows, wall_s, cfg['jobs'])}",
        "",
        "Cut = -(TOPAS / best baseline - 1) in %, mean over paired seeds ± the 95% CI "
        "half-width (Student t); positive: TOPAS is faster. The best baseline is the one "
        "with the lowest mean over seeds at that point, per metric. tie: the CI includes 0 "
        f"(or |cut| < {ex.NEGLIGIBLE_PCT:g}%).",
        "",
        "## Side by side with the paper",
        "",
        side_by_side(cuts),
        "",
        tally(cuts),
        "",
        "## One baseline better on both metrics",
        "",
        *ex.dominance_section([r for r in rows if is_default_point(r)], cfg, METRICS),
    ]
    for w, by_load in cuts.items():
        lines += ["", f"## {w}", "", workload_table(by_load)]
    if ABLATION_WORKLOAD in cfg["workloads"]:
        lines += [
            "",
            f"## Ablation on {ABLATION_WORKLOAD}: TOPAS against TOPAS-base (`{cfg['topas_base']}`)",
            "",
            ablation_table(rows, cfg),
        ]
    lines += [
        "",
        f"## Regime map on {MAP_WORKLOAD}: mean-JCT cut against the best baseline",
        "",
        f"Seeds {ex.fmt_list(cfg['map_seeds'])}; KV budgets "
        + ", ".join(f"{r} -> {kv} tokens" for r, kv in cfg["map_kv"].items())
        + ". Both movements run the same tasks and arrivals: those of the profile's own"
        " movement at each load (a recompute's own load factor, which charges each task"
        " its prompts, is higher at these arrivals). Picture: regime_map.png.",
        "",
        map_table(map_cuts(rows, cfg), cfg),
    ]
    for metric, label in METRICS:
        lines += ["", f"## {label} per policy (s, mean over seeds, default budget, swap)", ""]
        lines.append(means_table([r for r in rows if is_default_point(r)], cfg, metric))
    return "\n".join(lines) + "\n"


def means_table(rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], metric: str) -> str:
    policies = list(dict.fromkeys([*cfg["policies"], *{r["policy"] for r in rows}]))
    header = ["workload", "load", *policies]
    body = []
    for w in cfg["workloads"]:
        for load in cfg["loads"]:
            point = ex.select(rows, workload=w, load=load)
            cells = [ex.mean_of(ex.select(point, policy=p), metric) for p in policies]
            body.append([w, f"{load:g}", *("" if math.isnan(v) else ex.fmt_s(v) for v in cells)])
    return md_table(header, body)


# --------------------------------------------------------------------------- plots


def plot_regime_map(rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any]) -> bytes:
    """One heat map per movement: rows the prefix share of the budget, columns the load,
    colour and label the mean-JCT cut against the best baseline (green: TOPAS faster)."""
    import numpy as np
    from matplotlib.figure import Figure

    grids = map_cuts(rows, cfg)
    ratios, loads = cfg["ratios"], cfg["loads"]
    values = {
        m: np.array([[grids[m][(r, x)]["cut"] for x in loads] for r in ratios]) for m in MOVEMENTS
    }
    lim = max(5.0, max(float(np.nanmax(np.abs(v))) for v in values.values()))
    fig = Figure(
        figsize=(2.0 + 0.9 * len(loads) * len(MOVEMENTS), 1.6 + 0.6 * len(ratios)),
        layout="constrained",
    )
    axes = fig.subplots(1, len(MOVEMENTS), squeeze=False)[0]
    image = None
    for ax, movement in zip(axes, MOVEMENTS, strict=True):
        v = values[movement]
        image = ax.imshow(v, cmap="RdYlGn", vmin=-lim, vmax=lim, aspect="auto", origin="lower")
        for i in range(len(ratios)):
            for j in range(len(loads)):
                ax.text(j, i, f"{v[i, j]:+.0f}", ha="center", va="center", fontsize="small")
        ax.set_xticks(range(len(loads)), [f"{x:g}" for x in loads])
        ax.set_yticks(range(len(ratios)), [f"{r:g}" for r in ratios])
        ax.set_xlabel("load factor")
        ax.set_ylabel("sum of prefixes / KV budget")
        ax.set_title(f"{MAP_WORKLOAD}, {movement}", fontsize="medium")
    fig.colorbar(image, ax=list(axes), label="mean-JCT cut (%)")
    return ex.figure_png(fig)


def plot_cuts(rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any]) -> bytes:
    """Per workload and metric: our peak cut over loads (with its CI) beside the paper's."""
    import numpy as np
    from matplotlib.figure import Figure

    cuts = comparison_cuts(rows, cfg)
    ws = list(cuts)
    fig = Figure(figsize=(2.0 + 1.6 * len(ws), 3.8), layout="constrained")
    axes = fig.subplots(1, len(METRICS), squeeze=False)[0]
    x = np.arange(len(ws))
    for ax, (m, label) in zip(axes, METRICS, strict=True):
        peaks = [max(cuts[w].values(), key=lambda c, m=m: c[m]["cut"])[m] for w in ws]
        ours = [c["cut"] for c in peaks]
        err = [0.0 if math.isnan(c["half"]) else c["half"] for c in peaks]
        paper = [
            PAPER_CUTS[w][0 if m == "mean_jct" else 1] if w in PAPER_CUTS else np.nan for w in ws
        ]
        ax.bar(x - 0.2, paper, 0.4, label="paper", color="0.7")
        ax.bar(x + 0.2, ours, 0.4, yerr=err, label="ours (peak over loads)", color="tab:blue")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(x, ws, rotation=30, ha="right", fontsize="small")
        ax.set_ylabel(f"{label} cut vs best baseline (%)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize="small")
    return ex.figure_png(fig)


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    plots = {"regime_map.png": plot_regime_map, "cuts.png": plot_cuts}
    return ex.run_study(
        "reproduce paper",
        "analysis/reproduce_paper.py",
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
