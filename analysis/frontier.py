"""The mean/p99 JCT trade-off of a study's policies: a plot and the Pareto front per load.

Reads ``runs.csv`` of a ``compare_policies.py`` or ``reproduce_paper.py`` study and places
every policy, at every load, at (mean JCT, p99 JCT), each the mean over the study's
seeds. A family of specs that differ in one numeric parameter (``--family
guarded_spf:GuardedSPF:guard``: every spec ``guarded_spf:GuardedSPF:guard=X``) is joined
by a line in the parameter's order; ``--family`` may be given more than once, one line
each. The axes frame the Pareto front, the families, TOPAS, and the best mean and the
best p99 of the other policies, so a policy far behind on both metrics may fall
outside. Prints, per load, the policies that no other policy of the study beats on
both metrics (the Pareto front), and whether any policy reaches the best mean and the
best p99 of the others at once.

    python analysis/frontier.py RESULTS_DIR [--workload W] [--family SPEC:PARAM ...]
        [--out RESULTS_DIR/frontier.png]

Bad input (no runs.csv, a missing column, a workload or family the study does not have):
one ``error: ...`` line on stderr, exit status 2, nothing written.
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex  # noqa: E402

from topas.instance import write_atomic  # noqa: E402
from topas.studies import md_table  # noqa: E402

COLUMNS = ("workload", "load", "seed", "policy", "mean_jct", "p99_jct")
Point = tuple[float, float]  # (mean JCT, p99 JCT), seconds, mean over seeds


def read_runs(folder: Path) -> list[dict[str, str]]:
    path = folder / "runs.csv"
    if not path.is_file():
        raise ex.CliError(f"{path}: no such file (a compare_policies.py study's folder?)")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ex.CliError(f"{path}: missing column {missing[0]!r}")
        rows = list(reader)
    if not rows:
        raise ex.CliError(f"{path}: no runs")
    return rows


def points(rows: Sequence[Mapping[str, str]], workload: str) -> dict[float, dict[str, Point]]:
    """load -> policy -> (mean JCT, p99 JCT), each averaged over the seeds."""
    sums: dict[tuple[float, str], list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r["workload"] == workload:
            try:
                sums[(float(r["load"]), r["policy"])].append(
                    (float(r["mean_jct"]), float(r["p99_jct"]))
                )
            except ValueError:
                where = f"{r['policy']}, load {r['load']}, seed {r['seed']}"
                raise ex.CliError(f"runs.csv: {where}: a value is not a number") from None
    out: dict[float, dict[str, Point]] = defaultdict(dict)
    for (load, policy), vals in sums.items():
        n = len(vals)
        out[load][policy] = (sum(v[0] for v in vals) / n, sum(v[1] for v in vals) / n)
    return dict(sorted(out.items()))


def family_members(policies: Sequence[str], family: str) -> list[tuple[float, str]]:
    """(parameter value, spec) of every spec ``family=X`` (X a number), by X."""
    prefix = family + "="
    members = []
    for p in policies:
        if p.startswith(prefix):
            try:
                members.append((float(p[len(prefix) :]), p))
            except ValueError:
                continue
    return sorted(members)


def pareto(at: Mapping[str, Point]) -> list[str]:
    """The policies no other beats on both metrics (at least as good on each, better on
    one), by mean JCT."""
    front = [
        p
        for p, (m, q) in at.items()
        if not any(m2 <= m and q2 <= q and (m2, q2) != (m, q) for m2, q2 in at.values())
    ]
    return sorted(front, key=lambda p: (at[p], p))


def reaches_both(at: Mapping[str, Point]) -> list[str]:
    """The policies whose mean and p99 are each at most the best of all the others."""
    return [
        p
        for p, (m, q) in at.items()
        if all(m <= m2 for o, (m2, _) in at.items() if o != p)
        and all(q <= q2 for o, (_, q2) in at.items() if o != p)
    ]


def report(curves: Mapping[float, Mapping[str, Point]], workload: str) -> str:
    lines = [f"# Mean / p99 JCT trade-off: {workload}", ""]
    rows = []
    for load, at in curves.items():
        front = pareto(at)
        both = reaches_both(at)
        rows.append(
            [
                f"{load:g}",
                ", ".join(f"{p} ({at[p][0]:.1f} / {at[p][1]:.1f})" for p in front),
                ", ".join(both) if both else "none",
            ]
        )
    header = ["load", "Pareto front: policy (mean / p99 JCT, s)", "best on both"]
    lines.append(md_table(header, rows))
    return "\n".join(lines) + "\n"


FAMILY_COLOURS = ("grey", "tab:olive", "tab:cyan", "tab:pink")
"""The line of each ``--family``, in the order given (the policies' own markers use the
default colour cycle)."""


TOPAS_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
"""The markers of TOPAS's specs, in name order: all black, each its own shape."""


