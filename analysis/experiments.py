"""Shared helpers of the simulation studies ``compare_policies.py`` and ``ablation.py``.

Not a script: the two studies put this folder on ``sys.path`` and ``import experiments``.

- :func:`run_point`: one simulation (workload, load, seed, policy spec) -> one CSV row.
  Every worker regenerates its instance from (workload, num_tasks, seed, load), so nothing
  large crosses process boundaries.
- :func:`run_grid`: many rows in parallel through the study framework's runner
  (:func:`topas.studies.run_jobs`: joblib, a bar that advances as runs finish, rows in the
  order of the jobs).
- Paired statistics over seeds: :func:`paired_reduction` (mean relative change, 95% CI
  half-width, Student t) and :func:`best_baseline` (per point and per metric).
- Output: :func:`run_study` renders config.json, runs.csv and summary.md with the study
  framework (:mod:`topas.studies`: CSV and markdown writers, ``config_json``, the atomic
  ``write_outputs``) plus each study's plots, rendered here to PNG bytes.
- CLI validation shared by both scripts: bad input raises :class:`CliError`, which
  :func:`run_cli` turns into one ``error: ...`` line on stderr and exit status 2, before
  any run and before the output folder exists.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from topas.errors import InputError
from topas.instance import Instance
from topas.policies import BASELINES, make_policy, split_specs
from topas.policies.base import Policy
from topas.schedule import Metrics, Schedule, evaluate
from topas.simulator import simulate
from topas.studies import StudyParams, md_table, run_jobs, study_files, write_outputs
from topas.studies import config_json as study_config_json
from topas.studies.checkpoint import Checkpoint, add_resume_option, replayable
from topas.studies.gap import TUNING_SEED_MIN
from topas.workloads import WORKLOADS, generate, mean_task_demand_s
from topas.workloads.arrivals import rate_for_load

STUDY_WORKLOADS = tuple(name for name, w in WORKLOADS.items() if w.profile is None)
"""The families on the project's default profile: the default of compare and ablation.
The paper's five (on its own profile) are ``analysis/reproduce_paper.py``'s."""

TIMING = "calibrated"

# TUNING_SEED_MIN (topas.studies.gap): seeds at or above it are for choosing defaults; studies
# report on seeds below it, so no reported figure comes from an instance a default was
# tuned on (config.json records both sets).

LEGACY_TUNING_SEEDS = (0, 1, 2, 10, 11, 12)
"""The calibrated seeds today's ``topas`` defaults were chosen on (0-2, load 1.2) and
checked on (10-12) before the split (docs/topas.md): no study reports on them."""

REPORT_SEED_START = 20
"""``--seeds N`` means the N reporting seeds from here: 20, 21, ... (never tuned on)."""
SEEDS_HELP = "N (the first N reporting seeds, 20 onwards) or a comma list (one seed: 'S,')"
ABLATION_TERMS = ("progress", "move", "reuse", "redo", "revoke", "aging", "reserve", "visit")
"""The weights of ``topas``'s score (topas/policies/search.py) that the ablation switches off."""
ABLATION_MODES = ("search=all", "drain=0", "drain_discount=0", "drain_load=0", "retract=1")
"""Switches of the search itself: no choice of residency; no drains (a prefix in use
stays in R'); drained memory at full credit; no prompt waiting for drained memory (a set
whose loads do not fit now is no candidate); voluntary retraction on (off by default:
with it off, ``redo=0`` and ``revoke=0`` change only the victim order when decode memory
runs out)."""

# Two-sided 95% critical values of Student's t, t_{0.975, df} for df = 1..30: the standard
# table (e.g. NIST/SEMATECH e-Handbook of Statistical Methods, section 1.3.6.7.2). Beyond
# df = 30 the normal quantile 1.96 is used (t_{0.975, 30} = 2.042 is already within 4%).
T_975: tuple[float, ...] = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
Z_975 = 1.96

# The leading columns of runs.csv; any further keys follow in first-seen order.
RUN_COLUMNS = (
    "workload",
    "load",
    "seed",
    "policy",
    "num_tasks",
    "prediction_error",
    "kv_scale",
    "kv_capacity_tokens",
    *Metrics.SUMMARY_KEYS,
    "runtime_s",
)


# --------------------------------------------------------------------------- runs


