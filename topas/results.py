"""The ``topas-result/1`` file format (DESIGN.md, "Interfaces that outside tools rely on").

Everything in a result is reproducible from (instance, policy, seed, timing) except
the wall-clock figures: ``summary.decision_time_p50_s``, ``summary.decision_time_p99_s``
and the ``wall_clock`` object.
"""

from __future__ import annotations

import json
import os
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from topas.instance import Instance, write_atomic
from topas.schedule import Metrics, Schedule, evaluate

FORMAT = "topas-result/1"


def package_version() -> str:
    try:
        return version("topas")
    except PackageNotFoundError:  # running from a source tree
        return "0+unknown"


def result_document(
    instance: Instance,
    schedule: Schedule,
    metrics: Metrics,
    policy: str,
    seed: int,
    timing: str,
    runtime_s: float,
    include_schedule: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The result JSON object for one run."""
    summary: dict[str, Any] = metrics.summary()
    summary.update(
        num_tasks=len(instance.tasks),
        sum_jct=metrics.sum_jct,
        iterations=schedule.iterations,
        peak_kv_tokens=schedule.peak_kv_tokens,
        retractions=schedule.retractions,
    )
    if metrics.objective_steps is not None:
        summary["objective_steps"] = metrics.objective_steps
    doc: dict[str, Any] = {
        "format": FORMAT,
        "instance": {"name": instance.name, "hash": instance.content_hash},
        "policy": policy,
        "seed": seed,
        "timing": timing,
        "version": package_version(),
        "summary": summary,
        "jct": metrics.jct,
        "wall_clock": {
            "runtime_s": runtime_s,
            "policy_calls": len(schedule.decision_times_s),
            "decision_time_p50_s": metrics.decision_time_p50_s,
            "decision_time_p99_s": metrics.decision_time_p99_s,
        },
    }
    if extra:
        doc.update(extra)
    if include_schedule:
        doc["schedule"] = schedule.to_dict()
    return doc


def write_result(doc: dict[str, Any], path: str | os.PathLike[str]) -> None:
    write_atomic(path, json.dumps(doc, indent=1) + "\n")


def oracle_result_document(inst: Instance, result: Any) -> dict[str, Any]:
    """A topas-result/1 document for an oracle run (an ``OracleResult``, with its schedule;
    without one when the solver found none)."""
    extra = {
        "status": result.status,
        "objective": result.objective,
        "lower_bound": result.lower_bound,
        "runtime_s": result.runtime,
        "backend": result.backend,
        "horizon": result.horizon,
    }
    spec = f"oracle:{result.backend}"
    if result.schedule is None:
        return {
            "format": FORMAT,
            "instance": {"name": inst.name, "hash": inst.content_hash},
            "policy": spec,
            "seed": 0,
            "timing": "step",
            "version": package_version(),
            "summary": None,
            "jct": {},
            **extra,
        }
    metrics = evaluate(result.schedule)
    return result_document(
        inst,
        result.schedule,
        metrics,
        spec,
        0,
        "step",
        result.runtime,
        include_schedule=True,
        extra=extra,
    )
