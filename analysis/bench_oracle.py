"""Oracle scaling: the largest instance each backend proves optimal within a time limit.

For every backend (cpsat, cbc, highs) and every workload family, instances grow
(``small_instance`` with 2, 3, 4, ... tasks, so about 4-5 more stages per task) until the
backend fails to prove optimality within ``--time-limit`` seconds on ``--threads`` threads.
A size counts as proven when the instances of all ``--seeds`` seeds are. Every backend
solves the same instances with the same warm start (the best baseline's step schedule).
Prints the table family x backend -> largest number of stages proven, and the time it took; writes
results/bench_oracle/{config.json, runs.csv, summary.md}.

    python analysis/bench_oracle.py [--time-limit 60] [--threads 2] [--seeds 2]
        [--backends cpsat,cbc,highs] [--families chain,fanout] [--max-tasks 8]
    python analysis/bench_oracle.py --quick      # 5 s, 1 seed, up to 3 tasks: a smoke test

Instance seeds follow the gap study (``topas.studies.gap.instance_seed``): seed index ``k`` with
``n`` tasks uses ``seed * 1_000_000 + n * 1_000 + k``. "Proven" means the oracle reported
``optimal`` within the limit (``topas.studies.gap.is_proven``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topas.instance import write_atomic
from topas.oracle import BACKENDS, solve
from topas.policies import BASELINES
from topas.runs import best_schedule, policy_objectives
from topas.studies.gap import DEFAULT_FAMILIES, instance_seed, is_proven
from topas.workloads import get_workload, small_instance

COLUMNS = (
    "family",
    "backend",
    "tasks",
    "seed",
    "stages",
    "agents",
    "status",
    "proven",
    "objective",
    "lower_bound",
    "warm_objective",
    "runtime_s",
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--families", default=",".join(DEFAULT_FAMILIES))
    ap.add_argument("--time-limit", type=float, default=None, help="seconds (default 60)")
    ap.add_argument("--threads", type=int, default=2, help="solver threads (default 2)")
    ap.add_argument("--seeds", type=int, default=None, help="instances per size (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="base seed")
    ap.add_argument("--min-tasks", type=int, default=2)
    ap.add_argument("--max-tasks", type=int, default=None, help="largest size tried (default 8)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 5 s, 1 seed, up to 3 tasks")
    ap.add_argument("--out", default="results/bench_oracle", help="output folder")
    return ap


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings; ValueError naming a bad option."""
    quick = args.quick
    time_limit = args.time_limit if args.time_limit is not None else (5.0 if quick else 60.0)
    seeds = args.seeds if args.seeds is not None else (1 if quick else 2)
    max_tasks = args.max_tasks if args.max_tasks is not None else (3 if quick else 8)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    if not backends:
        raise ValueError("--backends: none given")
    for b in backends:
        if b not in BACKENDS:
            raise ValueError(f"--backends: unknown {b!r}; choose from {', '.join(BACKENDS)}")
    if not families:
        raise ValueError("--families: none given")
    for f in families:
        get_workload(f)
    if not time_limit > 0:
        raise ValueError("--time-limit: must be > 0")
    if seeds < 1 or args.threads < 1 or args.seed < 0:
        raise ValueError("--seeds and --threads must be >= 1, --seed >= 0")
    if not 1 <= args.min_tasks <= max_tasks:
        raise ValueError("--min-tasks/--max-tasks: need 1 <= min <= max")
    return {
        "backends": backends,
        "families": families,
        "time_limit": time_limit,
        "threads": args.threads,
        "seeds": seeds,
        "seed": args.seed,
        "min_tasks": args.min_tasks,
        "max_tasks": max_tasks,
        "quick": quick,
    }