def make_instance(
    workload: str, load: float, seed: int, num_tasks: int, kv_scale: float = 1.0, **gen_kwargs: Any
) -> Instance:
    """The instance of one point; ``kv_scale`` multiplies the family's default KV budget
    (which depends on the drawn agents, hence on the seed). A ``movement`` among
    ``gen_kwargs`` moves the prefixes that way with the arrivals of the profile's own
    movement at ``load`` (:func:`with_movement`)."""
    movement = gen_kwargs.pop("movement", None)
    inst = generate(workload, num_tasks=num_tasks, seed=seed, load=load, **gen_kwargs)
    if kv_scale != 1.0:
        kv = max(1, round(inst.server.kv_capacity_tokens * kv_scale))
        gen_kwargs["kv_capacity_tokens"] = kv
        inst = generate(workload, num_tasks=num_tasks, seed=seed, load=load, **gen_kwargs)
    if movement is None:
        return inst
    return with_movement(inst, workload, load, seed, movement, **gen_kwargs)


def with_movement(
    inst: Instance, workload: str, load: float, seed: int, movement: str, **gen_kwargs: Any
) -> Instance:
    """``inst`` (drawn at ``load``) with its prefixes moved by ``movement`` and nothing
    else changed: the same tasks and arrivals. The load factor charges a recompute's
    prefill to each task's demand and a host swap not, so drawing at ``load`` with the
    other movement would change the arrival rate too; this keeps ``inst``'s."""
    agents = {a.id: a for a in inst.agents}
    rate = rate_for_load(load, mean_task_demand_s(list(inst.tasks), agents, inst.server))
    moved = generate(
        workload,
        num_tasks=len(inst.tasks),
        seed=seed,
        rate=rate,
        movement=movement,
        **gen_kwargs,
    )
    assert [t.arrival for t in moved.tasks] == [t.arrival for t in inst.tasks]
    return moved


def simulate_point(
    workload: str,
    load: float,
    seed: int,
    spec: str,
    num_tasks: int,
    prediction_error: float = 0.0,
    kv_scale: float = 1.0,
    policy: Policy | None = None,
    **gen_kwargs: Any,
) -> tuple[Instance, Schedule]:
    """One point's instance and its schedule under ``spec`` (calibrated timing);
    ``policy``, when given, runs in place of ``make_policy(spec)`` (a study's wrapper of
    it, such as ``analysis/shadow_decisions.py``'s)."""
    inst = make_instance(workload, load, seed, num_tasks, kv_scale, **gen_kwargs)
    schedule = simulate(
        inst,
        policy or make_policy(spec),
        timing=TIMING,
        seed=seed,
        prediction_error=prediction_error,
    )
    return inst, schedule


def run_point(
    workload: str,
    load: float,
    seed: int,
    spec: str,
    num_tasks: int,
    prediction_error: float = 0.0,
    kv_scale: float = 1.0,
    **gen_kwargs: Any,
) -> dict[str, Any]:
    """Simulate one policy spec on one generated instance (calibrated timing) and return
    its row: the arguments, the KV budget used, the metrics of :func:`evaluate` (JCTs in
    seconds) and ``runtime_s``, the wall-clock time of the whole point (generate, simulate,
    evaluate). ``prediction_error`` is the log-normal sigma on the output lengths the
    policy is told, drawn from ``seed`` so every policy with that seed is told the same."""
    start = time.perf_counter()
    inst, schedule = simulate_point(
        workload, load, seed, spec, num_tasks, prediction_error, kv_scale, **gen_kwargs
    )
    metrics = evaluate(schedule)
    row: dict[str, Any] = {
        "workload": workload,
        "load": load,
        "seed": seed,
        "policy": spec,
        "num_tasks": num_tasks,
        "prediction_error": prediction_error,
        "kv_scale": kv_scale,
        "kv_capacity_tokens": inst.server.kv_capacity_tokens,
        **gen_kwargs,
    }
    row.update(metrics.summary())
    row["runtime_s"] = time.perf_counter() - start
    return row


def _run_job(job: Mapping[str, Any]) -> dict[str, Any]:
    return run_point(**job)


