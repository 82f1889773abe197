"""The plugin's cost per scheduling round, in SGLang's own objects on the CPU.

A real ``UnifiedRadixCache`` (Python tree core) holds the agents' prompts; ``N`` tagged
requests of a ``metagpt-sop`` instance (the first stage of ``N + 8`` tasks, built as
``topas serve-bench`` sends them) wait, 8 run. Each round adds one untagged request to
the queue, so that nothing is reused and every round is planned afresh (in a server an
unchanged queue reuses the last plan), and calls the hooked
``SchedulePolicy.calc_priority``, as the scheduler does. With ``--kinds queue`` nothing
tagged changes between rounds, so the observed state is the last one with a new clock;
with ``churn`` (:data:`ROUNDS`) requests finish, start, arrive and decode between rounds,
as in a busy server. Reported per planned round:

- ``plan``: the controller's own CPU time (``time.thread_time`` around ``plan_round``):
  reading the requests, building the observed state, the policy's decision, the queue
  order and the eviction ranks;
- ``calc_priority``: wall time of the whole hooked call, SGLang's lpm ordering (its prefix
  match of every waiting request) included;
- ``sglang lpm``: the same call on a cache without TOPAS (SGLang as it ships), for scale.

The time budget is off (``budget_ms=0``) unless ``--budget-ms`` is given: the figures are
what a plan costs, not what the budget lets through. ``--schedule`` is SGLang's
``--schedule-policy`` under the plugin: ``lpm`` (default, as the README's launch line),
whose prefix match walks every waiting request's prompt in the tree first, or ``fcfs``.
``--flush-mb N`` writes N MB before each round, so that the plan starts with cold CPU
caches as after a walk of the tree or a forward pass (a diagnostic: 0, off, by default).

A second part replays whole ``metagpt-sop`` instances through SGLang's scheduler objects
(:mod:`topas_sglang.cpu_loop`, half the KV budget so that a queue builds up, ``topas``,
budget off), where most rounds find nothing changed and reuse the last plan, and reports
the plugin's wall time per ``calc_priority`` call and per planned round, and the queue
lengths the planned rounds saw. ``--replays TASKS:LOAD,...`` (default ``100:1.5,200:2``,
about 3 and 9 minutes); instance seed 1000, a tuning seed: this measures cost, not JCT.

    .venv-sglang/bin/python integration/sglang/bench_plan.py [--waiting 20,100,400]
        [--policies topas,topas-greedy] [--kinds queue,churn] [--rounds 200] [--budget-ms 0]
        [--schedule lpm] [--flush-mb 0] [--replays 100:1.5,200:2] [--out DIR]

Writes ``DIR/{summary.md, runs.csv, config.json}`` when ``--out`` is given.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from topas.studies import StudyParams, md_table, study_files, write_outputs

RUNNING = 8


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


SCHEDULES = ("lpm", "fcfs")
"""SGLang's schedule policies the bench runs the plugin under (``--schedule``)."""


def bench_instance(tasks: int):  # type: ignore[no-untyped-def]
    """The bench's workload: ``tasks`` metagpt-sop tasks (:func:`setup` queues their first
    stages)."""
    from topas.workloads import generate

    return generate("metagpt-sop", num_tasks=tasks, seed=5, load=1.0)


