"""Scheduler in the loop: SGLang 0.5.23's own scheduling objects, with and without TOPAS.

Each workload is replayed through SGLang's real ``SchedulePolicy`` (lpm), the scheduler's
``PrefillAdder`` class, a ``UnifiedRadixCache`` over real token pools and its retraction
order, with the calibrated timing model in place of the GPU
(``integration/sglang/topas_sglang/cpu_loop.py``). It is replayed twice: with SGLang as it
ships (``lru`` eviction: every plugin hook passes SGLang's result through), then with
``--radix-eviction-policy topas`` (the plugin's default policy) planning in the scheduler
(``{"offload": false}``: this loop charges nothing for planning time, so it shows what the
decisions do), and with ``--offload`` a third time with the plugin planning in a planner
process (``{"offload": true}``, the plugin's default in a server; the replay gives the
planner each iteration's time, so every plan is applied one round late).
Needs SGLang: run it in ``.venv-sglang``.

    .venv-sglang/bin/python analysis/sglang_in_the_loop.py [--workloads ...]
        [--tasks 20] [--load 1.2] [--kv-scale 1] [--seeds 5] [--token-scale 1]
        [--offload] [--policies SPECS] [--tuning] [--out results/sglang_in_the_loop]

``--policies`` replays each instance once more per spec with the plugin planning that
spec in the scheduler (rows ``plugin:SPEC``), in a second table paired against ``lru`` and
against the plugin's default. Tuning seeds (1000 on) are refused unless ``--tuning`` (a
run for choosing defaults; its summary says so), as by every other study.

Writes summary.md (paired changes of TOPAS against plain SGLang, 95% CI over seeds) and
runs.csv, and prints the summary (about 2 minutes with the defaults on 2 cores, after
SGLang's import).
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from topas.studies import md_table, rows_to_csv, write_outputs
from topas.workloads import WORKLOADS, generate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex  # noqa: E402

MODES = ("lru", "topas")  # plain SGLang, then the plugin
OFFLOAD = "topas-offload"  # the plugin planning in a planner process (--offload)
SPEC = "plugin:"  # a mode that runs the plugin with another policy spec (--policies)
METRICS = ("mean_jct", "p99_jct", "hit_rate")


def run_one(
    workload: str,
    tasks: int,
    load: float,
    kv_scale: float,
    seed: int,
    mode: str,
    token_scale: float = 1.0,
) -> dict:
    from topas_sglang.cpu_loop import replay

    inst = generate(workload, num_tasks=tasks, seed=seed, load=load, token_scale=token_scale)
    kv = int(inst.server.kv_capacity_tokens * kv_scale)
    start = time.perf_counter()
    if mode.startswith(SPEC):  # the plugin, planning in the scheduler, with that spec
        r = replay(inst, "topas", kv_tokens=kv, policy_spec=mode.removeprefix(SPEC))
    else:
        r = replay(inst, mode.removesuffix("-offload"), kv_tokens=kv, offload=mode == OFFLOAD)
    wall = time.perf_counter() - start
    stats = r.stats
    return {
        "workload": workload, "tasks": tasks, "load": load, "kv_tokens": kv, "seed": seed,
        "policy": mode,
        "mean_jct": r.mean_jct, "p99_jct": r.quantile(0.99), "hit_rate": r.hit_rate,
        "retractions": r.retractions, "iterations": r.iterations, "wall_s": wall,
        "plans": stats.rounds if stats else 0, "reused_plans": stats.reused if stats else 0,
        "reordered": stats.reordered if stats else 0, "held": stats.held if stats else 0,
        "fallbacks": stats.fallbacks if stats else 0,
        "plan_ms": 1e3 * stats.decide_s / max(1, stats.rounds) if stats else 0.0,
    }  # fmt: skip


def summary(rows: Sequence[dict], command: str, tuning: bool = False) -> str:
    body = []
    for w in dict.fromkeys(r["workload"] for r in rows):
        point = ex.select(rows, workload=w)
        cells = [w]
        for m in METRICS[:2]:
            change, half = ex.paired_change(point, {"policy": "topas"}, {"policy": "lru"}, m)
            cells.append(f"{ex.fmt_s(ex.mean_of(ex.select(point, policy='lru'), m))} → "
                         f"{ex.fmt_s(ex.mean_of(ex.select(point, policy='topas'), m))} "
                         f"({ex.fmt_change(change, half)}%)")  # fmt: skip
        hits = [ex.mean_of(ex.select(point, policy=p), "hit_rate") for p in MODES]
        cells.append(f"{hits[0]:.3f} → {hits[1]:.3f}")
        topas = ex.select(point, policy="topas")
        plans = sum(r["plans"] for r in topas)
        cells.append(f"{sum(r['reordered'] for r in topas)}/{plans}")
        cells.append(str(sum(r["held"] for r in topas)))
        cells.append(f"{ex.mean_of(topas, 'plan_ms'):.2f}")
        body.append(cells)
    header = ["workload", "mean JCT s (change)", "p99 JCT s (change)", "prompt hit rate",
              "reordered plans", "held", "ms per plan"]  # fmt: skip
    if any(r["policy"] == OFFLOAD for r in rows):
        header += ["planner process: mean JCT s (change)", "p99 JCT s (change)"]
        for cells, w in zip(body, dict.fromkeys(r["workload"] for r in rows), strict=True):
            cells += offload_cells(ex.select(rows, workload=w))
    text = f"`{command}`\n\n" + "".join(f"{line}\n" for line in ex.tuning_lines({"tuning": tuning}))
    text += md_table(header, body) + "\n"
    specs = [p for p in dict.fromkeys(r["policy"] for r in rows) if p.startswith(SPEC)]
    if specs:
        text += "\n" + spec_table(rows, specs)
    return text


def spec_table(rows: Sequence[dict], modes: Sequence[str]) -> str:
    """The plugin with each other spec (``--policies``), paired against SGLang as it ships
    (``lru``) and against the plugin's default spec (``topas``), per workload."""
    body = []
    for w in dict.fromkeys(r["workload"] for r in rows):
        point = ex.select(rows, workload=w)
        for mode in modes:
            cells = [w, f"`{mode.removeprefix(SPEC)}`"]
            for m in METRICS[:2]:
                mine = ex.fmt_s(ex.mean_of(ex.select(point, policy=mode), m))
                vs = [ex.paired_change(point, {"policy": mode}, {"policy": o}, m) for o in MODES]
                cells.append(f"{mine} ({'; '.join(ex.fmt_change(c, h) + '%' for c, h in vs)})")
            own = ex.select(point, policy=mode)
            cells += [str(sum(r["held"] for r in own)), str(sum(r["fallbacks"] for r in own))]
            body.append(cells)
    header = ["workload", "plugin spec", "mean JCT s (vs lru; vs topas)",
              "p99 JCT s (vs lru; vs topas)", "held", "fallbacks"]  # fmt: skip
    return (
        "The plugin with other policy specs (`--policies`), planning in the scheduler, "
        "paired against SGLang as it ships (`lru`) and against the plugin's default spec "
        "(`topas` above, `topas-greedy`):\n\n" + md_table(header, body) + "\n"
    )


