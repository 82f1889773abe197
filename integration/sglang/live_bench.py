"""Live bench: TOPAS and SGLang's own policies in the real SGLang server on the CPU.

For each workload, policy and scheduler loop (overlap on or off) it starts the real
``sglang.launch_server`` with the fake model (``topas_sglang.fake_server``:
``--max-total-tokens`` = the instance's KV budget, chunked prefill at SGLang's default,
the Python radix-tree core for every policy), replays the instance against it
(``topas serve-bench``: one HTTP request per stage, sent when its dependencies finish)
and stops it. Policies: ``topas`` (the plugin with the search), ``lpm`` (SGLang's
``--schedule-policy lpm``, LRU eviction) and ``lru`` (SGLang's defaults: ``fcfs`` with LRU
eviction); ``topas-greedy`` (the single-pass scorer) and ``topas-offload`` /
``topas-greedy-offload`` (planning in a planner process) on request. Beside each live run, the
simulator's JCTs on the same instance with the matching policy (``topas``,
``topas-greedy``, ``lpm``, ``fcfs``; calibrated timing), and the plugin's own counters
from the server log (planned rounds, planning time per call, requests held back,
fallbacks).

    .venv-sglang/bin/python integration/sglang/live_bench.py [--quick] [--seeds 20,21]
        [--workloads metagpt-sop,fanout] [--tasks 6] [--token-scale 8]
        [--policies topas,lpm,lru] [--overlap on,off] [--time-scale 1]
        [--noise 0.1] [--port 0] [--topas-schedule lpm] [--out results/live_bench]

``--topas-schedule``: SGLang's ``--schedule-policy`` under the plugin (``lpm``, as the
README's launch line, or ``fcfs``, as SGLang's defaults that ``lru`` runs).
``--seeds``: the instances' seeds, by default 20 and 21, two of the reporting seeds (20
onwards) that no default was tuned on. ``--quick`` (part of ``make test``): metagpt-sop,
4 tasks, seed 20, ``topas`` and ``lru``, overlap on; about two minutes. Writes
``{summary.md, runs.csv, config.json}`` and one ``topas-result/1`` file per live run
(``timing: live``) into ``--out``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topas.instance import Instance
from topas.results import write_result
from topas.runs import run_policy
from topas.serve_bench import run_live
from topas.studies import StudyParams, md_table, study_files, write_outputs
from topas.workloads import generate
from topas_sglang.controller import stats_from_log
from topas_sglang.fake_server import FakeServer

OFFLOAD = "-offload"

SIMULATED = {"topas": "topas", "topas-greedy": "topas-greedy", "lpm": "lpm", "lru": "fcfs"}
SIMULATED |= {p + OFFLOAD: SIMULATED[p] for p in ("topas", "topas-greedy")}
"""The simulator's policy beside each live one (``-offload``: the same spec planning in a
planner process, :mod:`topas_sglang.offload`)."""

SGLANG_SIDE = {"lpm": ("lpm", "lru"), "lru": ("fcfs", "lru")}
"""SGLang's own policies: (schedule policy, eviction policy)."""

DEFAULTS = {
    "workloads": "metagpt-sop,fanout",
    "tasks": "6",
    "policies": "topas,lpm,lru",
    "overlap": "on,off",
    "seeds": "20,21",
}
QUICK = {
    "workloads": "metagpt-sop",
    "tasks": "4",
    "policies": "topas,lru",
    "overlap": "on",
    "seeds": "20",
}


def server_for(
    policy: str, max_total_tokens: int, overlap: bool, label: str, args: argparse.Namespace
) -> FakeServer:
    if policy in SGLANG_SIDE:
        schedule, eviction = SGLANG_SIDE[policy]
    else:
        schedule, eviction = args.topas_schedule, policy.removesuffix(OFFLOAD)
    return FakeServer(
        port=args.port,
        max_total_tokens=max_total_tokens,
        policy=eviction,
        schedule_policy=schedule,
        overlap=overlap,
        time_scale=args.time_scale,
        noise=args.noise,
        offload=policy.endswith(OFFLOAD),
        log_path=Path(args.out) / f"server-{label}.log",
    )


def live_run(  # type: ignore[no-untyped-def]
    inst: Instance, workload: str, seed: int, policy: str, overlap: bool, args
) -> dict[str, Any]:
    label = f"{workload}-s{seed}-{policy}-{'overlap' if overlap else 'normal'}"
    server = server_for(policy, inst.server.kv_capacity_tokens, overlap, label, args)
    t0 = time.perf_counter()
    with server:
        started = time.perf_counter() - t0
        t1 = time.perf_counter()
        metrics, doc = run_live(inst, server.url, policy, seed=0, timeout=args.timeout)
        runtime = time.perf_counter() - t1
    write_result(doc, str(Path(args.out) / f"{label}.json"))
    stats = stats_from_log(server.log_path.read_text(errors="replace")) if server.log_path else {}
    return {
        "workload": workload,
        "seed": seed,
        "policy": policy,
        "overlap": overlap,
        "tasks": len(inst.tasks),
        "kv_capacity_tokens": inst.server.kv_capacity_tokens,
        "live_mean_jct": metrics.mean_jct,
        "live_p99_jct": metrics.p99_jct,
        "live_makespan": metrics.makespan,
        "startup_s": round(started, 1),
        "bench_s": round(runtime, 1),
        "rounds": stats.get("rounds"),
        "decide_ms_per_call": stats.get("decide_ms_per_call"),
        "decide_cpu_ms_per_call": stats.get("decide_cpu_ms_per_call"),
        "held": stats.get("held"),
        "fallbacks": stats.get("fallbacks"),
        "over_budget": stats.get("over_budget"),
        "planner_ms_per_plan": (
            1e3 * stats["planner_s"] / stats["plans"] if stats.get("plans") else None
        ),
    }


