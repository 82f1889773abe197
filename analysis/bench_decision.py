"""Decision time of a policy's ``decide(state)`` as the waiting queue grows (topas vs lpm).

A serving loop, not one state decided again and again (policies cache per-task analyses
across calls): per configuration (policy, agents, waiting stages N) it builds a calibrated
instance of small task DAGs (2-5 stages, chains and fan-outs, agents drawn at random;
prefixes of 1-4K tokens; a KV budget holding about a third of the prefixes plus a batch;
``max_running=64``), releases tasks until N stages wait, and then repeats: time
``policy.decide(state)`` (``time.perf_counter_ns``), apply the decision, finish the loads it
started, complete one running stage, release tasks until N stages wait again, advance the
clock (the stage to complete is drawn at random, among those that ready no child while N
or more wait, so that the queue stays at N). After each step the state passes the
simulator's debug invariants. Single process.

    python analysis/bench_decision.py [--policies topas,lpm] [--agents 8,64]
        [--waiting 10,100,1000,10000] [--decisions 200] [--decisions-large 50]
        [--warmup 20] [--repeat 1] [--quick] [--out results/bench_decision]

``--repeat K``: the whole plan K times in turn (every configuration once per round, so a
slow moment of a shared machine hits one round of each, not every run of one); a
configuration's p50, p99 and mean are the medians of its K runs, its max the largest, and
its K p50s are listed beside them. The decisions are deterministic: every round must make
the same ones (the same prefix sets scored and stages admitted), else the bench fails.

``--quick``: 10 and 100 waiting, 10 decisions after 3 warm-up ones (for tests). ``lpm``
specs also run at 128 waiting, the largest queue SGLang's LPM still sorts in full.
Prints a table (policy, agents, waiting, p50/p99 ms), the growth of p50 per 10x of
waiting and the topas/lpm ratio; writes results/bench_decision/{summary.md, runs.json}.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import inspect
import itertools
import json
import math
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from topas.instance import Agent, Instance, ServerSpec, Stage, Task, write_atomic
from topas.kv import sglang_kv_need
from topas.policies import Policy, PolicyContext, make_policy, split_specs
from topas.state import (
    Decision,
    Phase,
    PrefixStatus,
    State,
    TaskInfo,
    apply_inplace,
    check_invariants,
    complete_stage,
    prefix_ready,
    task_arrives,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex  # noqa: E402

MAX_RUNNING = 64
PREFIX_RANGE = (1024, 4096)  # tokens of an agent's prefix, uniform
INPUT_RANGE = (64, 512)  # a stage's own input tokens, uniform
OUTPUT_RANGE = (16, 256)  # a stage's output tokens, uniform (predicted exactly)
STAGES_RANGE = (2, 5)  # stages per task, uniform
PREFIX_SHARE = 1 / 3  # the KV budget holds this share of all prefixes ...
STEP_S = 0.05  # simulated seconds between two decisions (one completion each)
LPM_SORT_LIMIT = 128  # SGLang's WAITING_QUEUE_PREFIX_MATCH_MAX: lpm sorts up to this
SORT_ALL = "max_sorted=1000000000"  # lpm's reference run sorts whatever the queue
LARGE = 5000  # from this many waiting on, --decisions-large decisions are timed
DEFAULT_POLICIES = ("topas", "lpm")
DEFAULT_AGENTS = (8, 64)
DEFAULT_WAITING = (10, 100, 1000, 10000)
QUICK_WAITING = (10, 100)


class BenchError(RuntimeError):
    """The harness or a policy broke the model (an infeasible decision, a stall)."""


# --------------------------------------------------------------------------- the workload


def make_agents(n: int, rng: np.random.Generator) -> tuple[Agent, ...]:
    return tuple(
        Agent(f"a{i:02d}", int(rng.integers(*PREFIX_RANGE, endpoint=True))) for i in range(n)
    )


def make_server(agents: Sequence[Agent]) -> ServerSpec:
    """KV for a third of the prefixes plus a batch of ``MAX_RUNNING`` average stages (and
    never less than the largest prefix with the largest stage); calibrated default costs."""
    mean_stage = (sum(INPUT_RANGE) + sum(OUTPUT_RANGE)) / 2
    total = sum(a.prefix_tokens for a in agents)
    largest = max(a.prefix_tokens for a in agents) + INPUT_RANGE[1] + OUTPUT_RANGE[1]
    kv = max(math.ceil(PREFIX_SHARE * total + MAX_RUNNING * mean_stage), largest)
    return ServerSpec(kv_capacity_tokens=kv, chunk_tokens=2048, max_running=MAX_RUNNING)


def make_task(tid: str, rng: np.random.Generator, agents: Sequence[Agent]) -> Task:
    """A chain or a fan-out (root, parallel middle, join) of 2-5 stages, random agents."""
    n = int(rng.integers(*STAGES_RANGE, endpoint=True))
    fanout = n >= 3 and bool(rng.integers(2))
    stages = []
    for k in range(n):
        if k == 0:
            deps: tuple[str, ...] = ()
        elif not fanout:
            deps = (f"s{k - 1}",)
        elif k < n - 1:
            deps = ("s0",)
        else:
            deps = tuple(f"s{j}" for j in range(1, n - 1))
        agent = agents[int(rng.integers(len(agents)))].id
        inp = int(rng.integers(*INPUT_RANGE, endpoint=True))
        out = int(rng.integers(*OUTPUT_RANGE, endpoint=True))
        stages.append(Stage(f"s{k}", agent, inp, out, deps))
    return Task(tid, 0.0, tuple(stages))


def task_stream(seed: int, agents: Sequence[Agent]) -> Iterator[Task]:
    rng = np.random.default_rng([seed, 1])
    i = 0
    while True:
        yield make_task(f"t{i:06d}", rng, agents)
        i += 1


def make_instance(num_agents: int, seed: int = 0, tasks: int = 4) -> Instance:
    """The server, the agents and the first ``tasks`` tasks of the stream (validated)."""
    agents = make_agents(num_agents, np.random.default_rng([seed, 0]))
    stream = task_stream(seed, agents)
    first = tuple(next(stream) for _ in range(tasks))
    return Instance(make_server(agents), agents, first, name=f"bench-{num_agents}-agents")


# --------------------------------------------------------------------------- the loop


class ServingLoop:
    """A State driven the way the calibrated engine drives it, with stage ends drawn at
    random instead of simulated: the policy sees a fresh, consistent state at each call."""

    def __init__(self, instance: Instance, waiting: int, seed: int = 0) -> None:
        self.instance = instance
        self.target = waiting
        self.rng = np.random.default_rng([seed, 2])
        self.tasks = task_stream(seed, instance.agents)
        # SGLang's reservation, as the calibrated engine commits it
        kv_need = sglang_kv_need(
            lambda ref: self.state.stage(ref),
            lambda agent: self.state.prefixes[agent].tokens,
            instance.server.kv_capacity_tokens,
        )
        self.state = State.initial(instance, kv_need)
        self.released = 0
        self.refill()

    def refill(self) -> None:
        """Release tasks (one per millisecond of release time) until N stages wait."""
        st = self.state
        while len(st.waiting) < self.target:
            task = next(self.tasks)
            task_arrives(st, TaskInfo.of(task, st.time))
            self.released += 1

    def _readies(self, ref: tuple[str, str]) -> bool:
        """Would completing ``ref`` make a child of it ready?"""
        st = self.state
        task = st.tasks[ref[0]]
        return any(
            all(d == ref[1] or st.phase[(ref[0], d)] == Phase.DONE for d in task.stages[c].deps)
            for c in task.stages[ref[1]].children
        )

    def step(self, decision: Decision) -> None:
        """Apply ``decision``, finish its loads, complete a stage, refill, advance time."""
        st = self.state
        if not isinstance(decision, Decision):
            raise BenchError(f"decide returned {type(decision).__name__}, not Decision")
        try:
            apply_inplace(st, decision)
        except ValueError as e:
            raise BenchError(f"infeasible decision at t={st.time:g}: {e}") from None
        for agent, p in st.prefixes.items():
            if p.status == PrefixStatus.LOADING:
                prefix_ready(st, agent)
        running = [r for r in st.running if st.phase[r] == Phase.RUNNING]
        if not running:
            raise BenchError(f"stalled at t={st.time:g}: nothing runs, {len(st.waiting)} wait")
        st.time += STEP_S
        if len(st.waiting) >= self.target:  # hold the queue at N: end a stage readying none
            running = [r for r in running if not self._readies(r)] or running
        ref = running[int(self.rng.integers(len(running)))]
        complete_stage(st, ref, st.time - (st.running[ref].started_at or st.time))
        self.refill()
        check_invariants(st)


@dataclass(frozen=True)
class Run:
    """Decision times of one configuration, in milliseconds."""

    policy: str
    agents: int
    waiting: int
    decisions: int
    warmup: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    mean_waiting: float  # stages waiting at the timed decisions
    max_waiting: int
    mean_running: float
    mean_admitted: float  # stages admitted per timed decision
    mean_evaluated: float | None  # prefix sets scored per decision (None: no search)
    max_evaluated: int | None
    tasks_released: int
    kv_capacity_tokens: int
    repeats: int = 1  # runs of this configuration (--repeat): the times are their medians
    p50_runs_ms: tuple[float, ...] = ()  # each run's p50 (with --repeat > 1)


def bench_one(
    spec: str, agents: int, waiting: int, decisions: int, warmup: int, seed: int = 0
) -> Run:
    """Time ``decisions`` calls of ``spec``'s ``decide`` after ``warmup`` untimed ones."""
    inst = make_instance(agents, seed)
    loop = ServingLoop(inst, waiting, seed)
    policy: Policy = make_policy(spec)
    policy.reset(PolicyContext(server=inst.server, timing="calibrated", seed=seed))
    st = loop.state
    times, queued, running, admitted, evaluated = [], [], [], [], []
    gc.collect()
    for i in range(warmup + decisions):
        if len(st.waiting) < waiting:
            raise BenchError(f"{len(st.waiting)} stages wait, expected at least {waiting}")
        n_wait, n_run = len(st.waiting), len(st.running)
        t0 = time.perf_counter_ns()
        d = policy.decide(st)
        dt = time.perf_counter_ns() - t0
        loop.step(d)
        if i >= warmup:
            times.append(dt / 1e6)
            queued.append(n_wait)
            running.append(n_run)
            admitted.append(len(d.admit))
            if hasattr(policy, "evaluated"):  # the search says how many sets it scored
                evaluated.append(policy.evaluated)
    arr = np.array(times)
    return Run(
        policy=spec,
        agents=agents,
        waiting=waiting,
        decisions=decisions,
        warmup=warmup,
        p50_ms=float(np.percentile(arr, 50)),
        p99_ms=float(np.percentile(arr, 99)),
        mean_ms=float(arr.mean()),
        max_ms=float(arr.max()),
        mean_waiting=float(np.mean(queued)),
        max_waiting=int(max(queued)),
        mean_running=float(np.mean(running)),
        mean_admitted=float(np.mean(admitted)),
        mean_evaluated=float(np.mean(evaluated)) if evaluated else None,
        max_evaluated=max(evaluated) if evaluated else None,
        tasks_released=loop.released,
        kv_capacity_tokens=inst.server.kv_capacity_tokens,
    )