def offload_cells(point: Sequence[dict]) -> list[str]:
    """Mean and p99 JCT with the planner process, paired against the plugin planning in
    the scheduler."""
    cells = []
    for m in METRICS[:2]:
        change, half = ex.paired_change(point, {"policy": OFFLOAD}, {"policy": "topas"}, m)
        cells.append(f"{ex.fmt_s(ex.mean_of(ex.select(point, policy=OFFLOAD), m))} "
                     f"({ex.fmt_change(change, half)}%)")  # fmt: skip
    return cells


def main(argv: Sequence[str]) -> int:
    p = ex.Parser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--tasks", default="20")
    p.add_argument("--load", default="1.2")
    p.add_argument("--kv-scale", default="1", help="KV budget / the workload's (default 1)")
    p.add_argument("--seeds", default="5")
    p.add_argument("--token-scale", default="1", help="divides every token count (default 1)")
    p.add_argument(
        "--offload",
        action="store_true",
        help="also replay with the plugin planning in a planner process",
    )
    p.add_argument(
        "--policies",
        default=None,
        help="other policy specs for the plugin, each replayed too (e.g. topas,topas:drain_load=0)",
    )
    p.add_argument("--tuning", action="store_true", help="allow tuning seeds (to choose defaults)")
    p.add_argument("--out", default="results/sglang_in_the_loop")
    a = p.parse_args(argv)
    workloads = ex.parse_workloads(a.workloads)
    tasks = ex.parse_positive_int(a.tasks, "--tasks")
    load = ex.parse_positive_float(a.load, "--load")
    kv_scale = ex.parse_positive_float(a.kv_scale, "--kv-scale")
    seeds = ex.study_seeds(a)
    token_scale = ex.parse_positive_float(a.token_scale, "--token-scale")
    specs = [] if a.policies is None else ex.parse_policies(a.policies, "--policies")
    out = ex.check_out(a.out)
    try:
        from topas_sglang.cpu_loop import load_plugin
    except ImportError as e:
        raise ex.CliError(f"needs sglang==0.5.23 (run it in .venv-sglang): {e}") from None
    load_plugin()
    modes = (*MODES, OFFLOAD) if a.offload else MODES
    modes += tuple(SPEC + spec for spec in specs)
    jobs = [(w, s, m) for w in workloads for s in seeds for m in modes]
    rows = [
        run_one(w, tasks, load, kv_scale, s, m, token_scale)
        for w, s, m in tqdm(jobs, desc="replays")
    ]
    command = "python analysis/sglang_in_the_loop.py " + shlex.join(argv)
    text = summary(rows, command.strip(), a.tuning)
    write_outputs(out, {"summary.md": text, "runs.csv": rows_to_csv(rows)})
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(ex.run_cli(main))
