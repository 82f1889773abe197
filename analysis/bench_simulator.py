"""Simulator speed: a 1,000-task metagpt-sop instance at high load, every baseline.

Each run happens in a fresh process (one at a time, so on one core) so that its peak
resident memory can be read on its own. Prints wall time, simulated iterations per
second, policy calls and peak RSS per policy; writes results/bench_simulator/ too.

    python analysis/bench_simulator.py [--tasks 1000] [--load 1.0] [--policies fcfs,lpm]

Target (issue 2): <= 10 s per run on one core.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from topas.policies import BASELINES, make_policy
from topas.schedule import evaluate
from topas.simulator import simulate
from topas.workloads import generate


def one_run(workload: str, tasks: int, load: float, seed: int, spec: str) -> dict:
    inst = generate(workload, num_tasks=tasks, seed=seed, load=load)
    t0 = time.perf_counter()
    sched = simulate(inst, make_policy(spec), timing="calibrated", seed=seed)
    wall = time.perf_counter() - t0
    m = evaluate(sched)
    return {
        "policy": spec,
        "wall_s": wall,
        "iterations": sched.iterations,
        "iterations_per_s": sched.iterations / wall,
        "policy_calls": len(sched.decision_times_s),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "stages": inst.num_stages,
        "mean_jct_s": m.mean_jct,
        "p99_jct_s": m.p99_jct,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="metagpt-sop")
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default=",".join(BASELINES))
    ap.add_argument("--out", default="results/bench_simulator")
    args = ap.parse_args()
    specs = [s for s in args.policies.split(",") if s]
    print(
        f"{args.workload}: {args.tasks} tasks, load {args.load}, seed {args.seed}, "
        f"calibrated timing; python {platform.python_version()} on {platform.machine()}"
    )
    header = (
        f"{'policy':<8} {'wall (s)':>9} {'iter/s':>10} {'iterations':>11} "
        f"{'calls':>7} {'peak RSS (MiB)':>15} {'mean JCT (s)':>13}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for spec in specs:
        with ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1) as pool:
            row = pool.submit(
                one_run, args.workload, args.tasks, args.load, args.seed, spec
            ).result()
        rows.append(row)
        print(
            f"{spec:<8} {row['wall_s']:>9.2f} {row['iterations_per_s']:>10.0f} "
            f"{row['iterations']:>11} {row['policy_calls']:>7} {row['peak_rss_mib']:>15.0f} "
            f"{row['mean_jct_s']:>13.1f}",
            flush=True,
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(vars(args), indent=1) + "\n")
    (out / "runs.json").write_text(json.dumps(rows, indent=1) + "\n")
    worst = max(r["wall_s"] for r in rows)
    print(f"\nslowest run: {worst:.2f} s (target <= 10 s per run)")


if __name__ == "__main__":
    main()