def simulated(inst: Instance, policy: str) -> tuple[float, float]:
    metrics, _ = run_policy(inst, SIMULATED[policy], "calibrated", seed=0)
    return metrics.mean_jct, metrics.p99_jct


def summary_md(rows: Sequence[dict[str, Any]], command: str) -> str:
    header = [
        "workload", "seed", "policy", "loop", "live mean / p99 (s)", "simulated mean / p99 (s)",
        "live / simulated (mean)", "plugin ms per call", "plugin CPU ms per call", "rounds",
        "over budget", "held", "fallbacks", "planner ms per plan",
    ]  # fmt: skip
    body = []
    for r in rows:
        ms = r["decide_ms_per_call"]
        body.append([
            r["workload"], r["seed"], f"`{r['policy']}`", "overlap" if r["overlap"] else "normal",
            f"{r['live_mean_jct']:.2f} / {r['live_p99_jct']:.2f}",
            f"{r['sim_mean_jct']:.2f} / {r['sim_p99_jct']:.2f}",
            f"{r['live_mean_jct'] / r['sim_mean_jct']:.2f}",
            "-" if ms is None else f"{ms:.2f}",
            "-" if r.get("decide_cpu_ms_per_call") is None
            else f"{r['decide_cpu_ms_per_call']:.2f}",
            "-" if r["rounds"] is None else int(r["rounds"]),
            "-" if r["over_budget"] is None else int(r["over_budget"]),
            "-" if r["held"] is None else int(r["held"]),
            "-" if r["fallbacks"] is None else int(r["fallbacks"]),
            "-" if r.get("planner_ms_per_plan") is None else f"{r['planner_ms_per_plan']:.2f}",
        ])  # fmt: skip
    return "\n".join([
        "# Live bench: the real SGLang 0.5.23 server on the CPU, fake model",
        "",
        f"Command: `{command}`",
        "",
        "Each row: one server started with the policy (SGLang's own policies on its Python "
        "radix-tree core, like TOPAS), the instance replayed over HTTP (`topas serve-bench`), "
        "JCTs in seconds of wall clock. Simulated: the calibrated simulator on the same "
        "instance with the matching policy (`lru` -> `fcfs`). The plugin's counters are its "
        "last `topas stats` log line (at powers of two and every 20 planned rounds; "
        "`-`: no TOPAS); `plugin ms per call` is wall clock per planned round, `plugin CPU "
        "ms per call` the scheduler thread's CPU time in it (`time.thread_time`; the rest "
        "is time the thread waited for a CPU). `topas-offload`: `topas` planning in a "
        "planner process (`topas_sglang.offload`); its `plugin ms per call` is the "
        "scheduler's share per snapshot sent, "
        "`planner ms per plan` the planner's CPU time per plan.",
        "",
        md_table(header, body),
        "",
    ])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    for key in DEFAULTS:
        ap.add_argument(f"--{key}", default=None)
    ap.add_argument("--token-scale", type=float, default=8.0)
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--port", type=int, default=0, help="0: a free port per server")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out", default="results/live_bench")
    ap.add_argument(
        "--topas-schedule",
        default="lpm",
        choices=("lpm", "fcfs"),
        help="SGLang's --schedule-policy under the plugin (its order for untagged requests)",
    )
    args = ap.parse_args(argv)
    base = QUICK if args.quick else DEFAULTS
    pick = {k: (getattr(args, k) or base[k]) for k in DEFAULTS}
    workloads = [w for w in pick["workloads"].split(",") if w]
    policies = [p for p in pick["policies"].split(",") if p]
    unknown = [p for p in policies if p not in SIMULATED]
    if unknown:
        print(
            f"error: --policies: unknown {', '.join(unknown)} (valid: {', '.join(SIMULATED)})",
            file=sys.stderr,
        )
        return 2
    loops = {"on": True, "off": False}
    overlaps = [loops[o] for o in pick["overlap"].split(",") if o]
    try:
        seeds = [int(x) for x in pick["seeds"].split(",") if x]
    except ValueError:
        print(f"error: --seeds: integers expected, got {pick['seeds']!r}", file=sys.stderr)
        return 2
    params = StudyParams({
        "workloads": workloads, "tasks": int(pick["tasks"]), "policies": policies,
        "overlap": overlaps, "token_scale": args.token_scale, "load": args.load,
        "time_scale": args.time_scale, "noise": args.noise, "seeds": seeds,
        "topas_schedule": args.topas_schedule,
    })  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "integration/sglang/live_bench.py", *argv])
    rows = []
    for w in workloads:
        for seed in seeds:
            inst = generate(
                w, num_tasks=params["tasks"], seed=seed, load=args.load,
                token_scale=args.token_scale,
            )  # fmt: skip
            for p in policies:
                sim_mean, sim_p99 = simulated(inst, p)
                for overlap in overlaps:
                    row = live_run(inst, w, seed, p, overlap, args)
                    row.update(sim_mean_jct=sim_mean, sim_p99_jct=sim_p99)
                    print(
                        f"{w} seed {seed} {p} {'overlap' if overlap else 'normal'}: live mean "
                        f"{row['live_mean_jct']:.2f} s (simulated {sim_mean:.2f} s)",
                        file=sys.stderr,
                    )
                    rows.append(row)
    text = summary_md(rows, command)
    write_outputs(out, study_files("live bench", params.to_json(), command, rows, text))
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
