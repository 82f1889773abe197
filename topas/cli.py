"""The ``topas`` command line: generate, workloads, profiles, simulate, compare, oracle, gap, demo.

Bad input (a malformed instance, an unknown policy or parameter: an ``InputError``)
prints one line ``topas: error: ...`` and exits with status 2, without a traceback and
without writing any output file. Anything else is a bug in topas (or in a user's own
policy): ``topas: internal error: ...``, a request to report it, and status 70
(``EX_SOFTWARE``), so that it never passes for bad input.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from collections.abc import Sequence

from topas.errors import InputError
from topas.instance import Instance, load_instance, save_instance, write_atomic
from topas.oracle.problem import BACKENDS
from topas.policies import BASELINES, available, make_policy, split_specs
from topas.profiles import MOVEMENTS
from topas.results import oracle_result_document, write_result
from topas.runs import (
    best_baseline_schedule,
    compare_policies,
    cuts_vs_best,
    run_policy,
    timing_mode,
)
from topas.schedule import Metrics
from topas.studies.checkpoint import add_resume_option
from topas.timing import TIMING_MODES

EXIT_USAGE = 2
EXIT_SOFTWARE = 70  # sysexits.h: an internal software error


class CliError(InputError):
    """A user error found by the command line itself: one line, exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InputError as e:
        print(f"topas: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except OSError as e:  # an output path that cannot be written
        where = f"{e.filename}: " if e.filename else ""
        print(f"topas: error: {where}{e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("topas: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: say so, and never as bad input
        print(
            f"topas: internal error: {type(e).__name__}: {e}\n"
            "This is a bug (in topas, or in a policy of your own). Please report it with "
            "the command line and its input files.",
            file=sys.stderr,
        )
        return EXIT_SOFTWARE


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="topas",
        description="Task-oriented, prefix-aware scheduling of multi-agent LLM workflows.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="write a workload instance file")
    g.add_argument("workload", help="a workload family (see `topas workloads`)")
    g.add_argument("-o", "--out", required=True, help="instance file to write")
    g.add_argument("--tasks", type=int, default=100, help="number of tasks (default 100)")
    g.add_argument("--seed", type=int, default=0)
    rate = g.add_mutually_exclusive_group()
    rate.add_argument("--load", type=float, help="target load factor (default: the workload's)")
    rate.add_argument("--rate", type=float, help="Poisson arrival rate in tasks/s")
    g.add_argument("--kv-capacity", type=int, help="KV budget in tokens")
    g.add_argument("--max-running", type=int, help="batch limit (default unlimited)")
    g.add_argument("--chunk-tokens", type=int, help="prefill chunk in tokens")
    g.add_argument(
        "--prediction-sigma",
        type=float,
        default=0.0,
        help="log-normal noise on predicted_output_tokens (default 0: the truth)",
    )
    g.add_argument("--token-scale", type=float, default=1.0, help="divide token counts by this")
    _profile_options(g, movement=True)
    g.add_argument(
        "--timing",
        choices=TIMING_MODES,
        default="calibrated",
        help="cost model written into the file (default calibrated)",
    )
    g.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="workload parameter (repeatable); see `topas workloads`",
    )
    g.set_defaults(func=cmd_generate)

    w = sub.add_parser("workloads", help="describe the workload families and their parameters")
    w.add_argument("name", nargs="?", help="one workload (default: all)")
    w.set_defaults(func=cmd_workloads)

    s = sub.add_parser("simulate", help="run one policy on an instance")
    s.add_argument("instance")
    s.add_argument("--policy", required=True, help="policy spec, e.g. lpm or pkg.mod:Class")
    _run_options(s)
    _profile_options(s, movement=False)
    s.add_argument("--out", required=True, help="result file to write (topas-result/1)")
    s.add_argument("--with-schedule", action="store_true", help="include the full schedule")
    s.set_defaults(func=cmd_simulate)

    c = sub.add_parser("compare", help="run several policies on one instance, side by side")
    c.add_argument("instance")
    c.add_argument(
        "--policies",
        default=",".join(BASELINES),
        help=f"comma-separated specs (default {','.join(BASELINES)})",
    )
    _run_options(c)
    _profile_options(c, movement=False)
    c.add_argument("--csv", help="also write the table as CSV")
    c.set_defaults(func=cmd_compare)

    o = sub.add_parser("oracle", help="solve a small instance exactly in the step model")
    o.add_argument("instance")
    o.add_argument("--backend", choices=BACKENDS, default="cpsat")
    o.add_argument("--time-limit", type=float, default=60.0, help="seconds (default 60)")
    o.add_argument("--threads", type=int, default=2)
    o.add_argument("--out", required=True, help="result file to write (with the schedule)")
    o.set_defaults(func=cmd_oracle)

    gp = sub.add_parser("gap", help="optimality gaps of policies on small generated DAGs")
    gp.add_argument("--instances", type=int, default=5, help="instances per family and size")
    gp.add_argument("--families", default="chain,fanout,mixed,metagpt-sop,metagpt-tl")
    gp.add_argument("--tasks", default="2,3,4", help="task counts (sizes) to generate")
    gp.add_argument("--policies", default=None, help="specs (default: every registered one)")
    gp.add_argument("--backend", choices=BACKENDS, default="cpsat")
    gp.add_argument("--time-limit", type=float, default=30.0, help="per instance, seconds")
    gp.add_argument(
        "--seed", type=int, default=1, help="study seed (0 and >= 1000 are kept for tuning)"
    )
    gp.add_argument("--jobs", type=int, default=1, help="instances solved in parallel")
    gp.add_argument("--out", default="results/gap", help="output folder")
    gp.add_argument("--no-progress", action="store_true")
    add_resume_option(gp, "instances")
    gp.add_argument("--profile", help="server profile of the instances (default: each family's)")
    gp.set_defaults(func=cmd_gap)

    sb = sub.add_parser(
        "serve-bench", help="replay an instance against a running SGLang server (live JCTs)"
    )
    sb.add_argument("instance")
    sb.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    sb.add_argument("--out", required=True, help="result file to write (topas-result/1)")
    sb.add_argument("--label", default="sglang", help="what to call the server's policy")
    sb.add_argument("--seed", type=int, default=0, help="token ids of prompts and inputs")
    sb.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    sb.set_defaults(func=cmd_serve_bench)

    d = sub.add_parser(
        "demo", help="TOPAS beside every baseline on a built-in default workload, and its cut"
    )
    d.add_argument("--workload", default="metagpt-sop")
    d.add_argument("--tasks", type=int, default=200)
    d.add_argument("--load", type=float, default=1.0)
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=cmd_demo)

    pr = sub.add_parser("profiles", help="list the server profiles (model x GPU)")
    pr.add_argument("name", nargs="?", help="one profile, in full (default: a table of all)")
    pr.set_defaults(func=cmd_profiles)

    pl = sub.add_parser("policies", help="list the registered policies")
    pl.set_defaults(func=lambda a: print("\n".join(available())))
    return p


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timing",
        choices=TIMING_MODES,
        default=None,
        help="step or calibrated (default: the file's cost model)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--prediction-error",
        type=float,
        default=0.0,
        metavar="SIGMA",
        help="log-normal noise (sigma) on the output lengths policies are told, drawn "
        "from --seed; truth unchanged (default 0)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _profile_options(p: argparse.ArgumentParser, movement: bool) -> None:
    p.add_argument(
        "--profile",
        help="server profile (model x GPU), see `topas profiles`"
        + (" (default: the workload's)" if movement else "; re-times the instance's server"),
    )
    if movement:
        p.add_argument(
            "--movement",
            choices=MOVEMENTS,
            help="how an absent prefix is brought back (default: the profile's)",
        )
    p.add_argument(
        "--swap-gbps",
        type=float,
        help="host link bandwidth B_swap in GB/s (default: the profile's measured figure)",
    )