@dataclass(frozen=True)
class Config:
    policies: tuple[str, ...]
    agents: tuple[int, ...]
    waiting: tuple[int, ...]
    decisions: int
    decisions_large: int
    warmup: int
    seed: int = 0
    repeat: int = 1

    def plan(self) -> list[tuple[str, tuple[int, ...]]]:
        """(spec, queue sizes) to run: every policy at every size, and each lpm spec also at
        its sorting limit with the sort forced on (the queue can pass 128 by a few stages
        when a completion readies children, and lpm would then fall back to FCFS)."""
        out = [(spec, self.waiting) for spec in self.policies]
        for spec in self.policies:
            name, _, params = spec.partition(":")
            if name == "lpm" and "max_sorted" not in params:
                forced = f"{spec},{SORT_ALL}" if params else f"lpm:{SORT_ALL}"
                out.append((forced, (LPM_SORT_LIMIT,)))
        return out

    def decisions_at(self, waiting: int) -> int:
        return self.decisions_large if waiting >= LARGE else self.decisions


def run_bench(cfg: Config, progress: bool = True) -> list[Run]:
    keys = [
        (spec, agents, n)
        for spec, sizes in cfg.plan()
        for agents, n in itertools.product(cfg.agents, sizes)
    ]
    rounds: dict[tuple[str, int, int], list[Run]] = {k: [] for k in keys}
    for i in range(cfg.repeat):
        for spec, agents, n in keys:
            run = bench_one(spec, agents, n, cfg.decisions_at(n), cfg.warmup, cfg.seed)
            rounds[spec, agents, n].append(run)
            if progress:
                tag = f" (round {i + 1} of {cfg.repeat})" if cfg.repeat > 1 else ""
                print(
                    f"  {spec} agents={agents} waiting={n}: p50 {run.p50_ms:.3f} ms, "
                    f"p99 {run.p99_ms:.3f} ms{tag}",
                    file=sys.stderr,
                    flush=True,
                )
    return [combine(rounds[k]) for k in keys]


