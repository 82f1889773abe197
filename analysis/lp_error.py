"""Error of topas's E[longest path] approximation against Monte Carlo.

``topas`` (topas/policies/search.py) takes a task's expected longest remaining path
``E[LP(G, Z)]`` as the mean over ``SCENARIOS`` scenarios of the longest path, each stage's
service scaled by its learned ratio at a stratified level of its own
(``scenario_levels``). This script measures how far that is from the Monte-Carlo estimate
with independent per-stage ratios, when actual / predicted service is log-normal(0,
sigma) (the shape of ``--prediction-error``), for every task of a generated instance with
every stage waiting (``error = approximation / Monte Carlo - 1``), and does the same for
the first version's comonotone scenarios (one ratio per (agent, role) at each of the
quantiles 0.1, 0.3, ..., 0.9), which it replaced.

    python analysis/lp_error.py [--workloads dag-4,dag-10-wide,metagpt-sop,metagpt-tl]
        [--sigmas 0.25,0.5,1.0] [--tasks 40] [--samples 4000] [--seed 1000]

Prints a table (workload, sigma, mean / p90 / max |error| in %, and the mean signed error)
and writes it to results/lp_error/summary.md. Deterministic for a seed.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from statistics import NormalDist

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex  # noqa: E402

from topas.instance import Task  # noqa: E402
from topas.policies.search import SCENARIOS, role_of, scenario_levels  # noqa: E402
from topas.studies import md_table, write_outputs  # noqa: E402
from topas.timing import predictor  # noqa: E402
from topas.workloads import generate  # noqa: E402

COMONOTONE = (0.1, 0.3, 0.5, 0.7, 0.9)
"""The quantiles of the first version's scenarios (comonotone: every stage at the same)."""


def longest_paths(task: Task, services: np.ndarray) -> np.ndarray:
    """Longest path of ``task`` for each row of ``services`` (samples x stages, in the
    task's stage order), vectorised over samples."""
    index = {s.id: i for i, s in enumerate(task.stages)}
    finish = np.zeros_like(services)
    for sid in task.topo_order:
        i = index[sid]
        deps = [index[d] for d in task.stage_by_id[sid].deps]
        start = finish[:, deps].max(axis=1) if deps else 0.0
        finish[:, i] = start + services[:, i]
    return finish.max(axis=1)


def task_errors(
    task: Task, server, sigma: float, samples: int, rng: np.random.Generator
) -> tuple[float, float]:
    """``(stratified, comonotone)``: each approximation / Monte Carlo - 1 for one task."""
    base = np.array(
        [
            predictor(server, "calibrated").service_s(s.input_tokens, s.output_tokens)
            for s in task.stages
        ]
    )
    ratios = rng.lognormal(0.0, sigma, size=(samples, len(base)))
    mc = float(longest_paths(task, base * ratios).mean())
    inv = NormalDist().inv_cdf
    levels = np.array([scenario_levels(task.id, s.id) for s in task.stages]).T  # S x stages
    strat = np.exp(sigma * np.vectorize(inv)(levels))
    q = np.array([math.exp(sigma * inv(p)) for p in COMONOTONE])
    keys = [(s.agent, role_of(s.id)) for s in task.stages]
    como = np.array([[q[k] for _ in keys] for k in range(len(q))])
    return (
        float(longest_paths(task, base * strat).mean()) / mc - 1.0,
        float(longest_paths(task, base * como).mean()) / mc - 1.0,
    )


def main(argv: Sequence[str]) -> int:
    ap = ex.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="dag-4,dag-10-wide,metagpt-sop,metagpt-tl")
    ap.add_argument("--sigmas", default="0.25,0.5,1.0")
    ap.add_argument("--tasks", default="40")
    ap.add_argument("--samples", default="4000")
    ap.add_argument("--seed", default="1000")
    ap.add_argument("--out", default="results/lp_error")
    args = ap.parse_args(argv)
    workloads = ex.parse_workloads(args.workloads)
    sigmas = ex.parse_floats(args.sigmas, "--sigmas", 0.0, strict=True)
    tasks = ex.parse_positive_int(args.tasks, "--tasks")
    samples = ex.parse_positive_int(args.samples, "--samples")
    seed = ex.parse_int_list(args.seed, "--seed", ex.TUNING_SEED_MIN)[0]
    out = ex.check_out(args.out)
    rows = []
    for w in workloads:
        inst = generate(w, num_tasks=tasks, seed=seed)
        for sigma in sigmas:
            rng = np.random.default_rng([seed, round(sigma * 1000)])
            both = np.array([task_errors(t, inst.server, sigma, samples, rng) for t in inst.tasks])
            row = [w, f"{sigma:g}"]
            for errs in (both[:, 0], both[:, 1]):
                a = np.abs(errs) * 100
                row += [f"{a.mean():.1f}", f"{np.percentile(a, 90):.1f}", f"{a.max():.1f}",
                        f"{errs.mean() * 100:+.1f}"]  # fmt: skip
            rows.append(row)
    command = shlex.join(["python", "analysis/lp_error.py", *argv])
    stats = ["mean abs %", "p90 abs %", "max abs %", "mean signed %"]
    table = md_table(
        ["workload", "sigma", *(f"stratified: {x}" for x in stats),
         *(f"comonotone: {x}" for x in stats)],
        rows,
    )  # fmt: skip
    text = (
        "# E[longest path]: quantile scenarios against Monte Carlo\n\n"
        f"Command: `{command}`\n\n"
        f"{tasks} tasks per workload (seed {seed}), every stage waiting; services are the "
        "calibrated predictions times log-normal(0, sigma) ratios; Monte Carlo with "
        f"{samples} independent samples per task. Stratified (topas): the mean over "
        f"{SCENARIOS} scenarios, each stage at its own stratified level; comonotone (the "
        "first version): the mean over the quantiles "
        f"{', '.join(f'{q:g}' for q in COMONOTONE)}, one ratio per (agent, role). "
        "Negative: the approximation is lower.\n\n" + table + "\n"
    )
    write_outputs(out, {"summary.md": text})
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(ex.run_cli(main))
