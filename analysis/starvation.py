"""Starvation on an adversarial stream: does a cold task wait as long as the stream lasts?

One task whose agent ("cold") has no resident prefix arrives early, into a steady stream
of cache-friendly one-stage tasks on a "hot" agent that arrive a little faster than the
server serves them (the queue never empties while the stream lasts, and stays under
lpm's 128-stage sorting limit). A prefix-match-first order (``lpm``: resident prefix
tokens first) puts every hot stage ahead of the cold one, so the cold task waits until
the stream ends and its JCT grows with the stream's length. The cold stage also decodes
twice as long as a hot one, so a shortest-path-first order defers it too and only aging
(``topas``'s ``aging`` term) or its reservation for starving stages (``reserve``) can
bring it forward.

Two ways to keep the server full (``--bounds``): ``slots`` (``max_running`` binds; the
KV budget holds both prefixes and two batches) and ``memory`` (no request cap; the KV
budget holds the hot prefix and a batch of hot stages, so the cold stage needs its prefix
loaded into memory the hot stages keep taking; aging ranks it first, but only ``topas``'s
``reserve`` term, which keeps freed memory for it, lets it in). Calibrated timing, the
default cost model.

    python analysis/starvation.py [--lengths 160,320,640,1280] [--seeds 20,21]
        [--policies lpm,topas,topas:aging=0,topas:reserve=0,topas:aging=0,reserve=0]
        [--bounds slots,memory]
        [--out DIR]

Writes results/starvation/{summary.md, runs.csv, cold_jct.png} and prints the summary
(about a minute with the defaults).
"""

from __future__ import annotations

import argparse
import functools
import math
import shlex
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from topas.instance import Agent, Instance, ServerSpec, Stage, Task
from topas.policies import make_policy, split_specs
from topas.schedule import Schedule, evaluate
from topas.simulator import simulate
from topas.studies import StudyParams, rows_to_csv, write_outputs

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex  # noqa: E402

HOT_PREFIX = 2048  # tokens of the hot agent's system prompt
COLD_PREFIX = 2048  # tokens of the cold agent's system prompt
INPUT = 256  # every stage's own input tokens
OUTPUT = 128  # a hot stage's mean output tokens (every length is predicted exactly)
OUTPUT_SPREAD = 32  # a hot stage's output is uniform in OUTPUT +- OUTPUT_SPREAD
COLD_OUTPUT = 2 * OUTPUT  # the cold stage decodes twice as long: Smith's rule alone defers it
BATCH = 4  # stages the server runs at once (the slot cap, or what the KV budget holds)
OVERLOAD = 1.03  # arrival rate of the hot stream / its measured service rate
JITTER = 0.2  # each inter-arrival gap is uniform in [1 - JITTER, 1 + JITTER] x the mean
BACKLOG = 4 * BATCH  # hot tasks already queued at t=0
COLD_AFTER = BACKLOG + 2 * BATCH  # the cold task arrives with this hot task (mid-stream)
MIN_LENGTH = COLD_AFTER + 1
FLAT = 1.5  # a cold-task JCT counts as flat if the longest stream's is <= FLAT x the shortest's
BOUNDS = ("slots", "memory")
DEFAULT_LENGTHS = (160, 320, 640, 1280)
DEFAULT_POLICIES = ("lpm", "topas", "topas:aging=0", "topas:reserve=0", "topas:aging=0,reserve=0")
COLD_TASK = "cold"


# --------------------------------------------------------------------------- the instance


def server_for(bound: str) -> ServerSpec:
    """``slots``: ``max_running=BATCH`` binds; the KV budget holds both prefixes and two
    batches, so the cold prefix can be loaded at any time. ``memory``: no request cap; the
    KV budget holds the hot prefix and ``BATCH`` hot stages, so the cold stage (prefix and
    all) fits only once most hot stages have left."""
    if bound == "slots":
        kv = HOT_PREFIX + COLD_PREFIX + 2 * BATCH * (INPUT + COLD_OUTPUT)
        return ServerSpec(kv_capacity_tokens=kv, chunk_tokens=2048, max_running=BATCH)
    if bound == "memory":
        kv = HOT_PREFIX + BATCH * (INPUT + OUTPUT + OUTPUT_SPREAD)
        return ServerSpec(kv_capacity_tokens=kv, chunk_tokens=2048, max_running=None)
    raise ValueError(f"bound: expected one of {', '.join(BOUNDS)}, got {bound!r}")


