"""Policies run on one instance: the simulation, its metrics and its result document.

What ``topas simulate``, ``topas compare`` and ``topas demo`` do, as library calls:
:func:`run_policy` simulates one policy spec and builds its ``topas-result/1`` document,
:func:`compare_policies` runs several specs on the same instance and :func:`cuts_vs_best`
gives a policy's cut in mean and p99 JCT against the best of every registered baseline.
In the step model, :func:`policy_objectives` and :func:`best_schedule` give each policy's
sum of JCTs and the best schedule among them (the oracle's warm start, the gap study).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from topas.instance import Instance
from topas.policies import BASELINES, make_policy
from topas.results import result_document
from topas.schedule import Metrics, Schedule, evaluate
from topas.simulator import simulate

PROGRESS_MIN_STAGES = 2000
"""Runs with fewer stages than this show no progress bar (they take a second or so)."""


def timing_mode(inst: Instance, requested: str | None) -> str:
    """``requested`` wins; else a step cost model means step, anything else calibrated."""
    if requested is not None:
        return requested
    cm = inst.server.cost_model
    return "step" if cm is not None and cm.kind == "step" else "calibrated"


def run_policy(
    inst: Instance,
    spec: str,
    timing: str,
    seed: int,
    progress: bool = False,
    include_schedule: bool = False,
    prediction_error: float = 0.0,
) -> tuple[Metrics, dict[str, Any]]:
    """Simulate one policy spec on ``inst`` and build its result document (a progress bar
    on stderr for long runs when ``progress``)."""
    policy = make_policy(spec)
    bar = _progress_bar(inst.num_stages, spec, progress)
    t0 = time.perf_counter()
    try:
        schedule = simulate(
            inst,
            policy,
            timing=timing,
            seed=seed,
            progress=None if bar is None else bar.update,
            prediction_error=prediction_error,
        )
    finally:
        if bar is not None:
            bar.close()
    runtime = time.perf_counter() - t0
    metrics = evaluate(schedule)
    extra = {"prediction_error": prediction_error} if prediction_error else None
    doc = result_document(
        inst,
        schedule,
        metrics,
        spec,
        seed,
        timing,
        runtime,
        include_schedule=include_schedule,
        extra=extra,
    )
    return metrics, doc


def compare_policies(
    inst: Instance,
    specs: Sequence[str],
    timing: str,
    seed: int,
    progress: bool = False,
    prediction_error: float = 0.0,
) -> list[tuple[str, Metrics]]:
    """(spec, metrics) of every spec on the same instance, in the order given."""
    return [
        (spec, run_policy(inst, spec, timing, seed, progress, prediction_error=prediction_error)[0])
        for spec in specs
    ]


@dataclass(frozen=True)
class Cut:
    """A policy's cut against the best baseline on one metric (positive: it is faster)."""

    metric: str  # a Metrics field: mean_jct, p99_jct
    ours: float
    best: str  # the baseline with the lowest value of the metric
    theirs: float

    @property
    def percent(self) -> float:
        return 100.0 * (1.0 - self.ours / self.theirs)


def cuts_vs_best(
    rows: Sequence[tuple[str, Metrics]],
    proposed: str = "topas",
    metrics: Sequence[str] = ("mean_jct", "p99_jct"),
) -> list[Cut]:
    """``proposed``'s cut per metric against the best of every registered baseline in
    ``rows`` (chosen per metric; all of :data:`~topas.policies.BASELINES` must be there)."""
    got = dict(rows)
    missing = [b for b in (proposed, *BASELINES) if b not in got]
    if missing:
        raise ValueError(f"cuts_vs_best: no run of {', '.join(missing)}")
    out = []
    for key in metrics:
        best = min(BASELINES, key=lambda b: getattr(got[b], key))
        out.append(Cut(key, getattr(got[proposed], key), best, getattr(got[best], key)))
    return out


def policy_objectives(
    instance: Instance, specs: Iterable[str], seed: int = 0
) -> dict[str, tuple[int, Schedule]]:
    """Each policy's sum of JCTs in steps (and its schedule) in the step model."""
    out: dict[str, tuple[int, Schedule]] = {}
    for spec in specs:
        try:
            sched = simulate(instance, make_policy(spec), timing="step", seed=seed)
        except Exception as e:
            e.add_note(f"while simulating policy {spec!r} on instance {instance.name!r}")
            raise
        obj = evaluate(sched).objective_steps
        assert obj is not None
        out[spec] = (obj, sched)
    return out


def best_schedule(runs: dict[str, tuple[int, Schedule]]) -> tuple[str, int, Schedule]:
    """The policy with the smallest objective (ties: first), its objective and schedule."""
    spec = min(runs, key=lambda s: runs[s][0])
    return spec, runs[spec][0], runs[spec][1]


def best_baseline_schedule(instance: Instance) -> Schedule:
    """The best registered baseline's step-model schedule (least sum of JCTs; the first in
    registry order among equals): the oracle's warm start (``topas.oracle.solve``), a good
    upper bound and a short horizon."""
    return best_schedule(policy_objectives(instance, BASELINES))[2]


def _progress_bar(total: int, desc: str, enabled: bool):  # type: ignore[no-untyped-def]
    if not enabled or total < PROGRESS_MIN_STAGES:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="stage", leave=False, file=sys.stderr)