TIMES = ("p50_ms", "p99_ms", "mean_ms", "max_ms")


def combine(runs: Sequence[Run]) -> Run:
    """One configuration's runs as one: the medians of their p50, p99 and mean, the largest
    max, and each run's p50. The rest describes the decisions, the same in every run."""
    if len(runs) == 1:
        return runs[0]
    first = asdict(runs[0])
    for r in runs[1:]:
        other = asdict(r)
        moved = [k for k in first if k not in TIMES and other[k] != first[k]]
        if moved:
            raise BenchError(
                f"{r.policy} agents={r.agents} waiting={r.waiting}: runs decided differently "
                f"({', '.join(moved)})"
            )
    times = {k: [getattr(r, k) for r in runs] for k in TIMES}
    return dataclasses.replace(
        runs[0],
        p50_ms=statistics.median(times["p50_ms"]),
        p99_ms=statistics.median(times["p99_ms"]),
        mean_ms=statistics.median(times["mean_ms"]),
        max_ms=max(times["max_ms"]),
        repeats=len(runs),
        p50_runs_ms=tuple(times["p50_ms"]),
    )


# --------------------------------------------------------------------------- reporting


def _find(runs: Sequence[Run], policy: str, agents: int, waiting: int) -> Run | None:
    return next(
        (r for r in runs if (r.policy, r.agents, r.waiting) == (policy, agents, waiting)), None
    )