def run(cfg: dict[str, Any], log: Any = sys.stderr) -> list[dict[str, Any]]:
    """Grow instances per family until each backend fails; one row per solve."""
    rows: list[dict[str, Any]] = []
    for family in cfg["families"]:
        alive = set(cfg["backends"])
        for n in range(cfg["min_tasks"], cfg["max_tasks"] + 1):
            if not alive:
                break
            failed: set[str] = set()
            for k in range(cfg["seeds"]):
                seed = instance_seed(cfg["seed"], n, k)
                inst = small_instance(family, seed=seed, num_tasks=n)
                _, warm_obj, warm = best_schedule(policy_objectives(inst, BASELINES, seed=seed))
                for backend in cfg["backends"]:
                    if backend not in alive:
                        continue
                    r = solve(
                        inst,
                        backend=backend,
                        time_limit=cfg["time_limit"],
                        threads=cfg["threads"],
                        warm_start=warm,
                    )
                    proven = is_proven(r)
                    rows.append(
                        {
                            "family": family,
                            "backend": backend,
                            "tasks": n,
                            "seed": seed,
                            "stages": inst.num_stages,
                            "agents": len(inst.agents),
                            "status": r.status,
                            "proven": proven,
                            "objective": r.objective,
                            "lower_bound": r.lower_bound,
                            "warm_objective": warm_obj,
                            "runtime_s": round(r.runtime, 3),
                        }
                    )
                    print(
                        f"{family:12s} {backend:6s} tasks={n} seed={seed} "
                        f"stages={inst.num_stages:3d} {r.status:9s} "
                        f"{'proven' if proven else 'unproven'} {r.runtime:6.1f} s",
                        file=log,
                        flush=True,
                    )
                    if not proven:
                        failed.add(backend)
            alive -= failed
    return rows


def table(rows: Sequence[dict[str, Any]], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Per family x backend: the largest size proven on every seed, and the first failure."""
    out = []
    for family in cfg["families"]:
        for backend in cfg["backends"]:
            mine = [r for r in rows if r["family"] == family and r["backend"] == backend]
            sizes = sorted({r["tasks"] for r in mine})
            best = None
            fail = None
            for n in sizes:
                at = [r for r in mine if r["tasks"] == n]
                if all(r["proven"] for r in at):
                    best = at
                else:
                    fail = at
                    break
            any_proven = [r["stages"] for r in mine if r["proven"]]
            out.append(
                {
                    "family": family,
                    "backend": backend,
                    "tasks": best[0]["tasks"] if best else None,
                    "stages": max(r["stages"] for r in best) if best else None,
                    "stages_range": _range([r["stages"] for r in best]) if best else "-",
                    "time_s": max(r["runtime_s"] for r in best) if best else None,
                    "first_unproven": (
                        f"{fail[0]['tasks']} tasks ({_range([r['stages'] for r in fail])} stages)"
                        if fail
                        else f"none up to {cfg['max_tasks']} tasks"
                    ),
                    "largest_single": max(any_proven) if any_proven else None,
                }
            )
    return out


def _range(xs: Sequence[int]) -> str:
    lo, hi = min(xs), max(xs)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def format_table(summary: Sequence[dict[str, Any]]) -> str:
    header = [
        "family",
        "backend",
        "largest proven: stages",
        "tasks",
        "time (s)",
        "first unproven",
        "largest single proven",
    ]
    body = [
        [
            s["family"],
            s["backend"],
            "-" if s["stages"] is None else str(s["stages"]) + f" ({s['stages_range']})",
            "-" if s["tasks"] is None else str(s["tasks"]),
            "-" if s["time_s"] is None else f"{s['time_s']:.1f}",
            s["first_unproven"],
            "-" if s["largest_single"] is None else str(s["largest_single"]),
        ]
        for s in summary
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow(["" if r[c] is None else r[c] for c in COLUMNS])
    return buf.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        cfg = resolve(args)
    except ValueError as e:
        print(f"bench_oracle: error: {e}", file=sys.stderr)
        return 2
    command = shlex.join(["python", "analysis/bench_oracle.py", *argv])
    t0 = time.perf_counter()
    rows = run(cfg)
    summary = table(rows, cfg)
    text = format_table(summary)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    md = "\n".join(
        [
            "# Oracle scaling: largest instance proven optimal",
            "",
            f"Reproduce with: `{command}`",
            "",
            f"- time limit {cfg['time_limit']:g} s, {cfg['threads']} solver thread(s), "
            f"{cfg['seeds']} seed(s) per size (a size counts when every seed is proven), "
            f"tasks {cfg['min_tasks']}..{cfg['max_tasks']}; machine: {machine}",
            f"- total wall time {time.perf_counter() - t0:.0f} s",
            "- 'largest proven: stages' is the most stages among the instances of the "
            "largest size proven on every seed (their range in brackets); 'time' the "
            "longest solve at that size; 'largest single proven' any instance proven.",
            "",
            text,
            "",
        ]
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "config.json", json.dumps({**cfg, "command": command}, indent=1) + "\n")
    write_atomic(out / "runs.csv", to_csv(rows))
    write_atomic(out / "summary.md", md)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