def setup(  # type: ignore[no-untyped-def]
    waiting: int,
    eviction: str,
    spare: int = 0,
    schedule: str = "lpm",
    kv_tokens: int = 400_000,
    offload: bool = False,
) -> tuple[Any, Any, list, Any, list]:
    """(cache of ``kv_tokens`` (its TOPAS controller planning in a planner process:
    ``offload``), SGLang's schedule policy (``schedule``), waiting requests, running batch,
    ``spare`` more requests of new tasks to arrive later)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    from topas.serve_bench import prefix_ids, stage_payload
    from topas_sglang.cpu_loop import insert_prompt, make_cache, payload_req

    inst = bench_instance(waiting + RUNNING + spare)
    prompts = prefix_ids(inst)
    cache = make_cache(eviction, kv_tokens, 512, offload=offload)
    for ids in prompts.values():
        insert_prompt(cache, ids)
    reqs = [payload_req(stage_payload(inst, t, t.topo_order[0], prompts)) for t in inst.tasks]
    for i, req in enumerate(reqs):  # queued in task order, as the scheduler stamps on entry
        req.time_stats.wait_queue_entry_time = 1.0 + i
    policy = SchedulePolicy(schedule, cache, False, False, False)
    queued = reqs[RUNNING : RUNNING + waiting]
    return cache, policy, queued, ScheduleBatch(reqs=reqs[:RUNNING]), reqs[RUNNING + waiting :]


ROUNDS = ("queue", "churn")
"""What changes between two planned rounds of the bench: ``queue``, only an untagged
request joins the queue (every tagged request is as it was); ``churn``, in addition, a
running request finishes (with SGLang's finish signal), the head of the queue joins the
batch, a new task's request joins the queue, and every running request decodes a token,
as between two rounds of a busy server."""


def measure(
    waiting: int,
    spec: str | None,
    rounds: int,
    budget_ms: float,
    kind: str = "queue",
    schedule: str = "lpm",
    flush_mb: int = 0,
    offload: bool = False,
    gap_ms: float = 0.0,
) -> dict[str, float]:
    """Per-round figures (ms) for one queue length and policy (None: SGLang alone), with
    the changes between rounds that ``kind`` names (:data:`ROUNDS`), under SGLang's
    ``schedule`` policy, each round after writing ``flush_mb`` MB (cold CPU caches), with
    the plans made in a planner process (``offload``), ``gap_ms`` ms of sleep after each
    round (as a forward pass takes; the planner works meanwhile)."""
    from topas_sglang.cpu_loop import payload_req
    from topas_sglang.retention import controller_of

    spare = rounds + 20 if kind == "churn" else 0
    cache, policy, queue, running, arrivals = setup(
        waiting, "lru" if spec is None else "topas", spare, schedule, offload=offload
    )
    junk = bytearray(flush_mb << 20)
    for i, req in enumerate(arrivals):  # they join the queue after the first ones
        req.time_stats.wait_queue_entry_time = 1.0 + RUNNING + waiting + i
    controller = controller_of(cache)
    plan_cpu: list[float] = []
    if controller is not None:
        controller.policy_spec, controller.budget_ms = spec, budget_ms
        plan_cpu = _timed(controller)
    base = None
    gc.collect()  # the garbage of earlier configurations is not collected in this one's
    walls = []  # rounds (a full collection of SGLang's heap takes about half a second)
    for i in range(rounds + 20):  # the first 20 rounds warm up (policy tables, caches)
        if kind == "churn":
            _churn(queue, running.reqs, arrivals[i], controller)
        plain = {"rid": f"x{i}", "input_ids": [1, 2, i], "sampling_params": {"max_new_tokens": 1}}
        q = [*queue, payload_req(plain)]  # untagged: SGLang's order, a changed queue
        if junk:
            junk[:] = bytes(len(junk))  # every cache line written: the caches are cold
        t = time.perf_counter()
        policy.calc_priority(q, running)
        walls.append(time.perf_counter() - t)
        if gap_ms:
            time.sleep(gap_ms / 1e3)
        if i == 19:
            walls.clear()
            plan_cpu.clear()
            base = None if controller is None else dataclasses.replace(controller.stats)
    out = {"calc_priority_p50_ms": 1e3 * statistics.median(walls)}
    if plan_cpu:
        out.update(
            plan_p50_ms=1e3 * statistics.median(plan_cpu),
            plan_p99_ms=1e3 * _quantile(plan_cpu, 0.99),
            plan_mean_ms=1e3 * statistics.mean(plan_cpu),
        )
    if offload and controller is not None and base is not None:
        st = controller.stats
        plans = st.plans - base.plans
        out.update(
            planner_ms=1e3 * (st.planner_s - base.planner_s) / max(1, plans),
            lag=(st.lag - base.lag) / max(1, plans),
            sent=(st.rounds - base.rounds) / rounds,
        )
        controller.close()
    return out


def _churn(queue: list, running: list, arrival: Any, controller: Any) -> None:  # type: ignore[no-untyped-def]
    """One round's changes under ``churn`` (:data:`ROUNDS`)."""
    done = running.pop(0)
    if controller is not None:
        controller.stage_finished(done)  # SGLang's signal, from the cache's on_release
    running.append(queue.pop(0))
    queue.append(arrival)
    for req in running:
        req.output_ids.append(0)


REPLAY_SEED = 1000
REPLAY_KV = 0.5


def replay_cost(tasks: int, load: float, offload: bool = False) -> dict[str, float]:
    """The plugin's cost per call and per planned round over one CPU-loop replay (with the
    plans made in a planner process: ``offload``)."""
    from topas.workloads import generate
    from topas_sglang.controller import Controller
    from topas_sglang.cpu_loop import replay
    from topas_sglang.offload import Offloaded

    inst = generate("metagpt-sop", num_tasks=tasks, seed=REPLAY_SEED, load=load)
    seen: list[int] = []
    cls = Offloaded if offload else Controller  # the class whose plan_round SGLang's hook calls
    plan = cls.plan_round

    def counted(self, cache, waiting, running, now):  # type: ignore[no-untyped-def]
        seen.append(len(waiting))
        return plan(self, cache, waiting, running, now)

    cls.plan_round = counted  # type: ignore[method-assign]
    try:
        kv = int(inst.server.kv_capacity_tokens * REPLAY_KV)
        result = replay(inst, "topas", kv_tokens=kv, offload=offload)
    finally:
        cls.plan_round = plan  # type: ignore[method-assign]
    st = result.stats
    calls = st.rounds + st.reused
    return {
        "tasks": tasks, "load": load, "calls": calls, "planned": st.rounds,
        "ms_per_call": 1e3 * st.decide_s / max(1, calls),
        "ms_per_planned": 1e3 * st.decide_s / max(1, st.rounds),
        "waiting_mean": statistics.mean(seen) if seen else 0.0,
        "waiting_max": max(seen, default=0), "offload": offload,
        "planner_ms": 1e3 * st.planner_s / max(1, st.plans), "lag": st.lag / max(1, st.plans),
    }  # fmt: skip


def _timed(controller: Any) -> list[float]:  # type: ignore[no-untyped-def]
    """Wrap ``controller.plan_round`` to record its CPU time per call; returns the list."""
    times: list[float] = []
    plan: Callable = controller.plan_round

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        t = time.thread_time()
        out = plan(*args, **kwargs)
        times.append(time.thread_time() - t)
        return out

    controller.plan_round = timed
    return times


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waiting", default="20,100,400", help="queue lengths, comma-separated")
    ap.add_argument("--policies", default="topas,topas-greedy", help="TOPAS policy specs")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--kinds", default=",".join(ROUNDS), help="what changes between rounds")
    ap.add_argument("--budget-ms", type=float, default=0.0, help="0: no time budget")
    ap.add_argument("--schedule", default="lpm", choices=SCHEDULES,
                    help="SGLang's --schedule-policy under the plugin")  # fmt: skip
    ap.add_argument("--flush-mb", type=int, default=0, help="MB written before each round")
    ap.add_argument("--replays", default="100:1.5,200:2", help="TASKS:LOAD,... ('': none)")
    ap.add_argument(
        "--offload",
        action="store_true",
        help="also measure each policy planning in a planner process",
    )
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="ms of sleep after each round (a forward pass)")  # fmt: skip
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in args.waiting.split(",") if x]
    except ValueError:
        print(f"error: --waiting: integers expected, got {args.waiting!r}", file=sys.stderr)
        return 2
    if (not sizes or min(sizes) < 1 or args.rounds < 1 or args.budget_ms < 0
            or args.flush_mb < 0 or not args.gap_ms >= 0):  # fmt: skip
        print("error: --waiting and --rounds must be >= 1, --budget-ms, --gap-ms and "
            "--flush-mb >= 0",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        replays = [
            (int(t), float(x)) for t, x in (r.split(":") for r in args.replays.split(",") if r)
        ]
    except ValueError:
        print(f"error: --replays: TASKS:LOAD pairs expected, got {args.replays!r}", file=sys.stderr)
        return 2
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or not set(kinds) <= set(ROUNDS):
        print(f"error: --kinds: some of {','.join(ROUNDS)} expected, got {args.kinds!r}",
              file=sys.stderr)  # fmt: skip
        return 2
    from topas_sglang.cpu_loop import load_plugin

    load_plugin()
    specs = [s for s in args.policies.split(",") if s]
    modes = (False, True) if args.offload else (False,)
    rows = []
    for kind in kinds:
        for n in sizes:
            under = {"schedule": args.schedule, "flush_mb": args.flush_mb, "gap_ms": args.gap_ms}
            base = measure(n, None, args.rounds, 0.0, kind, **under)["calc_priority_p50_ms"]
            for spec, offload in itertools.product(specs, modes):
                row = {"round": kind, "waiting": n, "policy": spec, "offload": offload,
                       "sglang_lpm_p50_ms": base}  # fmt: skip
                row.update(measure(n, spec, args.rounds, args.budget_ms, kind, **under,
                                   offload=offload))  # fmt: skip
                rows.append(row)
                print(f"{kind}, {n} waiting, {spec}{', offload' * offload}: plan p50 "
                      f"{row['plan_p50_ms']:.3f} ms", file=sys.stderr)  # fmt: skip
    replayed = []
    for (tasks, load), offload in itertools.product(replays, modes):
        replayed.append(replay_cost(tasks, load, offload))
        print(f"replay {tasks} tasks at load {load}: {replayed[-1]}", file=sys.stderr)
    command = shlex.join(["python", "integration/sglang/bench_plan.py", *argv])
    text = summary_md(rows, command, args.schedule, args.flush_mb, args.gap_ms, args.offload)
    text += replay_md(replayed, args.offload)
    if args.out:
        params = StudyParams({"waiting": sizes, "policies": specs, "rounds": args.rounds,
                              "kinds": kinds, "schedule": args.schedule,
                              "flush_mb": args.flush_mb, "offload": args.offload,
                              "gap_ms": args.gap_ms,
                              "budget_ms": args.budget_ms, "replays": args.replays,
                              "replay_seed": REPLAY_SEED, "replay_kv": REPLAY_KV})  # fmt: skip
        files = study_files("plugin plan cost", params.to_json(), command, rows, text)
        write_outputs(Path(args.out), files)
    print(text, end="")
    return 0


def add_planning(
    header: list[str],
    body: list[list],
    rows: Sequence[dict[str, Any]],
    at: int,
    planner: dict[str, Callable[[dict[str, Any]], str]],
) -> None:
    """Adds a ``planning`` column at ``at`` (where each row planned) and, at the end, the
    ``planner`` columns (filled only for rows planned in a planner process)."""
    header[at:at] = ["planning"]
    header += list(planner)
    for line, r in zip(body, rows, strict=True):
        line[at:at] = ["planner process" if r["offload"] else "in the scheduler"]
        line += [cell(r) if r["offload"] else "" for cell in planner.values()]


def summary_md(
    rows: Sequence[dict[str, Any]],
    command: str,
    schedule: str = "lpm",
    flush_mb: int = 0,
    gap_ms: float = 0.0,
    offload: bool = False,
) -> str:
    header = ["round", "waiting", "policy", "plan p50 (ms CPU)", "plan p99", "plan mean",
              "calc_priority p50 (ms wall)",
              f"SGLang's {schedule} alone p50 (ms wall)"]  # fmt: skip
    body = [
        [r["round"], r["waiting"], f"`{r['policy']}`", f"{r['plan_p50_ms']:.3f}",
         f"{r['plan_p99_ms']:.3f}",
         f"{r['plan_mean_ms']:.3f}", f"{r['calc_priority_p50_ms']:.3f}",
         f"{r['sglang_lpm_p50_ms']:.3f}"]
        for r in rows
    ]  # fmt: skip
    if offload:
        add_planning(header, body, rows, 3, {
            "planner per plan (ms CPU)": lambda r: f"{r['planner_ms']:.3f}",
            "rounds sent": lambda r: f"{100 * r['sent']:.0f}%",
            "lag (rounds)": lambda r: f"{r['lag']:.2f}",
        })  # fmt: skip
    if schedule == "lpm":
        under = (
            "(SGLang's lpm ordering included); SGLang's lpm alone: the same call without "
            "TOPAS. Beyond 128 waiting requests SGLang's lpm turns into FCFS and matches no "
            "prefix (`WAITING_QUEUE_PREFIX_MATCH_MAX`, "
            "sglang/srt/managers/schedule_policy.py:137), hence its near-zero cost at 400."
        )
    else:
        under = f"(SGLang's {schedule} ordering included); SGLang's {schedule} alone: the "
        under += "same call without TOPAS."
    flush = f" {flush_mb} MB written before each round (cold CPU caches)." if flush_mb else ""
    if gap_ms:
        flush += f" {gap_ms:g} ms of sleep after each round (a forward pass)."
    if offload:
        flush += (
            " With the planning in a planner process (`topas_sglang.offload`), `plan` is the "
            "scheduler's share (a snapshot sent when the planner has answered the last one, "
            "the newest plan applied); `planner per plan` the planner's own CPU time, "
            "`rounds sent` the share of rounds whose snapshot was sent, `lag` how many "
            "rounds that changed something passed between a snapshot and its plan's "
            "arrival (0: it came back before the next one, which applied it)."
        )
    return "\n".join([
        "# The plugin's cost per planned round (SGLang 0.5.23 objects, CPU)",
        "",
        f"Command: `{command}`",
        "",
        "Every round planned afresh, 8 requests running, metagpt-sop first stages "
        "waiting; time budget off. Between two rounds (`round`): `queue`, one untagged "
        "request joins the queue and nothing tagged changes; `churn`, besides, a running "
        "request finishes (SGLang's finish signal), the head of the queue joins the batch, "
        "a new task's request joins the queue and every running request decodes a token. "
        f"SGLang's schedule policy: `{schedule}`.{flush} `plan`: the "
        "controller's CPU time per round; `calc_priority`: the whole hooked call "
        f"{under}",
        "",
        md_table(header, body),
        "",
    ])  # fmt: skip


def replay_md(rows: Sequence[dict[str, Any]], offload: bool = False) -> str:
    from topas_sglang.controller import DEFAULT_POLICY  # the replay's policy

    if not rows:
        return ""
    header = ["tasks", "load", "calc_priority calls", "planned", "ms per call (wall)",
              "ms per planned round", "waiting (mean / max)"]  # fmt: skip
    body = [
        [r["tasks"], r["load"], r["calls"],
         f"{r['planned']} ({100 * r['planned'] / max(1, r['calls']):.0f}%)",
         f"{r['ms_per_call']:.3f}", f"{r['ms_per_planned']:.2f}",
         f"{r['waiting_mean']:.0f} / {r['waiting_max']}"]
        for r in rows
    ]  # fmt: skip
    if offload:
        add_planning(header, body, rows, 2, {
            "planner per plan (ms CPU)": lambda r: f"{r['planner_ms']:.3f}",
            "lag (rounds)": lambda r: f"{r['lag']:.2f}",
        })  # fmt: skip
    return "\n".join([
        "",
        "## Replays: the cost per round as SGLang calls it",
        "",
        f"`metagpt-sop` through the CPU loop (SGLang's scheduler objects), the plugin with "
        f"its default policy (`{DEFAULT_POLICY}`), half the KV budget, seed {REPLAY_SEED}, "
        "budget off. Most calls find nothing changed and reuse the last plan. With the "
        "planner process the replay waits for its answer after each iteration (as a "
        "forward pass would give it time), so each plan is applied one round late.",
        "",
        md_table(header, body),
        "",
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