def main_table(runs: Sequence[Run]) -> str:
    repeated = any(r.repeats > 1 for r in runs)
    extra = (" p50 of each run (ms) |", "---|") if repeated else ("", "")
    out = [
        "| policy | agents | waiting | p50 (ms) | p99 (ms) | decisions | waiting (mean) "
        "| running (mean) | admitted/call | prefix sets/call (mean, max) |" + extra[0],
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + extra[1],
    ]
    for r in runs:
        sets = "-" if r.mean_evaluated is None else f"{r.mean_evaluated:.1f}, {r.max_evaluated}"
        each = f" {', '.join(f'{t:.3f}' for t in r.p50_runs_ms)} |" if repeated else ""
        out.append(
            f"| `{r.policy}` | {r.agents} | {r.waiting} | {r.p50_ms:.3f} | {r.p99_ms:.3f} "
            f"| {r.decisions} | {r.mean_waiting:.1f} | {r.mean_running:.1f} "
            f"| {r.mean_admitted:.2f} | {sets} |{each}"
        )
    return "\n".join(out)


def growth_table(runs: Sequence[Run], waiting: Sequence[int]) -> str:
    """p50 at 10n over p50 at n, for each n and 10n both measured."""
    steps = [(n, 10 * n) for n in waiting if 10 * n in waiting]
    head = " | ".join(f"{a}->{b}" for a, b in steps)
    out = [f"| policy | agents | {head} |", "|---|---:|" + "---:|" * len(steps)]
    for spec, agents in dict.fromkeys((r.policy, r.agents) for r in runs):
        if not any(_find(runs, spec, agents, a) for a, _ in steps):
            continue
        cells = []
        for a, b in steps:
            ra, rb = _find(runs, spec, agents, a), _find(runs, spec, agents, b)
            cells.append(f"{rb.p50_ms / ra.p50_ms:.2f}" if ra and rb else "-")
        out.append(f"| `{spec}` | {agents} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def ratio_table(runs: Sequence[Run], num: str, den: str) -> str:
    """``num``'s p50 and p99 over ``den``'s at the same agents and waiting."""
    out = [
        f"| agents | waiting | p50 {num}/{den} | p99 {num}/{den} |",
        "|---:|---:|---:|---:|",
    ]
    for r in runs:
        if r.policy != num:
            continue
        d = _find(runs, den, r.agents, r.waiting)
        if d is not None:
            out.append(
                f"| {r.agents} | {r.waiting} | {r.p50_ms / d.p50_ms:.1f} "
                f"| {r.p99_ms / d.p99_ms:.1f} |"
            )
    return "\n".join(out)


def issue_line(runs: Sequence[Run]) -> str | None:
    """The issue's comparison: topas at 1,000 waiting and 64 agents against lpm's full
    sort at 128 waiting and 64 agents."""
    topas = _find(runs, "topas", 64, 1000)
    lpm = _find(runs, f"lpm:{SORT_ALL}", 64, LPM_SORT_LIMIT)
    if topas is None or lpm is None:
        return None
    return (
        f"topas at 1,000 waiting / 64 agents: p50 {topas.p50_ms:.3f} ms, p99 "
        f"{topas.p99_ms:.3f} ms; lpm's full sort at {LPM_SORT_LIMIT} waiting / 64 agents: "
        f"p50 {lpm.p50_ms:.3f} ms, p99 {lpm.p99_ms:.3f} ms; ratio p50 "
        f"{topas.p50_ms / lpm.p50_ms:.1f}x, p99 {topas.p99_ms / lpm.p99_ms:.1f}x."
    )


def summary_md(runs: Sequence[Run], cfg: Config, command: str) -> str:
    out = [
        "# Decision time of `decide(state)` against the waiting queue",
        "",
        f"`{command}`",
        "",
        f"Serving loop (see `analysis/bench_decision.py`): tasks of {STAGES_RANGE[0]}-"
        f"{STAGES_RANGE[1]} stages (chains and fan-outs), prefixes {PREFIX_RANGE[0]}-"
        f"{PREFIX_RANGE[1]} tokens, KV for a third of the prefixes plus a batch, "
        f"max_running={MAX_RUNNING}, one stage completing per decision and the queue refilled "
        f"to N. {cfg.decisions} timed decisions per configuration ({cfg.decisions_large} from "
        f"{LARGE} waiting) after {cfg.warmup} warm-up ones; python "
        f"{platform.python_version()} on {platform.machine()}, one process."
        + (
            f" Every configuration ran {cfg.repeat} times, in {cfg.repeat} rounds of the "
            "whole plan: p50, p99 and mean are the medians of its runs (max: the largest)."
            if cfg.repeat > 1
            else ""
        ),
        "",
        main_table(runs),
        "",
        "## Growth of p50 per 10x of waiting stages",
        "",
        growth_table(runs, cfg.waiting),
    ]
    specs = list(dict.fromkeys(r.policy for r in runs))
    if "topas" in specs and "lpm" in specs:
        out += ["", "## topas / lpm", "", ratio_table(runs, "topas", "lpm")]
    line = issue_line(runs)
    if line:
        out += ["", line]
    return "\n".join(out) + "\n"


def policy_sources(specs: Sequence[str]) -> dict[str, str]:
    """sha256 of the file defining each policy class (policies are being rewritten for
    speed: this says which version was timed)."""
    out = {}
    for spec in specs:
        path = inspect.getsourcefile(type(make_policy(spec)))
        if path:
            out[spec] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return out


def runs_json(runs: Sequence[Run], cfg: Config, command: str) -> str:
    doc = {
        "command": command,
        "config": asdict(cfg),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "policy_source_sha256": policy_sources(cfg.policies),
        "runs": [asdict(r) for r in runs],
    }
    return json.dumps(doc, indent=1) + "\n"


# --------------------------------------------------------------------------- CLI


def _at_least(value: int, name: str, least: int) -> int:
    if value < least:
        raise ValueError(f"{name}: expected an integer >= {least}, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    ap = ex.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    ap.add_argument("--agents", default=",".join(map(str, DEFAULT_AGENTS)))
    ap.add_argument("--waiting", default=",".join(map(str, DEFAULT_WAITING)))
    ap.add_argument("--decisions", type=int, default=200, help="timed calls per configuration")
    ap.add_argument("--decisions-large", type=int, default=50, help=f"... from {LARGE} waiting")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--repeat", type=int, default=1, help="rounds of the whole plan (times: their medians)"
    )
    ap.add_argument("--quick", action="store_true", help="10 and 100 waiting, 10 decisions")
    ap.add_argument("--out", default="results/bench_decision")
    return ap


def config_from_args(args: argparse.Namespace) -> Config:
    policies = tuple(dict.fromkeys(split_specs(args.policies)))
    if not policies:
        raise ValueError("--policies: no policy given")
    for spec in policies:
        make_policy(spec)  # PolicySpecError is a ValueError
    quick = args.quick
    return Config(
        policies=policies,
        agents=ex.parse_int_list(args.agents, "--agents", 1),
        waiting=QUICK_WAITING if quick else ex.parse_int_list(args.waiting, "--waiting", 1),
        decisions=10 if quick else _at_least(args.decisions, "--decisions", 1),
        decisions_large=10 if quick else _at_least(args.decisions_large, "--decisions-large", 1),
        warmup=3 if quick else _at_least(args.warmup, "--warmup", 0),
        seed=_at_least(args.seed, "--seed", 0),
        repeat=_at_least(args.repeat, "--repeat", 1),
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = shlex.join(["python", "analysis/bench_decision.py", *argv])
    try:
        args = build_parser().parse_args(argv)
        cfg = config_from_args(args)
        runs = run_bench(cfg)
        text = summary_md(runs, cfg, command)
        out = Path(args.out)
        write_atomic(out / "runs.json", runs_json(runs, cfg, command))
        write_atomic(out / "summary.md", text)
    except (ValueError, OSError, BenchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