def _task(tid: str, arrival: float, agent: str, output: int) -> Task:
    stage = Stage(id="s0", agent=agent, input_tokens=INPUT, output_tokens=output)
    return Task(tid, arrival, (stage,))


def _agents() -> tuple[Agent, ...]:
    return (Agent("hot", HOT_PREFIX), Agent("cold", COLD_PREFIX))


@functools.cache
def service_rate(bound: str) -> float:
    """Hot stages per second the server completes when it always has hot work: measured
    by FCFS on a backlog of ``40 * BATCH`` hot tasks (ramp-up and drain excluded)."""
    n, skip = 40 * BATCH, 5 * BATCH
    tasks = tuple(_task(f"h{i:05d}", 0.0, "hot", OUTPUT) for i in range(n))
    inst = Instance(server_for(bound), _agents(), tasks, name="pilot")
    ends = sorted(r.end for r in simulate(inst, make_policy("fcfs"), "calibrated").runs)
    return (n - 2 * skip) / (ends[n - skip - 1] - ends[skip - 1])


def hot_arrivals(length: int, rng: np.random.Generator, bound: str) -> list[float]:
    """``BACKLOG`` tasks at 0, then the rest at ``OVERLOAD`` x the service rate."""
    gap = 1.0 / (OVERLOAD * service_rate(bound))
    times = [0.0] * min(length, BACKLOG)
    t = 0.0
    for _ in range(length - len(times)):
        t += gap * float(rng.uniform(1.0 - JITTER, 1.0 + JITTER))
        times.append(t)
    return times


def _check_length(length: int) -> None:
    if isinstance(length, bool) or not isinstance(length, int) or length < MIN_LENGTH:
        raise ValueError(f"length: must be an integer >= {MIN_LENGTH}, got {length!r}")


def adversarial_stream(length: int, seed: int = 0, bound: str = "slots") -> Instance:
    """One cold task (agent ``cold``, prefix not resident, arriving early) in a stream of
    ``length`` one-stage tasks on agent ``hot`` that overloads the server (see the module
    docstring). Calibrated timing: the server has no cost model, so the default applies."""
    _check_length(length)
    server = server_for(bound)
    rng = np.random.default_rng(seed)
    arrivals = hot_arrivals(length, rng, bound)
    outputs = rng.integers(OUTPUT - OUTPUT_SPREAD, OUTPUT + OUTPUT_SPREAD + 1, size=length)
    pairs = enumerate(zip(arrivals, outputs, strict=True))
    tasks = [_task(f"h{i:05d}", t, "hot", int(n)) for i, (t, n) in pairs]
    tasks.insert(COLD_AFTER + 1, _task(COLD_TASK, arrivals[COLD_AFTER], "cold", COLD_OUTPUT))
    name = f"adversarial-{bound}-{length}-s{seed}"
    return Instance(server, _agents(), tuple(tasks), name=name)


# --------------------------------------------------------------------------- measuring


def queue_profile(schedule: Schedule) -> tuple[int, int]:
    """(largest waiting queue, smallest waiting queue while the hot stream arrives).

    A stage waits from when it is ready (its task's release, its last dep's end, or its
    preemption) until its next admission; events at one instant are taken together.
    """
    inst = schedule.instance
    runs = sorted(schedule.runs, key=lambda r: r.admit)
    ends = {r.ref: r.end for r in runs if not r.preempted}
    ready: dict[tuple[str, str], float] = {}
    delta: dict[float, int] = {}
    for r in runs:
        if r.ref not in ready:
            deps = inst.task_by_id[r.task].stage_by_id[r.stage].deps
            ready[r.ref] = max([schedule.release(r.task), *(ends[(r.task, d)] for d in deps)])
        delta[ready[r.ref]] = delta.get(ready[r.ref], 0) + 1
        delta[r.admit] = delta.get(r.admit, 0) - 1
        if r.preempted:
            ready[r.ref] = r.end
    hot = [schedule.release(t.id) for t in inst.tasks if t.id != COLD_TASK]
    lo_t, hi_t = min(hot), max(hot)
    cur, peak, low = 0, 0, math.inf
    for t in sorted(delta):
        cur += delta[t]
        peak = max(peak, cur)
        if lo_t <= t < hi_t:
            low = min(low, cur)
    return peak, 0 if low == math.inf else int(low)


