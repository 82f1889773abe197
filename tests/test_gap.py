"""The optimality-gap study (topas/studies/gap.py, analysis/optimality_gap.py, bench_oracle.py)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import load_analysis, random_instances
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topas.oracle import solve
from topas.oracle.problem import OracleResult
from topas.policies import BASELINES, PolicySpecError, split_specs
from topas.runs import best_schedule, policy_objectives
from topas.studies import default_policies
from topas.studies.gap import (
    RUN_COLUMNS,
    GapConfig,
    GapModelError,
    instance_seed,
    is_proven,
    policy_gap,
    run_gap_study,
    validate_config,
)
from topas.workloads import small_instance

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the study


def test_gap_study_writes_all_files(tmp_path: Path) -> None:
    config = GapConfig(
        families=("chain", "fanout"),
        task_counts=(2,),
        instances=1,
        backend="cbc",
        time_limit=20,
    )
    out = tmp_path / "gap"
    summary = run_gap_study(config, out, progress=False)
    for name in ("config.json", "runs.csv", "summary.md", "gap.png"):
        assert (out / name).is_file(), name
    assert (out / "summary.md").read_text() == summary
    assert "clairvoyant" in summary and "online" in summary
    assert "topas gap --families chain,fanout --tasks 2 --instances 1 --backend cbc" in summary
    policies = default_policies()
    assert "replay" not in policies and set(BASELINES) <= set(policies)
    for spec in policies:
        assert f"`{spec}`" in summary

    with open(out / "runs.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == RUN_COLUMNS
        rows = list(reader)
    assert len(rows) == 2 * len(policies)
    assert {r["family"] for r in rows} == {"chain", "fanout"}
    for r in rows:
        assert r["tasks"] == "2" and r["backend"] == "cbc"
        assert int(r["instance_seed"]) == instance_seed(1, 2, 0)  # the reporting seed
        assert len(r["instance_hash"]) == 64
        assert 6 <= int(r["stages"]) <= 20 and 2 <= int(r["agents"]) <= 4
        lb, ub, p = int(r["lower_bound"]), int(r["upper_bound"]), int(r["policy_objective"])
        assert lb <= ub <= p
        assert float(r["gap_pct_low"]) <= float(r["gap_pct_high"])
        if r["proven"] == "true":
            assert int(r["optimum"]) == lb == ub
            assert int(r["gap_abs"]) == p - lb >= 0
            assert float(r["gap_pct"]) == pytest.approx(100 * (p - lb) / lb, abs=1e-3)
        else:
            assert r["optimum"] == r["gap_abs"] == r["gap_pct"] == ""

    doc = json.loads((out / "config.json").read_text())
    assert doc["config"]["families"] == ["chain", "fanout"]
    assert doc["policies"] == list(policies)
    assert "clairvoyant" in doc["clairvoyance"]
    assert doc["seed_split"]["this_study"] == "report" and doc["config"]["seed"] == 1


def test_an_interrupted_gap_study_resumes_without_solving_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import topas.studies.gap as gap

    config = GapConfig(
        families=("chain", "fanout"), task_counts=(2,), instances=1, policies=("fcfs", "topas")
    )
    run_gap_study(config, tmp_path / "fresh", progress=False)
    solve_one, solved = gap._study_job, []

    def stopped_after_one(job):  # type: ignore[no-untyped-def]
        if solved:
            raise RuntimeError("interrupted")
        solved.append(job)
        return solve_one(job)

    out = tmp_path / "gap"
    monkeypatch.setattr(gap, "_study_job", stopped_after_one)
    with pytest.raises(RuntimeError, match="interrupted"):
        run_gap_study(config, out, progress=False)
    assert [p.name for p in out.iterdir()] == [".checkpoint.pkl"]
    with pytest.raises(ValueError, match=r"holds 1 finished run.*--resume"):
        run_gap_study(config, out, progress=False)
    monkeypatch.setattr(gap, "_study_job", lambda job: solved.append(job) or solve_one(job))
    resumed = run_gap_study(config, out, progress=False, resume=True)
    assert len(solved) == 2  # the first instance once, the second once
    assert solved[0][0] == "chain" and solved[1][0] == "fanout"
    assert "1 of the 2 instances were reused from the checkpoint" in resumed
    assert json.loads((out / "config.json").read_text())["resumed_instances"] == 1
    assert "resumed_instances" not in json.loads((tmp_path / "fresh" / "config.json").read_text())
    assert not (out / ".checkpoint.pkl").exists()

    def proven(path: Path) -> list[tuple[str, str, str, str]]:
        with open(path / "runs.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        return [(r["family"], r["policy"], r["optimum"], r["policy_objective"]) for r in rows]

    assert proven(out) == proven(tmp_path / "fresh")


@pytest.mark.parametrize(
    "change, words",
    [
        ({"families": ("chain", "nope")}, "nope"),
        ({"families": ()}, "families"),
        ({"task_counts": ()}, "task_counts"),
        ({"task_counts": (0,)}, "task_counts"),
        ({"instances": 0}, "instances"),
        ({"policies": ()}, "policies"),
        ({"policies": ("lpm", "nosuchpolicy")}, "nosuchpolicy"),
        ({"policies": ("lpm:nosuchparam=3",)}, "nosuchparam"),
        ({"policies": ("replay",)}, "replay"),
        ({"policies": ("lpm", "lpm")}, "duplicates"),
        ({"backend": "gurobi"}, "gurobi"),
        ({"time_limit": 0}, "time_limit"),
        ({"jobs": 0}, "jobs"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_config_fails_before_solving(tmp_path: Path, change: dict, words: str) -> None:
    # a frozen config validates itself when it is built: nothing can run on a bad one
    out = tmp_path / "gap"
    with pytest.raises(ValueError, match=words) as err:
        config = replace(GapConfig(families=("chain",), backend="cbc"), **change)
        run_gap_study(config, out, progress=False)
    assert "\n" not in str(err.value)
    assert not out.exists()


def test_validate_config_resolves_policies() -> None:
    specs = validate_config(GapConfig(families=("chain",), policies=("lpm:max_sorted=4", "fcfs")))
    assert specs == ("lpm:max_sorted=4", "fcfs")
    assert validate_config(GapConfig(families=("chain",), backend="cbc")) == default_policies()


def test_split_specs_keeps_parameters_together() -> None:
    assert split_specs("lpm:max_sorted=4,fcfs") == ["lpm:max_sorted=4", "fcfs"]
    assert split_specs("kvflow:prefetch=0,horizon=2, cpf ,") == [
        "kvflow:prefetch=0,horizon=2",
        "cpf",
    ]
    assert split_specs("") == []
    # a value may name specs itself (a rollout's bases); a module spec starts anew
    assert split_specs("topas-rollout:cross=0,bases=topas+topas:drain=0+lpm,m:C:g=1,h=2") == [
        "topas-rollout:cross=0,bases=topas+topas:drain=0+lpm",
        "m:C:g=1,h=2",
    ]
    # a base with parameters of its own in parentheses: its commas split nothing
    assert split_specs("lpm,topas-rollout:bases=(topas:fill=search,stall=0)+lpm,cross=0,fcfs") == [
        "lpm",
        "topas-rollout:bases=(topas:fill=search,stall=0)+lpm,cross=0",
        "fcfs",
    ]
    with pytest.raises(PolicySpecError, match="unmatched"):
        split_specs("topas-rollout:bases=(topas:drain=0,lpm")


def test_policy_gap_intervals_and_loud_errors() -> None:
    g = policy_gap(110, 100, 100, proven=True)
    assert g["gap_abs"] == 10 and g["gap_pct"] == pytest.approx(10.0)
    assert g["gap_pct_low"] == g["gap_pct_high"] == pytest.approx(10.0)
    g = policy_gap(120, 100, 110, proven=False)
    assert g["gap_abs"] is None and g["gap_pct"] is None
    assert (g["gap_abs_low"], g["gap_abs_high"]) == (10, 20)
    assert g["gap_pct_low"] == pytest.approx(100 * 10 / 110)
    assert g["gap_pct_high"] == pytest.approx(20.0)
    with pytest.raises(GapModelError, match="below the proven optimum"):
        policy_gap(99, 100, 100, proven=True)
    with pytest.raises(GapModelError, match="lower bound"):
        policy_gap(99, 100, 120, proven=False)


def test_is_proven_only_by_the_solver_status() -> None:
    assert is_proven(OracleResult("optimal", 50, 50, 0.1, None))
    assert not is_proven(OracleResult("feasible", 50, 50, 0.1, None))
    assert not is_proven(OracleResult("feasible", 50, 49, 0.1, None))
    assert not is_proven(OracleResult("timeout", None, 49, 0.1, None))


def test_analysis_script_adds_ablations_to_registered() -> None:
    mod = load_analysis("optimality_gap")
    args = mod.build_parser().parse_args(["--policies", "lpm:max_sorted=4", "--backend", "cbc"])
    config = mod.config_from_args(args)
    assert config.policies == (*default_policies(), "lpm:max_sorted=4")
    args = mod.build_parser().parse_args(["--policies", "lpm:max_sorted=4,fcfs", "--only"])
    assert mod.config_from_args(args).policies == ("lpm:max_sorted=4", "fcfs")
    assert mod.main(["--policies", "lpm:bogus=1", "--backend", "cbc"]) == 2
    assert mod.config_from_args(mod.build_parser().parse_args([])).seed == 1  # reporting
    for seed in ("0", "1000"):  # the tuning seeds need --tuning
        with pytest.raises(ValueError, match="tuning seed"):
            mod.config_from_args(mod.build_parser().parse_args(["--seed", seed]))
        tuned = mod.config_from_args(mod.build_parser().parse_args(["--seed", seed, "--tuning"]))
        assert tuned.seed == int(seed)


# --------------------------------------------------------------------------- the property


def _check_policies_at_least_oracle(inst, backend: str = "cbc") -> None:  # type: ignore[no-untyped-def]
    specs = default_policies()
    runs = policy_objectives(inst, specs)
    _, warm_obj, warm = best_schedule(runs)
    result = solve(inst, backend=backend, time_limit=20, threads=1, warm_start=warm)
    assert result.lower_bound >= 1
    if result.objective is not None:
        assert result.lower_bound <= result.objective <= warm_obj
    for spec, (obj, _) in runs.items():
        assert obj >= result.lower_bound, (spec, obj, result.lower_bound)
        if result.status == "optimal":
            assert obj >= result.objective, (spec, obj, result.objective)


@settings(
    max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(random_instances(max_tasks=2, max_stages=3))
def test_every_policy_jct_at_least_the_optimum_random(inst) -> None:  # type: ignore[no-untyped-def]
    # the instances carry a linear cost model; timing="step" uses step_s = base_s (rule 1)
    _check_policies_at_least_oracle(inst)


@settings(
    max_examples=4, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    st.sampled_from(["chain", "fanout", "mixed", "metagpt-sop", "metagpt-tl"]),
    st.integers(0, 10_000),
)
def test_every_policy_jct_at_least_the_optimum_small(family: str, seed: int) -> None:
    _check_policies_at_least_oracle(small_instance(family, seed=seed, num_tasks=2))


def test_cpsat_every_policy_at_least_the_optimum() -> None:
    for family in ("chain", "metagpt-sop"):
        _check_policies_at_least_oracle(small_instance(family, seed=7, num_tasks=2), "cpsat")


# --------------------------------------------------------------------------- bench_oracle


def test_bench_oracle_quick_prints_a_table(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "analysis" / "bench_oracle.py"),
            "--quick",
            "--backends",
            "cbc",
            "--families",
            "chain",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("| family | backend | largest proven: stages")
    assert any(line.startswith("| chain | cbc |") for line in lines)
    for name in ("config.json", "runs.csv", "summary.md"):
        assert (out / name).is_file()
    with open(out / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["backend"] == "cbc" and r["family"] == "chain" for r in rows)