def _swap_bytes(args: argparse.Namespace) -> float | None:
    gbps = getattr(args, "swap_gbps", None)
    if gbps is None:
        return None
    if not (math.isfinite(gbps) and gbps > 0):
        raise CliError(f"--swap-gbps: must be a positive number, got {gbps:g}")
    return gbps * 1e9


def retimed(inst: Instance, args: argparse.Namespace) -> Instance:
    """``inst`` re-timed by ``--profile`` / ``--swap-gbps`` (simulate, compare)."""
    from topas.profiles import retime_instance

    if args.profile is None and args.swap_gbps is None:
        return inst
    return retime_instance(inst, args.profile, _swap_bytes(args))


# --------------------------------------------------------------------------- commands


def cmd_generate(args: argparse.Namespace) -> None:
    from topas.workloads import generate

    params = dict(_parse_kv(item) for item in args.param)
    inst = generate(
        args.workload,
        num_tasks=args.tasks,
        seed=args.seed,
        load=args.load,
        rate=args.rate,
        kv_capacity_tokens=args.kv_capacity,
        max_running=args.max_running,
        chunk_tokens=args.chunk_tokens,
        prediction_sigma=args.prediction_sigma,
        token_scale=args.token_scale,
        timing=args.timing,
        profile=args.profile,
        movement=args.movement,
        swap_bytes_per_s=_swap_bytes(args),
        **params,
    )
    save_instance(inst, args.out)
    print(
        f"wrote {args.out}: {len(inst.tasks)} tasks, {inst.num_stages} stages, "
        f"{len(inst.agents)} agents"
    )


