"""The headline studies' committed runs reproduce with today's code.

Each committed study (``docs/results/<folder>/``) keeps the ``config.json`` it ran with
and its ``runs.csv``. A few of its runs, fixed below to cover the kinds of instance it
draws (the paper's profile on its default budget; the regime map's budgets with host swap
and with recompute; today's five), are run again through the study's own job builder
and must give the committed JCTs (to the 10 significant digits ``runs.csv`` keeps); so
must every policy's sum of JCTs on every instance of the two reported gap studies, and the
committed decision bench's TOPAS runs their counts of prefix sets and admissions. A
change of the simulator, the instance generator or a policy's defaults that moves one
of these runs fails here, so the study is run again, or its section says why not,
instead of its figures silently describing other code. The regime map's recompute half
changed that way on 2026-12-07 (commit 8d31ac2) and went unnoticed until the next
session (docs/topas.md, "The regime map's two halves").

When a deliberate change moves these runs, re-run the studies named here (their
commands are in their summaries) and the docs' figures with them.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import load_analysis

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"

rp = load_analysis("reproduce_paper")
cp = load_analysis("compare_policies")
audit = load_analysis("audit_results")

# the regime map's cell at half the budget in prompts, recompute, DAG-4, load 1.2, seed 20
MAP_RECOMPUTE = {
    "workload": "dag-4",
    "load": 1.2,
    "seed": 20,
    "movement": "recompute",
    "kv_capacity_tokens": 24576,
}
# (study script, folder, the job: workload, load, seed, spec, and for the regime map its
# movement and KV budget). Loads and seeds where a run takes about a second.
CASES = [
    (rp, "paper", {"workload": "chain-3", "load": 1.0, "seed": 20, "spec": "lpm"}),
    (rp, "paper", {"workload": "chain-3", "load": 1.0, "seed": 20, "spec": "topas"}),
    (rp, "paper", {"workload": "dag-10-wide", "load": 0.8, "seed": 21, "spec": "topas"}),
    (rp, "paper", {**MAP_RECOMPUTE, "spec": "spf"}),
    (rp, "paper", {**MAP_RECOMPUTE, "spec": "topas"}),
    (
        rp,
        "paper",
        {
            "workload": "dag-4",
            "load": 1.2,
            "seed": 21,
            "spec": "topas",
            "movement": "swap",
            "kv_capacity_tokens": 18905,
        },
    ),
    (cp, "compare", {"workload": "chain", "load": 1.2, "seed": 20, "spec": "spf"}),
    (cp, "compare", {"workload": "mixed", "load": 1.0, "seed": 22, "spec": "topas"}),
    (cp, "compare", {"workload": "metagpt-tl", "load": 0.8, "seed": 20, "spec": "topas"}),
]


@pytest.mark.parametrize(
    ("study", "folder", "want"),
    CASES,
    ids=[f"{folder}-{'-'.join(str(v) for v in want.values())}" for _, folder, want in CASES],
)
def test_a_committed_run_reproduces(study: Any, folder: str, want: Mapping[str, Any]) -> None:
    cfg = json.loads((RESULTS / folder / "config.json").read_text())
    assert audit.script_of(cfg) == study.__name__
    job = audit.find_job(cfg, want)
    row = audit.row_of(audit.read_rows(RESULTS / folder), job)
    again = study.ex.run_point(**job)
    for metric in ("mean_jct", "p99_jct", "makespan"):
        assert again[metric] == pytest.approx(float(row[metric]), rel=1e-8, abs=1e-9), metric
    assert again["kv_capacity_tokens"] == int(row["kv_capacity_tokens"])


@pytest.mark.parametrize("folder", ["gap", "replication/gap_seed2"])
def test_the_gap_studys_policy_objectives_reproduce(folder: str) -> None:
    """Every instance of the reported gap studies (seeds 1 and 2) again, in the step model:
    every policy's sum of JCTs, `topas-rollout`'s included, is the committed one (the
    oracle is not solved again here; tests/test_gap.py checks it on instances of its own)."""
    from topas.runs import policy_objectives
    from topas.studies.gap import instance_seed
    from topas.workloads import small_instance

    study = json.loads((RESULTS / folder / "config.json").read_text())
    cfg, specs = study["config"], tuple(study["policies"])
    with (RESULTS / folder / "runs.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    by_instance: dict[tuple[str, int, int], dict[str, int]] = {}
    for r in rows:
        if r["policy"] in specs:
            key = (r["family"], int(r["tasks"]), int(r["instance_index"]))
            by_instance.setdefault(key, {})[r["policy"]] = int(r["policy_objective"])
    assert len(by_instance) == 60
    for (family, tasks, index), committed in sorted(by_instance.items()):
        seed = instance_seed(cfg["seed"], tasks, index)
        inst = small_instance(family, seed=seed, num_tasks=tasks, profile=cfg["profile"])
        again = {s: obj for s, (obj, _) in policy_objectives(inst, specs, seed=seed).items()}
        assert again == committed, (family, tasks, index)


DECISIONS = ("mean_evaluated", "max_evaluated", "mean_admitted", "mean_running", "mean_waiting")


def test_the_decision_benchs_decisions_are_todays() -> None:
    """The committed decision bench (docs/results/bench_decision) times today's decisions:
    its TOPAS runs up to 1,000 waiting again (the same loop, seed and counts; the times are
    not compared) score as many prefix sets and admit as many stages as committed."""
    bench = load_analysis("bench_decision")
    doc = json.loads((RESULTS / "bench_decision" / "runs.json").read_text())
    seed = doc["config"]["seed"]
    runs = [r for r in doc["runs"] if r["policy"] == "topas" and r["waiting"] <= 1000]
    assert len(runs) == 6
    for r in runs:
        again = bench.bench_one(
            "topas", r["agents"], r["waiting"], r["decisions"], r["warmup"], seed
        )
        for field in (*DECISIONS, "tasks_released", "kv_capacity_tokens"):
            assert getattr(again, field) == r[field], (r["agents"], r["waiting"], field)
