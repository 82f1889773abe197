"""Optimality gaps of online policies against the clairvoyant exact oracle.

:func:`run_gap_study` draws small step-model instances from workload families
(:func:`topas.workloads.small_instance`), solves each one exactly
(:func:`topas.oracle.solve`), runs every policy on it in the step model, and reports
how far each policy's sum of JCTs is from the optimum. It writes

- ``config.json``: the configuration, resolved policy specs, seeds, package version;
- ``runs.csv``: one row per instance x policy (:data:`RUN_COLUMNS`);
- ``summary.md``: per-policy and per-family gap statistics over proven-optimal instances,
  the share proven optimal per size, the gap intervals of unproven instances;
- ``gap.png``: the distribution of the gap (%) per policy.

Definitions (``docs/gap.md``): with ``P`` a policy's sum of JCTs in steps and ``OPT`` the
optimum, ``gap_abs = P - OPT`` steps and ``gap_pct = 100 * (P - OPT) / OPT``. An instance
is *proven* when the oracle reports ``optimal`` (see :func:`is_proven`). Otherwise ``OPT``
lies in ``[LB, UB]`` (``UB``: the best schedule known, the oracle's or the best
policy's), so the gap lies in
``[P - UB, P - LB]`` steps and ``[100 (P - UB) / UB, 100 (P - LB) / LB]`` percent.

The oracle is clairvoyant (it knows every arrival and true length in advance) while the
policies are online (they see released tasks and predicted lengths only), so a gap
measures the price of not knowing the future as well as any weakness of the policy.

Instance seeds: instance ``i`` (0-based) with ``n`` tasks in a study with seed ``s`` uses
``small_instance(family, seed=s * 1_000_000 + n * 1_000 + i, num_tasks=n)`` (see
:func:`instance_seed`), the same for every family; the policies are simulated with the
same seed.

This module never imports :mod:`topas.cli` or ``analysis``.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from topas.errors import InputError
from topas.oracle.problem import OracleResult
from topas.policies import BASELINES, make_policy
from topas.runs import best_schedule, policy_objectives
from topas.studies import (
    EXCLUDED_POLICIES,
    StudyConfig,
    config_json,
    default_policies,
    md_table,
    rows_to_csv,
    run_jobs,
    write_outputs,
)
from topas.studies.checkpoint import Checkpoint
from topas.studies.gap_plot import plot_gaps

DEFAULT_FAMILIES = ("chain", "fanout", "mixed", "metagpt-sop", "metagpt-tl")
"""The workload families a study draws instances from by default."""

MAX_INSTANCES = 1000
MAX_TASKS = 999

CLAIRVOYANCE = (
    "The oracle is clairvoyant: it knows every future arrival and every true output length "
    "in advance, while the policies are online: they see only the tasks released so far and "
    "predicted lengths. A gap therefore measures the price of not knowing the future as well "
    "as any weakness of the policy."
)

RUN_COLUMNS = (
    "family",
    "tasks",
    "stages",
    "agents",
    "instance_index",
    "instance_seed",
    "instance_name",
    "instance_hash",
    "backend",
    "oracle_status",
    "proven",
    "optimum",
    "lower_bound",
    "upper_bound",
    "oracle_runtime_s",
    "policy",
    "policy_objective",
    "gap_abs",
    "gap_abs_low",
    "gap_abs_high",
    "gap_pct",
    "gap_pct_low",
    "gap_pct_high",
)
"""Columns of ``runs.csv``. ``optimum``, ``gap_abs`` and ``gap_pct`` are empty for
unproven instances; ``*_low``/``*_high`` always hold the interval (equal to the point
value when proven). Objectives and gaps in steps are sums of JCTs."""


TUNING_SEED_MIN = 1000
"""Seeds (study seeds here, instance seeds in the simulation studies) at or above this are
for choosing defaults; reports use seeds below it."""

TUNING_STUDY_SEEDS = (
    f"0 (the 45 instances today's topas defaults were tuned on) and >= {TUNING_SEED_MIN}"
)
"""The gap-study seeds kept for choosing defaults; reports use others (default 1)."""
REPORT_STUDY_SEED = 1


def is_tuning_seed(seed: int) -> bool:
    return seed == 0 or seed >= TUNING_SEED_MIN


class GapModelError(RuntimeError):
    """A policy did better than a proven optimum or a lower bound: the oracle (or the
    simulator) breaks the step model. Never expected; raised loudly."""


@dataclass(frozen=True)
class GapConfig(StudyConfig):
    """What a gap study runs.

    ``policies=None`` means every registered policy except ``replay``. ``threads`` is the
    solver's threads per instance; ``jobs`` instances are solved in parallel (joblib), so
    a study uses about ``jobs * threads`` cores.
    """

    families: tuple[str, ...]
    task_counts: tuple[int, ...] = (2, 3, 4)
    instances: int = 5
    policies: tuple[str, ...] | None = None
    backend: str = "cpsat"
    time_limit: float = 30.0
    seed: int = REPORT_STUDY_SEED
    jobs: int = 1
    threads: int = 1
    profile: str | None = None  # server profile of the instances (None: each family's)

    def validate(self) -> None:
        validate_config(self)

    def resolved_policies(self) -> tuple[str, ...]:
        """The policy specs the study runs, in order."""
        if self.policies is None:
            return default_policies()
        return tuple(self.policies)


def instance_seed(seed: int, num_tasks: int, index: int) -> int:
    """The seed of instance ``index`` with ``num_tasks`` tasks in a study with ``seed``."""
    return seed * 1_000_000 + num_tasks * 1_000 + index


def validate_config(config: GapConfig) -> tuple[str, ...]:
    """Check ``config`` before any solving; return the resolved policy specs.

    Raises ValueError with one line naming the bad setting.
    """
    from topas.oracle import BACKENDS
    from topas.workloads import get_workload

    if isinstance(config.families, str) or not config.families:
        raise InputError("families: give at least one workload family (a tuple of names)")
    for f in config.families:
        try:
            get_workload(f)
        except ValueError as e:
            raise InputError(f"families: {e}") from None
    if len(set(config.families)) != len(config.families):
        raise InputError(f"families: duplicates in {', '.join(config.families)}")
    if isinstance(config.task_counts, int) or not config.task_counts:
        raise InputError("task_counts: give at least one task count (a tuple of integers)")
    for n in config.task_counts:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TASKS:
            raise InputError(f"task_counts: {n!r} is not an integer in 1..{MAX_TASKS}")
    if len(set(config.task_counts)) != len(config.task_counts):
        raise InputError(f"task_counts: duplicates in {config.task_counts}")
    if (
        isinstance(config.instances, bool)
        or not isinstance(config.instances, int)
        or not 1 <= config.instances <= MAX_INSTANCES
    ):
        raise InputError(f"instances: {config.instances!r} is not an integer in 1..{MAX_INSTANCES}")
    if isinstance(config.seed, bool) or not isinstance(config.seed, int) or config.seed < 0:
        raise InputError(f"seed: {config.seed!r} is not an integer >= 0")
    if config.backend not in BACKENDS:
        raise InputError(f"backend: unknown {config.backend!r}; choose from {', '.join(BACKENDS)}")
    tl = config.time_limit
    if isinstance(tl, bool) or not isinstance(tl, int | float) or not math.isfinite(tl) or tl <= 0:
        raise InputError(f"time_limit: {tl!r} is not a finite number of seconds > 0")
    if isinstance(config.jobs, bool) or not isinstance(config.jobs, int) or config.jobs == 0:
        raise InputError(f"jobs: {config.jobs!r} is not a nonzero integer (-1: every core)")
    if (
        isinstance(config.threads, bool)
        or not isinstance(config.threads, int)
        or config.threads < 1
    ):
        raise InputError(f"threads: {config.threads!r} is not an integer >= 1")
    if config.profile is not None:
        from topas.profiles import ProfileError, get_profile

        try:
            get_profile(config.profile)
        except ProfileError as e:
            raise InputError(f"profile: {e}") from None
    if config.policies is not None and (isinstance(config.policies, str) or not config.policies):
        raise InputError("policies: give at least one policy spec (a tuple), or None for all")
    specs = config.resolved_policies()
    if not specs:
        raise InputError("policies: no registered policy to run")
    for spec in specs:
        if not isinstance(spec, str) or not spec.strip():
            raise InputError(f"policies: empty or non-string spec {spec!r}")
        if spec.strip().partition(":")[0] in EXCLUDED_POLICIES:
            raise InputError(
                f"policies: {spec!r} replays one recorded schedule; it cannot run on "
                "generated instances"
            )
        try:
            make_policy(spec)
        except ValueError as e:  # PolicySpecError
            raise InputError(f"policies: {e}") from None
    if len(set(specs)) != len(specs):
        raise InputError(f"policies: duplicates in {', '.join(specs)}")
    return specs


# --------------------------------------------------------------------------- oracle helpers


def is_proven(result: OracleResult) -> bool:
    """Optimality is proven: the oracle reports ``optimal`` (:func:`topas.oracle.solve`
    also reports it when the solver's bound, rounded up, meets the integer objective).
    The study adds no proof rule of its own, so it is only as sound as that bound."""
    return result.objective is not None and result.status == "optimal"


def policy_gap(
    objective: int, lower_bound: int, upper_bound: int, proven: bool, where: str = ""
) -> dict[str, float | int | None]:
    """Gap of a policy with sum of JCTs ``objective`` when the optimum lies in
    ``[lower_bound, upper_bound]`` (equal when ``proven``).

    Raises :class:`GapModelError` if the policy beats the lower bound (or a proven
    optimum): a schedule cannot do better than the optimum of the same model.
    """
    if lower_bound < 1 or upper_bound < lower_bound:
        raise GapModelError(f"{where}bad oracle bounds [{lower_bound}, {upper_bound}]")
    if proven and lower_bound != upper_bound:
        raise GapModelError(f"{where}proven optimal but bounds [{lower_bound}, {upper_bound}]")
    if objective < lower_bound:
        what = "the proven optimum" if proven else "the oracle's lower bound"
        raise GapModelError(
            f"{where}a policy's sum of JCTs {objective} is below {what} {lower_bound}: "
            "the oracle or the simulator breaks the step model"
        )
    low_abs = objective - upper_bound
    high_abs = objective - lower_bound
    low_pct = 100.0 * low_abs / upper_bound
    high_pct = 100.0 * high_abs / lower_bound
    return {
        "gap_abs": high_abs if proven else None,
        "gap_abs_low": low_abs,
        "gap_abs_high": high_abs,
        "gap_pct": high_pct if proven else None,
        "gap_pct_low": low_pct,
        "gap_pct_high": high_pct,
    }


def study_instance(
    family: str,
    num_tasks: int,
    index: int,
    config_seed: int,
    specs: Sequence[str],
    backend: str,
    time_limit: float,
    threads: int,
    profile: str | None = None,
) -> list[dict[str, Any]]:
    """Generate, simulate and solve one instance; its rows of ``runs.csv``.

    The warm start (and the upper bound on the optimum) is the best schedule of the
    baselines and the study's policies.
    """
    from topas.oracle import solve
    from topas.workloads import small_instance

    seed = instance_seed(config_seed, num_tasks, index)
    inst = small_instance(family, seed=seed, num_tasks=num_tasks, profile=profile)
    candidates = list(dict.fromkeys([*specs, *BASELINES]))
    runs = policy_objectives(inst, candidates, seed=seed)
    _, warm_obj, warm = best_schedule(runs)
    result = solve(inst, backend=backend, time_limit=time_limit, threads=threads, warm_start=warm)
    proven = is_proven(result)
    where = f"{family} n={num_tasks} seed={seed} ({backend}): "
    if result.objective is not None and result.objective < result.lower_bound:
        raise GapModelError(f"{where}oracle objective {result.objective} below its bound")
    if proven:
        assert result.objective is not None
        upper = lower = result.objective
    else:
        upper = warm_obj if result.objective is None else min(result.objective, warm_obj)
        lower = result.lower_bound
    for spec, (obj, _) in runs.items():  # every simulated policy, warm-start ones too
        policy_gap(obj, lower, upper, proven, where=f"{where}policy {spec!r}: ")
    base = {
        "family": family,
        "tasks": num_tasks,
        "stages": inst.num_stages,
        "agents": len(inst.agents),
        "instance_index": index,
        "instance_seed": seed,
        "instance_name": inst.name,
        "instance_hash": inst.content_hash,
        "backend": backend,
        "oracle_status": result.status,
        "proven": proven,
        "optimum": upper if proven else None,
        "lower_bound": lower,
        "upper_bound": upper,
        "oracle_runtime_s": round(result.runtime, 3),
    }
    rows = []
    for spec in specs:
        obj = runs[spec][0]
        gap = policy_gap(obj, lower, upper, proven, where=f"{where}policy {spec!r}: ")
        rows.append({**base, "policy": spec, "policy_objective": obj, **gap})
    return rows


# --------------------------------------------------------------------------- the study


def run_gap_study(
    config: GapConfig,
    out_dir: str | Path,
    progress: bool = True,
    command: str | None = None,
    resume: bool = False,
) -> str:
    """Run the gap study of ``config``; write ``out_dir/{config.json, runs.csv,
    summary.md, gap.png}``; return the summary (markdown).

    ``command``: the command line to print in the summary (default: the equivalent
    ``topas gap`` command). Bad configuration raises ValueError before any solving; a
    policy beating a proven optimum or a lower bound raises :class:`GapModelError`.
    Solved instances are kept in ``out_dir``'s checkpoint as they finish
    (:mod:`topas.studies.checkpoint`); ``resume`` reuses those an interrupted run left,
    which is otherwise refused (InputError).
    """
    specs = config.resolved_policies()  # validated when the config was built
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"out_dir: {out} exists and is not a folder")
    cmd = command or gap_command(config, out)
    args = (config.seed, tuple(specs), config.backend, config.time_limit, config.threads)
    jobs = [
        (family, n, i, *args, config.profile)
        for family in config.families
        for n in config.task_counts
        for i in range(config.instances)
    ]
    checkpoint = Checkpoint.open(out, resume)
    per_instance = run_jobs(
        _study_job,
        jobs,
        config.jobs,
        progress,
        desc="gap study",
        unit="instance",
        checkpoint=checkpoint,
    )
    rows = [row for instance_rows in per_instance for row in instance_rows]
    summary = summarize(rows, config, specs, cmd) + checkpoint.note(len(jobs), "instances")
    params = gap_params(config, specs) | checkpoint.params("instances")
    files: dict[str, str | bytes] = {
        "config.json": config_json("optimality gap", params, cmd),
        "runs.csv": rows_to_csv(rows, RUN_COLUMNS),
        "summary.md": summary,
        "gap.png": plot_gaps(rows, specs),  # rendering sits in its own module
    }
    write_outputs(out, files)
    checkpoint.remove()
    return summary


def _study_job(job: tuple) -> list[dict[str, Any]]:
    """:func:`study_instance` of one job tuple (a module-level function, for the workers)."""
    return study_instance(*job)


def gap_command(config: GapConfig, out: Path) -> str:
    """The ``topas gap`` command line equivalent to ``config``."""
    args = [
        "topas",
        "gap",
        "--families",
        ",".join(config.families),
        "--tasks",
        ",".join(str(n) for n in config.task_counts),
        "--instances",
        str(config.instances),
        "--backend",
        config.backend,
        "--time-limit",
        f"{config.time_limit:g}",
        "--seed",
        str(config.seed),
        "--jobs",
        str(config.jobs),
    ]
    if config.policies is not None:
        args += ["--policies", ",".join(config.policies)]
    if config.profile is not None:
        args += ["--profile", config.profile]
    args += ["--out", str(out)]
    line = shlex.join(args)
    if config.threads != 1:
        line += f"  # with {config.threads} solver threads per instance"
    return line


def gap_params(config: GapConfig, specs: Sequence[str]) -> dict[str, Any]:
    """What config.json records beside the study framework's own keys."""
    return {
        "config": config.to_json(),
        "policies": list(specs),
        "instance_seed": "seed * 1000000 + tasks * 1000 + index (index 0-based)",
        "seed_split": {
            "tuning": f"study seed {TUNING_STUDY_SEEDS}",
            "report": f"any other study seed, by default {REPORT_STUDY_SEED}",
            "this_study": "tuning" if is_tuning_seed(config.seed) else "report",
        },
        "instance_generator": "topas.workloads.small_instance(family, seed, num_tasks)",
        "timing": "step",
        "oracle": "topas.oracle.solve; warm start: best baseline/policy step schedule",
        "proven": "the oracle reports status optimal",
        "clairvoyance": CLAIRVOYANCE,
    }


# --------------------------------------------------------------------------- summary


def _f(x: float, digits: int = 1) -> str:
    return f"{x:.{digits}f}"


def _stats(values: Sequence[float]) -> tuple[float, float, float]:
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(np.percentile(a, 90)), float(a.max())


def stage_bin(stages: int, width: int = 4) -> str:
    lo = (stages // width) * width
    return f"{lo}-{lo + width - 1}"


def _instances(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[tuple[str, int, int], dict[str, Any]] = {}
    for r in rows:
        seen.setdefault((r["family"], r["tasks"], r["instance_index"]), r)
    return list(seen.values())


def _proven_share_table(insts: Sequence[dict[str, Any]], key: str, label: str) -> str:
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in insts:
        k = stage_bin(r["stages"]) if key == "stage_bin" else r[key]
        groups.setdefault(k, []).append(r)

    def order(k: Any) -> Any:
        return int(str(k).split("-")[0]) if key == "stage_bin" else k

    body = []
    for k in sorted(groups, key=order):
        g = groups[k]
        n_proven = sum(1 for r in g if r["proven"])
        times = [r["oracle_runtime_s"] for r in g]
        body.append(
            [
                k,
                len(g),
                f"{min(r['stages'] for r in g)}-{max(r['stages'] for r in g)}",
                n_proven,
                f"{100.0 * n_proven / len(g):.0f}%",
                _f(float(np.median(times)), 2),
                _f(max(times), 2),
            ]
        )
    header = [label, "instances", "stages", "proven", "share proven", "median s", "max s"]
    return md_table(header, body)


def _policy_table(rows: Sequence[dict[str, Any]], specs: Sequence[str]) -> str:
    body = []
    for spec in specs:
        pr = [r for r in rows if r["policy"] == spec and r["proven"]]
        un = [r for r in rows if r["policy"] == spec and not r["proven"]]
        if pr:
            m, p90, mx = _stats([r["gap_pct"] for r in pr])
            ma, p90a, mxa = _stats([r["gap_abs"] for r in pr])
            at_opt = sum(1 for r in pr if r["gap_abs"] == 0)
            cells = [_f(m), _f(p90), _f(mx), _f(ma), _f(p90a), _f(mxa), f"{at_opt}/{len(pr)}"]
        else:
            cells = ["-"] * 6 + ["0/0"]
        if un:
            lo = float(np.mean([r["gap_pct_low"] for r in un]))
            hi = float(np.mean([r["gap_pct_high"] for r in un]))
            cells.append(f"{len(un)}: [{_f(lo)}, {_f(hi)}]")
        else:
            cells.append("0")
        body.append([f"`{spec}`", len(pr), *cells])
    header = [
        "policy",
        "n",
        "mean gap %",
        "p90 gap %",
        "max gap %",
        "mean gap (steps)",
        "p90 (steps)",
        "max (steps)",
        "at optimum",
        "unproven: mean gap % interval",
    ]
    return md_table(header, body)


def _family_table(
    rows: Sequence[dict[str, Any]], specs: Sequence[str], families: Sequence[str]
) -> str:
    body = []
    for fam in families:
        for spec in specs:
            pr = [r for r in rows if r["policy"] == spec and r["proven"] and r["family"] == fam]
            if not pr:
                body.append([fam, f"`{spec}`", 0, "-", "-", "-", "-", "-"])
                continue
            m, p90, mx = _stats([r["gap_pct"] for r in pr])
            ma, _, mxa = _stats([r["gap_abs"] for r in pr])
            body.append([fam, f"`{spec}`", len(pr), _f(m), _f(p90), _f(mx), _f(ma), _f(mxa, 0)])
    header = [
        "family",
        "policy",
        "n",
        "mean gap %",
        "p90 gap %",
        "max gap %",
        "mean (steps)",
        "max (steps)",
    ]
    return md_table(header, body)


def _unproven_table(rows: Sequence[dict[str, Any]], specs: Sequence[str]) -> str:
    insts = [r for r in _instances(rows) if not r["proven"]]
    if not insts:
        return "Every instance was proven optimal."
    by_key = {(r["family"], r["tasks"], r["instance_index"], r["policy"]): r for r in rows}
    body = []
    for inst in insts:
        k = (inst["family"], inst["tasks"], inst["instance_index"])
        cells = []
        for spec in specs:
            r = by_key[(*k, spec)]
            cells.append(
                f"[{r['gap_abs_low']}, {r['gap_abs_high']}] / "
                f"[{_f(r['gap_pct_low'])}, {_f(r['gap_pct_high'])}]"
            )
        body.append(
            [
                inst["family"],
                inst["tasks"],
                inst["stages"],
                inst["instance_seed"],
                inst["oracle_status"],
                inst["lower_bound"],
                inst["upper_bound"],
                _f(inst["oracle_runtime_s"], 1),
                *cells,
            ]
        )
    header = ["family", "tasks", "stages", "seed", "status", "LB", "UB", "oracle s"]
    header += [f"`{s}` steps / %" for s in specs]
    return md_table(header, body)


def summarize(
    rows: Sequence[dict[str, Any]], config: GapConfig, specs: Sequence[str], command: str
) -> str:
    """The markdown summary of a study's rows."""
    insts = _instances(rows)
    n_proven = sum(1 for r in insts if r["proven"])
    objectives = [r["upper_bound"] for r in insts]
    parts = [
        "# Optimality gap of online policies (step model)",
        "",
        f"**{CLAIRVOYANCE}**",
        "",
        f"Reproduce with: `{command}`",
        "",
        f"- families: {', '.join(config.families)}; tasks per instance: "
        f"{', '.join(map(str, config.task_counts))}; {config.instances} instance(s) per "
        f"family and size: {len(insts)} instances, "
        f"{min(r['stages'] for r in insts)}-{max(r['stages'] for r in insts)} stages, "
        f"best sums of JCTs {min(objectives)}-{max(objectives)} steps",
        f"- oracle: `{config.backend}`, {config.time_limit:g} s and {config.threads} "
        f"thread(s) per instance; proven optimal: {n_proven}/{len(insts)} "
        f"({100.0 * n_proven / len(insts):.0f}%)",
        f"- policies (online, step model): {', '.join(f'`{s}`' for s in specs)}",
        "",
        "Gap of a policy on an instance: `gap_abs = P - OPT` (steps, sums of JCTs) and "
        "`gap % = 100 (P - OPT) / OPT`. Statistics below are over the instances proven "
        "optimal; unproven instances are reported as intervals from the lower bound LB and "
        "the best known schedule UB: `[P - UB, P - LB]` steps, "
        "`[100 (P - UB)/UB, 100 (P - LB)/LB]` %.",
        "",
        "## Gap per policy (proven-optimal instances)",
        "",
        _policy_table(rows, specs),
        "",
        "## Gap per family (proven-optimal instances)",
        "",
        _family_table(rows, specs, config.families),
        "",
        "## Share proven optimal per size",
        "",
        _proven_share_table(insts, "tasks", "tasks"),
        "",
        _proven_share_table(insts, "stage_bin", "stage bin"),
        "",
        _proven_share_table(insts, "family", "family"),
        "",
        "## Unproven instances: gap intervals (steps / %)",
        "",
        _unproven_table(rows, specs),
        "",
    ]
    return "\n".join(parts)