def cmd_workloads(args: argparse.Namespace) -> None:
    from topas.workloads import WORKLOADS, describe

    names = [args.name] if args.name else list(WORKLOADS)
    print("\n\n".join(describe(n) for n in names))


def cmd_profiles(args: argparse.Namespace) -> None:
    from topas.profiles import PROFILES, describe_profile, get_profile, profiles_table

    if args.name:
        print(describe_profile(get_profile(args.name)))
    else:
        print(profiles_table(PROFILES.values()))


def cmd_simulate(args: argparse.Namespace) -> None:
    inst = retimed(load_instance(args.instance), args)
    make_policy(args.policy)  # fail fast on a bad spec
    timing = timing_mode(inst, args.timing)
    metrics, doc = run_policy(
        inst,
        args.policy,
        timing,
        args.seed,
        not args.no_progress,
        include_schedule=args.with_schedule,
        prediction_error=_prediction_error(args),
    )
    write_result(doc, args.out)
    print(format_table([(args.policy, metrics)], timing))


def cmd_compare(args: argparse.Namespace) -> None:
    inst = retimed(load_instance(args.instance), args)
    specs = split_specs(args.policies)
    if not specs:
        raise CliError("--policies: no policy given")
    for spec in specs:
        make_policy(spec)  # fail fast on a bad spec, before any run
    timing = timing_mode(inst, args.timing)
    rows = compare_policies(
        inst,
        specs,
        timing,
        args.seed,
        progress=not args.no_progress,
        prediction_error=_prediction_error(args),
    )
    table = format_table(rows, timing)
    if args.csv:
        write_atomic(args.csv, format_csv(rows))
    print(table)


def cmd_serve_bench(args: argparse.Namespace) -> None:
    from topas.serve_bench import ServeBenchError, run_live

    inst = load_instance(args.instance)
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise CliError(f"--timeout: must be a positive number, got {args.timeout}")
    try:
        metrics, doc = run_live(inst, args.url, args.label, args.seed, args.timeout)
    except ServeBenchError as e:
        raise CliError(str(e)) from None
    write_result(doc, args.out)
    print(format_table([(args.label, metrics)], "calibrated"))


def cmd_oracle(args: argparse.Namespace) -> None:
    from topas.oracle import solve

    inst = load_instance(args.instance)
    if args.time_limit < 0:
        raise CliError("--time-limit: must be >= 0")
    result = solve(
        inst,
        backend=args.backend,
        time_limit=args.time_limit,
        threads=args.threads,
        warm_start=best_baseline_schedule,
    )
    write_result(oracle_result_document(inst, result), args.out)
    bound = f"lower bound {result.lower_bound}"
    if result.objective is None:
        print(
            f"oracle ({args.backend}): {result.status} after {result.runtime:.1f} s, "
            f"no schedule; {bound} steps"
        )
        return
    print(
        f"oracle ({args.backend}): {result.status}, sum of JCTs {result.objective} steps, "
        f"{bound}, {result.runtime:.2f} s (clairvoyant: knows every arrival and length)"
    )


