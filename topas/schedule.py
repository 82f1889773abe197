"""Schedules and the one evaluator that turns any schedule into metrics.

A :class:`Schedule` records what happened: every execution attempt of a stage
(admission, start, end, or preemption), every prefix residency interval, and the
wall-clock time of every policy call. The simulator and the oracle both produce
one; :func:`evaluate` alone computes JCTs and the other metrics, so the two can
never disagree on what JCT means (``topas.verify`` checks feasibility).

This module imports only :mod:`topas.instance`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from topas.instance import Instance, StageRef, release_step


@dataclass(frozen=True)
class StageRun:
    """One execution attempt of a stage. Times in seconds."""

    task: str
    stage: str
    agent: str
    admit: float  # holds its KV and slot from here
    start: float  # its prefix is resident and it starts (== admit when it was a hit)
    end: float  # completion, or the preemption time when ``preempted``
    preempted: bool = False
    prefix_hit: bool = False  # the prefix was resident at admission

    @property
    def ref(self) -> StageRef:
        return (self.task, self.stage)


@dataclass(frozen=True)
class PrefixInterval:
    """An agent's prefix held in KV from ``load_start`` (resident from ``resident_from``)."""

    agent: str
    load_start: float
    resident_from: float
    end: float  # eviction time, or the end of the schedule


@dataclass
class Schedule:
    """Everything a run did, in seconds. ``timing`` is ``step`` or ``calibrated``."""

    instance: Instance
    timing: str
    step_s: float = 1.0
    runs: list[StageRun] = field(default_factory=list)
    prefixes: list[PrefixInterval] = field(default_factory=list)
    decision_times_s: list[float] = field(default_factory=list)  # wall clock per policy call
    iterations: int = 0  # calibrated model: simulated iterations
    peak_kv_tokens: int = 0
    retractions: int = 0  # preemptions forced by decode memory (calibrated model)

    def completed(self) -> dict[StageRef, StageRun]:
        """The final, completed run of each stage."""
        return {r.ref: r for r in self.runs if not r.preempted}

    def release(self, task_id: str) -> float:
        """A task's release time in seconds (DESIGN rule 1 in the step model)."""
        arrival = self.instance.task_by_id[task_id].arrival
        if self.timing == "step":
            return release_step(arrival, self.step_s) * self.step_s
        return arrival

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": [asdict(r) for r in self.runs],
            "prefixes": [asdict(p) for p in self.prefixes],
        }


@dataclass(frozen=True)
class Metrics:
    """What :func:`evaluate` reports. JCTs in seconds."""

    jct: dict[str, float]
    mean_jct: float
    p50_jct: float
    p90_jct: float
    p99_jct: float
    max_jct: float
    sum_jct: float
    makespan: float
    prefix_hit_rate: float
    prefix_loads: int
    preemptions: int
    decision_time_p50_s: float
    decision_time_p99_s: float
    objective_steps: int | None  # step model: sum of JCTs in steps (the oracle's objective)

    SUMMARY_KEYS = (
        "mean_jct",
        "p50_jct",
        "p90_jct",
        "p99_jct",
        "max_jct",
        "makespan",
        "prefix_hit_rate",
        "prefix_loads",
        "preemptions",
        "decision_time_p50_s",
        "decision_time_p99_s",
    )

    def summary(self) -> dict[str, float | int]:
        return {k: getattr(self, k) for k in self.SUMMARY_KEYS}


class ScheduleError(ValueError):
    """A schedule that is incomplete or breaks the model's rules."""


def evaluate(schedule: Schedule) -> Metrics:
    """Metrics of a complete schedule: every stage must have finished exactly once."""
    inst = schedule.instance
    done = schedule.completed()
    finished_count: dict[StageRef, int] = defaultdict(int)
    for r in schedule.runs:
        if not r.preempted:
            finished_count[r.ref] += 1
    for t in inst.tasks:
        for s in t.stages:
            n = finished_count.get((t.id, s.id), 0)
            if n != 1:
                raise ScheduleError(f"stage {t.id}/{s.id} finished {n} times, expected once")
    jct: dict[str, float] = {}
    for t in inst.tasks:
        end = max(done[(t.id, s.id)].end for s in t.stages)
        jct[t.id] = end - schedule.release(t.id)
    values = np.array([jct[t.id] for t in inst.tasks], dtype=float)
    starts = schedule.runs
    hits = sum(prefix_hits(schedule))
    dts = np.array(schedule.decision_times_s, dtype=float)
    objective_steps = None
    if schedule.timing == "step":
        objective_steps = int(round(float(values.sum()) / schedule.step_s))
    first_release = min(schedule.release(t.id) for t in inst.tasks)
    last_end = max(r.end for r in done.values())
    return Metrics(
        jct=jct,
        mean_jct=float(values.mean()),
        p50_jct=float(np.percentile(values, 50)),
        p90_jct=float(np.percentile(values, 90)),
        p99_jct=float(np.percentile(values, 99)),
        max_jct=float(values.max()),
        sum_jct=float(values.sum()),
        makespan=last_end - first_release,
        prefix_hit_rate=hits / len(starts) if starts else 0.0,
        prefix_loads=len(schedule.prefixes),
        preemptions=sum(1 for r in schedule.runs if r.preempted),
        decision_time_p50_s=float(np.percentile(dts, 50)) if dts.size else 0.0,
        decision_time_p99_s=float(np.percentile(dts, 99)) if dts.size else 0.0,
        objective_steps=objective_steps,
    )


def prefix_hits(schedule: Schedule) -> list[bool]:
    """Per run (in ``schedule.runs`` order): was its agent's prefix resident when it was
    admitted? For a simulated schedule (``step``, ``calibrated``) this is derived from the
    prefix intervals (resident from ``resident_from`` until ``end``), not from what the
    producer of the schedule says about itself. A live schedule has no intervals: the
    server's own report (``StageRun.prefix_hit``, from its cached tokens) is all there is."""
    if schedule.timing not in ("step", "calibrated"):
        return [r.prefix_hit for r in schedule.runs]
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for p in schedule.prefixes:
        spans[p.agent].append((p.resident_from, p.end))
    eps = 1e-9
    return [
        any(lo - eps <= r.admit < hi - eps for lo, hi in spans.get(r.agent, ()))
        for r in schedule.runs
    ]