@dataclass(frozen=True)
class Row:
    """One run: a policy on one stream length, seed and bound. Times in seconds."""

    bound: str
    length: int  # hot tasks in the stream
    seed: int
    policy: str
    cold_jct_s: float
    max_jct_s: float
    max_hot_jct_s: float
    mean_jct_s: float
    stream_s: float  # last hot arrival
    max_waiting: int  # largest waiting queue
    min_waiting: int  # smallest waiting queue while the stream arrives


def run_one(length: int, seed: int, spec: str, bound: str = "slots") -> Row:
    """Simulate ``spec`` on :func:`adversarial_stream` and measure it."""
    inst = adversarial_stream(length, seed, bound)
    sched = simulate(inst, make_policy(spec), timing="calibrated", seed=seed)
    m = evaluate(sched)
    peak, low = queue_profile(sched)
    return Row(
        bound=bound,
        length=length,
        seed=seed,
        policy=spec,
        cold_jct_s=m.jct[COLD_TASK],
        max_jct_s=m.max_jct,
        max_hot_jct_s=max(v for t, v in m.jct.items() if t != COLD_TASK),
        mean_jct_s=m.mean_jct,
        stream_s=max(t.arrival for t in inst.tasks),
        max_waiting=peak,
        min_waiting=low,
    )


def run_starvation(
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    policies: Sequence[str] = ("lpm", "topas"),
    seeds: Iterable[int] = (0,),
    bounds: Sequence[str] = ("slots",),
) -> list[Row]:
    """Every policy on every bound, stream length and seed."""
    seeds = list(seeds)
    for bound in bounds:
        server_for(bound)  # reject bad input before running anything
    for n in lengths:
        _check_length(n)
    for spec in policies:
        make_policy(spec)
    return [
        run_one(n, s, spec, b) for b in bounds for spec in policies for n in lengths for s in seeds
    ]


def growth(rows: Sequence[Row], policy: str, field: str = "cold_jct_s") -> dict[int, float]:
    """Per stream length, the mean of ``field`` over seeds divided by the shortest's."""
    lengths = sorted({r.length for r in rows if r.policy == policy})
    base = _mean_by(rows, policy, lengths[0], field)
    return {n: _mean_by(rows, policy, n, field) / base for n in lengths}


# --------------------------------------------------------------------------- reporting


def _mean_by(rows: Sequence[Row], policy: str, length: int, field: str) -> float:
    vals = [getattr(r, field) for r in rows if r.policy == policy and r.length == length]
    return float(np.mean(vals))