def run_grid(
    jobs: Sequence[Mapping[str, Any]],
    n_jobs: int,
    progress: bool = True,
    checkpoint: Checkpoint | None = None,
    runner: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Run every job (keyword arguments of :func:`run_point`, or whatever ``runner``, a
    module-level function, takes) on ``n_jobs`` processes (:func:`topas.studies.run_jobs`:
    rows in the order of ``jobs``; with a ``checkpoint``, rows kept as they finish and
    reused for the jobs it holds)."""
    fn = _run_job if runner is None else runner  # looked up now: tests replace _run_job
    return run_jobs(fn, [dict(job) for job in jobs], n_jobs, progress, checkpoint=checkpoint)


def unique_jobs(jobs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``jobs`` without repeats (first occurrence kept), e.g. a run two parts share."""
    seen: set[tuple[tuple[str, Any], ...]] = set()
    out: list[dict[str, Any]] = []
    for job in jobs:
        key = tuple(sorted(job.items()))
        if key not in seen:
            seen.add(key)
            out.append(dict(job))
    return out


# --------------------------------------------------------------------------- statistics


def t_quantile_975(df: int) -> float:
    """t_{0.975} with ``df`` degrees of freedom (table for 1..30, 1.96 beyond)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return T_975[df - 1] if df <= len(T_975) else Z_975


def paired_reduction(
    topas_values: Sequence[float], base_values: Sequence[float]
) -> tuple[float, float]:
    """Mean over pairs of ``topas / base - 1`` in %, and the 95% CI half-width in %
    (Student t with n-1 df; NaN with a single pair). Negative: the first is lower."""
    a = np.asarray(topas_values, dtype=float)
    b = np.asarray(base_values, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"need two equally long non-empty series, got {a.size} and {b.size}")
    change = (a / b - 1.0) * 100.0
    n = change.size
    if n == 1:
        return float(change[0]), math.nan
    half = t_quantile_975(n - 1) * float(change.std(ddof=1)) / math.sqrt(n)
    return float(change.mean()), half


def select(rows: Iterable[Mapping[str, Any]], **match: Any) -> list[Mapping[str, Any]]:
    """The rows whose fields equal every ``match`` value."""
    return [r for r in rows if all(r[k] == v for k, v in match.items())]


def by_seed(rows: Iterable[Mapping[str, Any]], metric: str) -> dict[int, float]:
    return {int(r["seed"]): float(r[metric]) for r in rows}


def paired(
    rows: Sequence[Mapping[str, Any]], a: Mapping[str, Any], b: Mapping[str, Any], metric: str
) -> tuple[list[float], list[float]]:
    """``metric`` of the rows matching ``a`` and those matching ``b``, aligned on the seeds
    both have."""
    va, vb = by_seed(select(rows, **a), metric), by_seed(select(rows, **b), metric)
    seeds = sorted(set(va) & set(vb))
    return [va[s] for s in seeds], [vb[s] for s in seeds]


def paired_change(
    rows: Sequence[Mapping[str, Any]], a: Mapping[str, Any], b: Mapping[str, Any], metric: str
) -> tuple[float, float]:
    """:func:`paired_reduction` of ``a`` against ``b`` over their common seeds."""
    return paired_reduction(*paired(rows, a, b, metric))


def mean_of(rows: Iterable[Mapping[str, Any]], metric: str) -> float:
    values = [float(r[metric]) for r in rows]
    return float(np.mean(values)) if values else math.nan


def best_baseline(rows: Sequence[Mapping[str, Any]], baselines: Sequence[str], metric: str) -> str:
    """The baseline with the lowest mean ``metric`` over seeds among ``rows`` (the rows of
    one point); ties go to the first in ``baselines``; baselines without rows are skipped."""
    means = {b: mean_of(select(rows, policy=b), metric) for b in baselines}
    present = [b for b in baselines if not math.isnan(means[b])]
    if not present:
        raise ValueError(f"no rows for any baseline of {list(baselines)}")
    return min(present, key=lambda b: means[b])


# Changes smaller than this (in %) are never flagged: the tables print one decimal, and
# policies that differ in a few tie-breaks give consistent but negligible differences.
NEGLIGIBLE_PCT = 0.1


def worse_beyond_ci(change: float, half: float) -> bool:
    """True when the change is positive, its 95% CI excludes 0 (needs >= 2 seeds) and it is
    at least :data:`NEGLIGIBLE_PCT`."""
    return not math.isnan(half) and change - half > 0 and change >= NEGLIGIBLE_PCT


def dominating(
    rows: Sequence[Mapping[str, Any]],
    proposed: str,
    baselines: Sequence[str],
    metrics: Sequence[str],
) -> list[tuple[str, list[tuple[float, float]]]]:
    """The baselines that beat ``proposed`` on every one of ``metrics`` at once, each beyond
    the CI, among the rows of one point; each with ``proposed``'s paired change against it
    per metric (:func:`paired_change`, positive: ``proposed`` is worse). The best baseline
    is chosen per metric, so ``proposed`` can lose on both metrics to two different ones
    while no single baseline is better on both."""
    out = []
    for b in baselines:
        if not select(rows, policy=b):
            continue
        changes = [paired_change(rows, {"policy": proposed}, {"policy": b}, m) for m in metrics]
        if all(worse_beyond_ci(c, h) for c, h in changes):
            out.append((b, changes))
    return out


def dominance_section(
    rows: Sequence[Mapping[str, Any]],
    cfg: Mapping[str, Any],
    metrics: Sequence[tuple[str, str]],
) -> list[str]:
    """A summary section's lines: at how many (workload, load) points of ``cfg`` a single
    baseline beats ``cfg["proposed"]`` on every one of ``metrics`` ((key, label) pairs) at
    once (:func:`dominating`), and a table of them with TOPAS's change against it in %."""
    keys, labels = [m for m, _ in metrics], [label for _, label in metrics]
    found = {
        (w, load): dominating(
            select(rows, workload=w, load=load), cfg["proposed"], cfg["baselines"], keys
        )
        for w in cfg["workloads"]
        for load in cfg["loads"]
    }
    hits = [(w, load, b, cs) for (w, load), bs in found.items() for b, cs in bs]
    points = sum(1 for bs in found.values() if bs)
    names = " and ".join(labels)
    lines = [
        f"`{cfg['proposed']}` is worse than one single baseline on {names} at once, beyond "
        f"the CI on each, at {points} of {len(found)} points."
    ]
    if hits:
        header = ["workload", "load", "baseline", *(f"{label} change %" for label in labels)]
        body = [[w, f"{load:g}", b, *(fmt_change(c, h) for c, h in cs)] for w, load, b, cs in hits]
        lines += ["", md_table(header, body)]
    return lines


def significant(change: float, half: float) -> bool:
    """The CI excludes 0 and the change is at least :data:`NEGLIGIBLE_PCT` either way."""
    return not math.isnan(half) and abs(change) > half and abs(change) >= NEGLIGIBLE_PCT


# --------------------------------------------------------------------------- rendering


def fmt_s(x: float) -> str:
    """Seconds with three significant digits or more."""
    return f"{x:.1f}" if abs(x) >= 100 else f"{x:.3g}"


def fmt_change(change: float, half: float) -> str:
    """``-12.3 ± 4.5`` (``± n/a`` with a single seed)."""
    ci = "n/a" if math.isnan(half) else f"{half:.1f}"
    return f"{change:+.1f} ± {ci}"


def fmt_list(values: Sequence[Any]) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


_MARKERS = ("o", "s", "^", "v", "D", "x", "P", "*")


def line_style(index: int, highlight: bool = False) -> dict[str, Any]:
    """Plot keywords that keep overlapping lines apart; ``highlight``: thick and black."""
    if highlight:
        return {"color": "black", "lw": 2.2, "marker": "o", "ms": 4, "zorder": 5}
    return {"marker": _MARKERS[index % len(_MARKERS)], "ms": 4, "lw": 1.2, "alpha": 0.85}


def figure_png(fig: Any) -> bytes:
    """A matplotlib Figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    return buf.getvalue()


def run_study(
    study: str,
    script: str,
    argv: Sequence[str],
    cfg: Mapping[str, Any],
    jobs: list[dict[str, Any]],
    summarize: Callable[..., str],
    plots: Mapping[str, Callable[[list[dict[str, Any]], Mapping[str, Any]], bytes]],
    progress: bool,
    resume: bool = False,
    runner: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
) -> int:
    """Run ``jobs`` (each by ``runner``, by default :func:`run_point`), then render
    config.json, runs.csv, summary.md and ``plots`` (name -> renderer) and write them all
    into ``cfg["out"]``; print the summary.

    Finished runs are kept in the folder's checkpoint (:mod:`topas.studies.checkpoint`)
    as they arrive, and the checkpoint is deleted once the files are written. A
    checkpoint left by an interrupted run is refused (bad input) unless ``resume``, which
    reuses its runs; the summary then says how many were reused."""
    command = shlex.join(["python", script, *replayable(argv)])
    cfg = StudyParams(cfg)  # validated by the study's command line: frozen from here on
    checkpoint = open_checkpoint(Path(cfg["out"]), resume)
    start = time.perf_counter()
    rows = run_grid(jobs, cfg["jobs"], progress=progress, checkpoint=checkpoint, runner=runner)
    wall_s = time.perf_counter() - start
    summary = summarize(rows, cfg, command, wall_s) + checkpoint.note(len(rows))
    params = {**cfg.to_json(), "runs": len(rows), "wall_s": round(wall_s, 3)}
    params |= checkpoint.params()
    files = study_files(study, with_split(params), command, rows, summary, RUN_COLUMNS)
    files.update({name: render(rows, cfg) for name, render in plots.items()})
    write_outputs(Path(cfg["out"]), files)
    checkpoint.remove()
    print(summary, end="")
    return 0


def open_checkpoint(out: Path, resume: bool) -> Checkpoint:
    """The study folder's checkpoint (:meth:`Checkpoint.open`), its refusal as bad input."""
    try:
        return Checkpoint.open(out, resume)
    except InputError as e:
        raise CliError(str(e)) from None


def config_json(study: str, params: Mapping[str, Any], command: str) -> str:
    """config.json (:func:`topas.studies.config_json`) with the simulation studies' seed
    split and timing."""
    return study_config_json(study, with_split(params), command)


def with_split(params: Mapping[str, Any]) -> dict[str, Any]:
    """A simulation study's parameters with its seed split and timing, for config.json."""
    return {**params, "seed_split": SEED_SPLIT, "timing": TIMING}


def point_sections(cfg: Mapping[str, Any], table: Callable[[str, float], str]) -> list[str]:
    """A summary's sections, one per (workload, load) of ``cfg``: a heading and
    ``table(workload, load)``."""
    lines: list[str] = []
    for w in cfg["workloads"]:
        for load in cfg["loads"]:
            lines += [f"## {w}, load {load:g}", "", table(w, load)]
    return lines


def runtime_line(rows: Sequence[Mapping[str, Any]], wall_s: float, n_jobs: int) -> str:
    total = sum(float(r["runtime_s"]) for r in rows)
    per = total / len(rows) if rows else math.nan
    return (
        f"{len(rows)} runs, {per:.2f} s per run on average; {wall_s:.1f} s wall-clock "
        f"on {n_jobs} process(es)."
    )


# --------------------------------------------------------------------------- CLI


class CliError(ValueError):
    """Bad command-line input: reported as one ``error: ...`` line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one ``error: ...`` line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise CliError(message)


def run_cli(main: Callable[[Sequence[str]], int], argv: Sequence[str] | None = None) -> int:
    """Call ``main(argv)``; a :class:`CliError` becomes one stderr line and status 2."""
    try:
        return main(list(sys.argv[1:] if argv is None else argv))
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _items(text: str) -> list[str]:
    return list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))


def parse_workloads(text: str) -> list[str]:
    names = _items(text)
    if not names:
        raise CliError("--workloads: empty list")
    for name in names:
        if name not in WORKLOADS:
            raise CliError(
                f"--workloads: unknown workload {name!r} (choose from {', '.join(WORKLOADS)})"
            )
    return names


def parse_floats(text: str, option: str, minimum: float, strict: bool) -> list[float]:
    """Comma-separated finite floats, each > ``minimum`` (``strict``) or >= it."""
    values: list[float] = []
    for item in _items(text):
        try:
            v = float(item)
        except ValueError:
            raise CliError(f"{option}: expected a number, got {item!r}") from None
        bad = not math.isfinite(v) or (v <= minimum if strict else v < minimum)
        if bad:
            relation = ">" if strict else ">="
            raise CliError(f"{option}: {item!r} must be a finite number {relation} {minimum:g}")
        values.append(v)
    if not values:
        raise CliError(f"{option}: empty list")
    return list(dict.fromkeys(values))


def parse_float(text: str, option: str, minimum: float = 0.0, strict: bool = True) -> float:
    """One finite float, > ``minimum`` (``strict``) or >= it."""
    values = parse_floats(text, option, minimum, strict)
    if len(values) != 1:
        raise CliError(f"{option}: expected one number, got {text!r}")
    return values[0]


def parse_positive_float(text: str, option: str) -> float:
    return parse_float(text, option)


def predictions_note(sigma: float) -> str:
    """What a study's summary says about the output lengths its policies are told: nothing
    when they are the truth (the default), else the noise."""
    if not sigma:
        return ""
    return f"; policies told the output lengths times log-normal(0, {sigma:g}) noise"


def movement_note(movement: str | None) -> str:
    """What a study's summary says about how prefixes move: nothing for the profile's own
    movement (the default), else the override."""
    if movement is None:
        return ""
    return (
        f"; prefixes moved by {movement}, with the arrivals of each workload's own "
        "profile movement at each load"
    )


def parse_int_list(text: str, option: str, least: int) -> tuple[int, ...]:
    """Comma-separated integers, each >= ``least``, duplicates dropped (order kept)."""
    try:
        values = tuple(int(x) for x in _items(text))
    except ValueError:
        raise CliError(f"{option}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < least:
        raise CliError(f"{option}: expected integers >= {least}, got {text!r}")
    return tuple(dict.fromkeys(values))


def parse_positive_int(text: str, option: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise CliError(f"{option}: expected an integer, got {text!r}") from None
    if n <= 0:
        raise CliError(f"{option}: must be a positive integer, got {text!r}")
    return n


def parse_seeds(text: str, option: str = "--seeds") -> list[int]:
    """``N`` (no comma): the first N reporting seeds, :data:`REPORT_SEED_START` onwards
    (refused if they would reach the tuning seeds: ``--seeds 1000`` is a thousand seeds,
    not seed 1000). ``a,b,...``: those seeds (``3,`` is seed 3 alone). Tuning seeds are refused by
    :func:`check_report_seeds`, which every study applies."""
    if "," not in text:
        try:
            n = int(text)
        except ValueError:
            raise CliError(f"{option}: expected a count or a comma list, got {text!r}") from None
        if n <= 0:
            raise CliError(f"{option}: empty seed list ({text!r})")
        if REPORT_SEED_START + n > TUNING_SEED_MIN:  # a count that reaches the tuning seeds
            raise CliError(  # is almost surely a seed meant alone
                f"{option}: {n} is a count (the first {n} reporting seeds, "
                f"{REPORT_SEED_START} onwards), which would reach the tuning seeds "
                f"(>= {TUNING_SEED_MIN}); for seed {n} alone write '{n},'"
            )
        return list(range(REPORT_SEED_START, REPORT_SEED_START + n))
    seeds: list[int] = []
    for item in _items(text):
        try:
            s = int(item)
        except ValueError:
            raise CliError(f"{option}: expected an integer seed, got {item!r}") from None
        if s < 0:
            raise CliError(f"{option}: seeds must be >= 0, got {item!r}")
        seeds.append(s)
    if not seeds:
        raise CliError(f"{option}: empty seed list ({text!r})")
    return list(dict.fromkeys(seeds))


def add_profile_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--profile",
        default=None,
        help="server profile (topas profiles; default: each workload's own)",
    )


def parse_profile(text: str | None) -> str | None:
    """A known profile name, or None for each workload's default."""
    if text is None:
        return None
    from topas.profiles import ProfileError, get_profile

    try:
        return get_profile(text).name
    except ProfileError as e:
        raise CliError(f"--profile: {e}") from None


def profile_kwargs(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The ``generate`` keyword of a study's ``--profile`` (nothing when not given, so rows
    and jobs stay as they were)."""
    return {} if cfg.get("profile") is None else {"profile": cfg["profile"]}


SEED_SPLIT = {
    "tuning": f">= {TUNING_SEED_MIN}, and {fmt_list(LEGACY_TUNING_SEEDS)} (before the split)",
    "report": f"< {TUNING_SEED_MIN}, never a tuning seed; by default {REPORT_SEED_START} onwards",
}
"""What every config.json records of the split."""


def add_tuning_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--tuning", action="store_true", help="allow tuning seeds (to choose defaults)")


def add_run_options(ap: argparse.ArgumentParser) -> None:
    """``--no-progress`` and ``--resume``, the options of how a study runs."""
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_resume_option(ap)


def add_grid_options(
    ap: argparse.ArgumentParser, *, workloads: str, loads: str, policies: str, out: str
) -> None:
    """The options of a study over a grid of (workload, load, seed, policy) runs, with
    their defaults; read back by :func:`grid_config`."""
    ap.add_argument("--workloads", default=workloads, help="comma-separated")
    add_profile_option(ap)
    ap.add_argument("--loads", default=loads, help="load factors, comma-separated")
    ap.add_argument("--seeds", default="5", help=SEEDS_HELP)
    ap.add_argument("--tasks", default="200", help="tasks per instance")
    ap.add_argument("--policies", default=policies, help="policy specs")
    add_tuning_option(ap)
    ap.add_argument("--jobs", default=None, help="parallel processes (default: CPU count)")
    ap.add_argument("--out", default=out, help="output folder")
    add_run_options(ap)


def grid_config(args: Any) -> dict[str, Any]:
    """The validated values of :func:`add_grid_options` (raises :class:`CliError`)."""
    return {
        "workloads": parse_workloads(args.workloads),
        "loads": parse_floats(args.loads, "--loads", 0.0, strict=True),
        "seeds": study_seeds(args),
        "tuning": bool(args.tuning),
        "tasks": parse_positive_int(args.tasks, "--tasks"),
        "policies": parse_policies(args.policies, "--policies"),
        "jobs": parse_jobs(args.jobs),
        "out": str(check_out(args.out)),
        "profile": parse_profile(args.profile),
    }


def study_seeds(args: Any) -> list[int]:
    """``--seeds`` parsed; tuning seeds refused unless ``--tuning`` (a run for choosing
    defaults, which :func:`tuning_lines` marks in its summary)."""
    seeds = parse_seeds(args.seeds)
    return seeds if args.tuning else check_report_seeds(seeds)


def tuning_lines(cfg: Mapping[str, Any]) -> list[str]:
    """The summary's warning for a ``--tuning`` run (nothing otherwise)."""
    if not cfg.get("tuning"):
        return []
    return [
        "**Tuning seeds** (`--tuning`): a run for choosing defaults; no reported figure "
        "comes from it.",
        "",
    ]


def check_report_seeds(seeds: Sequence[int], option: str = "--seeds") -> list[int]:
    """``seeds`` if none is a tuning seed (>= :data:`TUNING_SEED_MIN`, or one of
    :data:`LEGACY_TUNING_SEEDS`), else bad input."""
    tuning = [s for s in seeds if s >= TUNING_SEED_MIN or s in LEGACY_TUNING_SEEDS]
    if tuning:
        raise CliError(
            f"{option}: {fmt_list(tuning)} are tuning seeds (>= {TUNING_SEED_MIN}, or "
            f"{fmt_list(LEGACY_TUNING_SEEDS)}, on which today's defaults were chosen); "
            f"report on others, e.g. {REPORT_SEED_START} onwards"
        )
    return list(seeds)


def parse_policies(text: str, option: str) -> list[str]:
    """Comma-separated policy specs (``topas:reuse=0,aging=0`` stays one spec), each
    checked with ``make_policy`` before anything runs."""
    specs = list(dict.fromkeys(split_specs(text)))
    if not specs:
        raise CliError(f"{option}: empty list")
    for spec in specs:
        try:
            make_policy(spec)
        except Exception as e:  # any failure to build the policy is bad input
            raise CliError(f"{option}: bad policy spec {spec!r}: {e}") from None
    return specs


def parse_jobs(text: str | None) -> int:
    if text is None:
        return os.cpu_count() or 1
    return parse_positive_int(text, "--jobs")


def check_out(path: str) -> Path:
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out: {path!r} exists and is not a folder")
    return out


def check_instances(
    workloads: Sequence[str], seeds: Sequence[int], load: float, num_tasks: int, kv_scale: float
) -> None:
    """With a non-default KV budget, generate each (workload, seed) once up front so a
    budget too small for some stage is reported as bad input, not a worker traceback."""
    if kv_scale == 1.0:
        return
    for w in workloads:
        for s in seeds:
            try:
                make_instance(w, load, s, num_tasks, kv_scale)
            except ValueError as e:
                raise CliError(f"--kv-scale {kv_scale:g}: {w} seed {s}: {e}") from None


def is_topas(spec: str) -> bool:
    """A TOPAS variant (``topas``, ``topas-greedy``, ``topas:reuse=0``, ...), never a
    baseline: "best baseline" is the best of the others."""
    return spec.partition(":")[0].startswith("topas")


def compared_policies() -> str:
    """The simulation studies' default: every registered baseline and ``topas``."""
    return ",".join([*BASELINES, "topas"])


def ablation_variants() -> list[str]:
    variants = [f"topas:{term}=0" for term in ABLATION_TERMS]
    return ["topas", *variants, *(f"topas:{mode}" for mode in ABLATION_MODES), "topas-base"]
