"""The gap study's picture: rendering only, apart from the study's computations."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np


def plot_gaps(rows: Sequence[dict[str, Any]], specs: Sequence[str]) -> bytes:
    """Box plot of the gap (%) per policy over proven instances, with the points; unproven
    instances as vertical bars from the low to the high end of their interval (PNG)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(5.0, 1.2 * len(specs) + 2), 4.2), layout="constrained")
    ax = fig.add_subplot()
    rng = np.random.default_rng(0)
    data = [[r["gap_pct"] for r in rows if r["policy"] == s and r["proven"]] for s in specs]
    positions = list(range(1, len(specs) + 1))
    nonempty = [(p, d) for p, d in zip(positions, data, strict=True) if d]
    if nonempty:
        ax.boxplot(
            [d for _, d in nonempty],
            positions=[p for p, _ in nonempty],
            widths=0.5,
            showfliers=False,
        )
    for p, d in zip(positions, data, strict=True):
        if d:
            x = p + rng.uniform(-0.15, 0.15, size=len(d))
            ax.scatter(x, d, s=12, alpha=0.6, color="tab:blue", zorder=3)
    labelled = False
    for p, spec in zip(positions, specs, strict=True):
        for r in rows:
            if r["policy"] != spec or r["proven"]:
                continue
            x = p + 0.3 + rng.uniform(-0.05, 0.05)
            ax.vlines(
                x,
                r["gap_pct_low"],
                r["gap_pct_high"],
                color="tab:red",
                alpha=0.6,
                label=None if labelled else "unproven: gap interval",
            )
            labelled = True
    ax.set_xticks(positions, list(specs), rotation=20, ha="right")
    ax.set_ylabel("gap to optimum (%)")
    ax.set_title("Online policies vs the clairvoyant oracle (step model)")
    ax.axhline(0, color="grey", lw=0.8)
    if labelled:
        ax.legend(loc="upper left", fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    return buf.getvalue()