def cmd_gap(args: argparse.Namespace) -> None:
    from topas.studies.gap import GapConfig, run_gap_study

    config = GapConfig(
        families=tuple(f for f in args.families.split(",") if f),
        task_counts=tuple(int(n) for n in args.tasks.split(",") if n),
        instances=args.instances,
        policies=None if args.policies is None else tuple(split_specs(args.policies)),
        backend=args.backend,
        time_limit=args.time_limit,
        seed=args.seed,
        jobs=args.jobs,
        profile=args.profile,
    )
    summary = run_gap_study(config, args.out, progress=not args.no_progress, resume=args.resume)
    print(summary)


def cmd_demo(args: argparse.Namespace) -> None:
    from topas.workloads import generate

    inst = generate(args.workload, num_tasks=args.tasks, seed=args.seed, load=args.load)
    print(
        f"workload {inst.name}: {len(inst.tasks)} tasks, {inst.num_stages} stages, "
        f"{len(inst.agents)} agents, KV budget {inst.server.kv_capacity_tokens} tokens, "
        f"prefixes {sum(a.prefix_tokens for a in inst.agents)} tokens; calibrated timing"
    )
    rows = compare_policies(inst, [*BASELINES, "topas"], "calibrated", args.seed, progress=True)
    print(format_table(rows, "calibrated"))
    for line in demo_cuts(rows):
        print(line)


def demo_cuts(rows: list[tuple[str, Metrics]]) -> list[str]:
    """TOPAS's cut against the best baseline (the lowest of every registered baseline,
    chosen per metric), one line per metric."""
    labels = {"mean_jct": "mean JCT", "p99_jct": "p99 JCT"}
    return [
        f"topas {labels[c.metric]}: {c.ours:.1f} s against the best baseline's "
        f"{c.theirs:.1f} s ({c.best}): {abs(c.percent):.1f}% "
        + ("faster" if c.percent >= 0 else "slower")
        for c in cuts_vs_best(rows)
    ]


# --------------------------------------------------------------------------- helpers


def _prediction_error(args: argparse.Namespace) -> float:
    sigma = args.prediction_error
    if not (math.isfinite(sigma) and sigma >= 0):
        raise CliError(f"--prediction-error: must be a finite number >= 0, got {sigma}")
    return sigma


# the simulated figures of the summary (the wall-clock decision times stay out of tables)
COLUMNS = tuple(k for k in Metrics.SUMMARY_KEYS if not k.startswith("decision_time"))


def format_table(rows: list[tuple[str, Metrics]], timing: str) -> str:
    unit = "s"
    header = ["policy"] + [
        c.replace("_jct", "") + (f" ({unit})" if "jct" in c or c == "makespan" else "")
        for c in COLUMNS
    ]
    if timing == "step":
        header.append("sum JCT (steps)")
    lines = []
    for spec, m in rows:
        cells = [spec]
        for c in COLUMNS:
            v = getattr(m, c)
            cells.append(f"{v:.3f}" if isinstance(v, float) else str(v))
        if timing == "step":
            cells.append(str(m.objective_steps))
        lines.append(cells)
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        cells = zip(row, widths, strict=True)
        return "  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(cells))

    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *map(fmt, lines)])


def format_csv(rows: list[tuple[str, Metrics]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["policy", *COLUMNS, "sum_jct", "objective_steps"])
    for spec, m in rows:
        w.writerow([spec, *(getattr(m, c) for c in COLUMNS), m.sum_jct, m.objective_steps])
    return buf.getvalue()


def _parse_kv(item: str) -> tuple[str, str]:
    """``KEY=VALUE``; the workload converts the value to its parameter's type."""
    key, eq, value = item.partition("=")
    if not eq or not key:
        raise CliError(f"--param: expected KEY=VALUE, got {item!r}")
    return key, value


if __name__ == "__main__":
    sys.exit(main())
