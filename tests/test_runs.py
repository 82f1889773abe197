"""topas/runs.py: the library behind simulate, compare and demo."""

from __future__ import annotations

import dataclasses

import pytest

from topas.policies import BASELINES
from topas.runs import compare_policies, cuts_vs_best, run_policy, timing_mode
from topas.schedule import Metrics
from topas.workloads import generate


def _m(mean: float, p99: float) -> Metrics:
    zero = {f.name: 0 for f in dataclasses.fields(Metrics) if f.name != "jct"}
    return Metrics(jct={}, **{**zero, "mean_jct": mean, "p99_jct": p99})


def test_cuts_are_against_the_best_baseline_per_metric():
    # spf is best on the mean (8), lpm on p99 (40): topas at 6 / 44 cuts 25% and loses 10%
    rows = [("lpm", _m(10.0, 40.0)), ("spf", _m(8.0, 50.0)), ("topas", _m(6.0, 44.0))]
    rows += [(b, _m(99.0, 99.0)) for b in BASELINES if b not in ("lpm", "spf")]
    mean, p99 = cuts_vs_best(rows)
    assert (mean.best, mean.percent) == ("spf", pytest.approx(25.0))
    assert (p99.best, p99.percent) == ("lpm", pytest.approx(-10.0))


def test_cuts_need_every_baseline():
    with pytest.raises(ValueError, match="no run of"):
        cuts_vs_best([("topas", _m(1.0, 1.0)), ("lpm", _m(2.0, 2.0))])


def test_compare_runs_each_spec_as_run_policy_does():
    inst = generate("chain", num_tasks=6, seed=1)
    timing = timing_mode(inst, None)
    assert timing == "calibrated" and timing_mode(inst, "step") == "step"
    rows = compare_policies(inst, ["lpm", "topas"], timing, seed=0)
    assert [spec for spec, _ in rows] == ["lpm", "topas"]
    metrics, doc = run_policy(inst, "topas", timing, seed=0)
    assert metrics.jct == rows[1][1].jct and doc["policy"] == "topas"  # wall-clock aside