def summary_table(rows: Sequence[Row]) -> str:
    """Markdown for one bound: per policy and length, means over seeds."""
    lengths = sorted({r.length for r in rows})
    policies = list(dict.fromkeys(r.policy for r in rows))
    out = [
        "| policy | hot tasks | stream (s) | cold JCT (s) | x shortest | max JCT (s) "
        "| x shortest | max hot JCT (s) | mean JCT (s) | queue max / min |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in policies:
        cold, worst = growth(rows, p), growth(rows, p, "max_jct_s")
        for n in lengths:
            sel = [r for r in rows if r.policy == p and r.length == n]
            qmax, qmin = max(r.max_waiting for r in sel), min(r.min_waiting for r in sel)
            mean = functools.partial(_mean_by, rows, p, n)
            out.append(
                f"| `{p}` | {n} | {mean('stream_s'):.1f} | {mean('cold_jct_s'):.1f} "
                f"| {cold[n]:.2f} | {mean('max_jct_s'):.1f} | {worst[n]:.2f} "
                f"| {mean('max_hot_jct_s'):.1f} | {mean('mean_jct_s'):.1f} | {qmax} / {qmin} |"
            )
    return "\n".join(out)


def verdicts(rows: Sequence[Row]) -> list[str]:
    """One line per policy: does its cold-task JCT follow the stream or stay flat?"""
    lines = []
    for p in dict.fromkeys(r.policy for r in rows):
        g = growth(rows, p)
        longest = max(g)
        kind = "stays flat" if g[longest] <= FLAT else "grows with the stream"
        steps = ", ".join(f"{v:.2f}" for v in g.values())
        lines.append(f"- `{p}`: cold-task JCT {kind} (x shortest: {steps})")
    return lines


BOUND_TEXT = {
    "slots": f"`max_running={BATCH}` binds; the KV budget holds both prefixes and two "
    "batches, so the cold prefix can be loaded at any time.",
    "memory": f"no request cap; the KV budget holds the hot prefix and {BATCH} hot stages, so "
    "the cold stage (its prefix and all) fits only once most hot stages have left.",
}


def summary_md(rows: Sequence[Row], command: str) -> str:
    seeds = sorted({r.seed for r in rows})
    out = [
        "# Starvation on an adversarial stream",
        "",
        f"`{command}`",
        "",
        f"A stream of one-stage tasks on agent `hot` (prefix {HOT_PREFIX} tokens; {INPUT} "
        f"input, {OUTPUT - OUTPUT_SPREAD}-{OUTPUT + OUTPUT_SPREAD} output tokens): {BACKLOG} "
        f"queued at t=0, the rest arriving at {OVERLOAD}x the measured service rate (gaps "
        f"+-{JITTER:.0%}), so the queue never empties while the stream lasts. With hot task "
        f"{COLD_AFTER} arrives one task on agent `cold` (prefix {COLD_PREFIX} tokens, not "
        f"resident; {INPUT} input, {COLD_OUTPUT} output tokens). Calibrated timing; means over "
        f"seeds {', '.join(map(str, seeds))}. `x shortest`: relative to the shortest stream. "
        "`queue max / min`: the largest waiting queue, and the smallest while the stream "
        "arrives (over seeds); `lpm` sorts by prefix match only while at most 128 wait. "
        f"A policy's cold-task JCT counts as flat when the longest stream's is at most "
        f"{FLAT}x the shortest's.",
    ]
    for bound in dict.fromkeys(r.bound for r in rows):
        sel = [r for r in rows if r.bound == bound]
        out += ["", f"## `{bound}`-bound", "", BOUND_TEXT[bound], ""]
        out += [summary_table(sel), "", *verdicts(sel)]
    return "\n".join(out) + "\n"


def runs_csv(rows: Sequence[Row]) -> str:
    return rows_to_csv([asdict(r) for r in rows])


STYLES = ("o-", "s--", "^:", "D-.")


def plot(rows: Sequence[Row]) -> bytes:
    """Cold-task JCT against stream length, one line per policy, one panel per bound (PNG)."""
    from matplotlib.figure import Figure

    bounds = list(dict.fromkeys(r.bound for r in rows))
    fig = Figure(figsize=(5.2 * len(bounds), 3.8))
    axes = fig.subplots(1, len(bounds), squeeze=False)
    for ax, bound in zip(axes[0], bounds, strict=True):
        sel = [r for r in rows if r.bound == bound]
        lengths = sorted({r.length for r in sel})
        for i, p in enumerate(dict.fromkeys(r.policy for r in sel)):
            ys = [_mean_by(sel, p, n, "cold_jct_s") for n in lengths]
            style = STYLES[i % len(STYLES)]  # distinct markers: overlapping lines stay visible
            ax.plot(lengths, ys, style, label=p, markersize=9 - 2 * (i % len(STYLES)))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("hot tasks in the stream")
        ax.set_ylabel("cold task JCT (s)")
        ax.set_title(f"{bound}-bound")
        ax.legend()
    fig.suptitle("Starvation on an adversarial stream")
    fig.tight_layout()
    return ex.figure_png(fig)


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    ap = ex.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)))
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    ap.add_argument("--seeds", default="20,21", help="reporting seeds (never tuned on)")
    ap.add_argument("--bounds", default=",".join(BOUNDS), help="slots, memory or both")
    ap.add_argument("--out", default="results/starvation")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = shlex.join(["python", "analysis/starvation.py", *argv])
    try:
        args = build_parser().parse_args(argv)
        lengths = ex.parse_int_list(args.lengths, "--lengths", MIN_LENGTH)
        seeds = ex.check_report_seeds(ex.parse_int_list(args.seeds, "--seeds", 0))
        policies = list(dict.fromkeys(split_specs(args.policies)))
        bounds = [b.strip() for b in args.bounds.split(",") if b.strip()]
        if not policies:
            raise ValueError("--policies: no policy given")
        if not bounds or not set(bounds) <= set(BOUNDS):
            raise ValueError(f"--bounds: expected some of {', '.join(BOUNDS)}, got {args.bounds!r}")
        params = StudyParams(
            {"lengths": lengths, "policies": policies, "seeds": seeds, "bounds": bounds}
        )
        rows = run_starvation(lengths, policies, seeds, bounds)
        text = summary_md(rows, command)
        files: dict[str, str | bytes] = {  # rendered in full before anything is written
            "config.json": ex.config_json("starvation", params.to_json(), command),
            "runs.csv": runs_csv(rows),
            "cold_jct.png": plot(rows),
            "summary.md": text,
        }
        write_outputs(Path(args.out), files)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