def point_styles(policies: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The plot keywords of each policy drawn as a point: TOPAS's specs (``topas...``)
    black, each with its own marker; the others the default colour cycle's markers."""
    styles: dict[str, dict[str, Any]] = {}
    tops = 0
    for i, p in enumerate(policies):
        if p.startswith("topas"):
            marker = TOPAS_MARKERS[tops % len(TOPAS_MARKERS)]
            styles[p] = {"color": "black", "marker": marker, "ms": 6, "zorder": 5}
            tops += 1
        else:
            style = ex.line_style(i)
            style.pop("lw", None)
            styles[p] = style
    return styles


def plot(
    curves: Mapping[float, Mapping[str, Point]], workload: str, families: Sequence[str] = ()
) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = list(curves)
    cols = min(3, len(loads))
    rows = -(-len(loads) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols, 4.2 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[len(loads) :]:
        ax.axis("off")
    for ax, load in zip(flat, loads, strict=False):
        at = curves[load]
        lined: set[str] = set()
        for k, family in enumerate(families):
            members = family_members(list(at), family)
            colour = FAMILY_COLOURS[k % len(FAMILY_COLOURS)]
            xs = [at[s][0] for _, s in members]
            ys = [at[s][1] for _, s in members]
            ax.plot(xs, ys, "-", color=colour, lw=1, marker=".", label=family)
            for (value, _), x, y in zip(members, xs, ys, strict=True):
                ax.annotate(f"{value:g}", (x, y), fontsize=7, color=colour)
            lined.update(s for _, s in members)
        for p, style in point_styles(sorted(p for p in at if p not in lined)).items():
            ax.plot(*at[p], linestyle="none", label=p, **style)
        _zoom(ax, at, lined)
        ax.set_title(f"{workload}, load {load:g}")
        ax.set_xlabel("mean JCT (s)")
        ax.set_ylabel("p99 JCT (s)")
        ax.grid(alpha=0.3)
    handles, labels = flat[len(loads) - 1].get_legend_handles_labels()
    if len(flat) > len(loads):  # a spare panel: the legend there, off the data
        flat[len(loads)].legend(handles, labels, fontsize=8, loc="center")
    else:
        flat[len(loads) - 1].legend(handles, labels, fontsize=7, loc="upper right")
    fig.tight_layout()
    png = ex.figure_png(fig)
    plt.close(fig)
    return png


def _zoom(ax: Any, at: Mapping[str, Point], family: Collection[str]) -> None:
    """Axes around the Pareto front, the families, TOPAS and the other policies' best mean
    and best p99 (10% margin): a policy far behind on both metrics is left off the chart
    rather than squeezing the rest."""
    tops = {p for p in at if p.startswith("topas")}
    others = [p for p in at if p not in family and p not in tops]
    best = {min(others, key=lambda p: (at[p][k], p)) for k in (0, 1)} if others else set()
    shown = [at[p] for p in {*pareto(at), *family, *tops, *best}]
    for lo, hi, setter in (
        (min(x for x, _ in shown), max(x for x, _ in shown), ax.set_xlim),
        (min(y for _, y in shown), max(y for _, y in shown), ax.set_ylim),
    ):
        pad = 0.1 * (hi - lo) or 0.01 * hi or 1.0
        setter(lo - pad, hi + pad)


def main(argv: Sequence[str]) -> int:
    ap = ex.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="a study's output folder (with runs.csv)")
    ap.add_argument("--workload", help="the workload to plot (default: the study's only one)")
    ap.add_argument(
        "--family",
        action="append",
        default=[],
        help="SPEC:PARAM: join the specs SPEC:PARAM=X by a line (repeat for more families)",
    )
    ap.add_argument("--out", help="the PNG to write (default: FOLDER/frontier.png)")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    rows = read_runs(folder)
    workloads = sorted({r["workload"] for r in rows})
    workload = args.workload
    if workload is None:
        if len(workloads) != 1:
            raise ex.CliError(f"--workload: the study has {', '.join(workloads)}; name one")
        workload = workloads[0]
    elif workload not in workloads:
        raise ex.CliError(f"--workload: {workload!r} is not in the study ({', '.join(workloads)})")
    curves = points(rows, workload)
    policies = sorted({r["policy"] for r in rows})
    for family in args.family:
        if not family_members(policies, family):
            raise ex.CliError(f"--family: no spec {family}=X among the study's policies")
    out = Path(args.out) if args.out else folder / "frontier.png"
    if out.suffix != ".png":
        raise ex.CliError(f"--out: a .png file expected, got {str(out)!r}")
    if not out.parent.is_dir():
        raise ex.CliError(f"--out: no such folder {str(out.parent)!r}")
    text = report(curves, workload)
    write_atomic(out, plot(curves, workload, args.family))
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(ex.run_cli(main))
