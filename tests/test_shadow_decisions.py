"""``analysis/shadow_decisions.py``: where two policies part on the same states.

A hand-solved case (FCFS against SPF on one slot); under hypothesis, a policy shadowed by
itself agrees at every decision and shadowing never changes the run; a calibrated run of
TOPAS against its own spec agrees too, and the CLI writes its files and refuses bad
input with one line and status 2.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import load_analysis, make, random_instances, stage, task
from hypothesis import HealthCheck, given, settings

from topas.policies import make_policy
from topas.schedule import evaluate
from topas.simulator import simulate

sd = load_analysis("shadow_decisions")


def test_fcfs_against_spf_by_hand() -> None:
    # one agent, one batch slot, two tasks released at step 0: t0 (6 output tokens) and
    # t1 (1 token). FCFS takes t0 first (the earlier id at equal release), SPF t1 (the
    # shorter). At step 0 FCFS admits t0 alone (policy only), SPF would admit t1: its
    # agent's prompt is absent, but FCFS brings it in for t0, so t1 was ranked lower.
    # When t0 ends only t1 waits, and both admit it (common). Every other decision,
    # neither admits anything and they agree.
    inst = make(
        {"a": 2},
        [task("t0", 0, stage("s", "a", 1, 6)), task("t1", 0, stage("s", "a", 1, 1))],
        capacity=40,
        max_running=1,
    )
    schedule, t = sd.shadowed_run(inst, "fcfs", "spf", timing="step")
    assert (t["common"], t["policy_only"]) == (1, 1)
    assert (t["shadow_held"], t["shadow_absent"], t["shadow_ranked"]) == (0, 0, 1)
    assert t["agree"] == t["decisions"] - 1
    assert t["policy_left"] > t["shadow_left"] > 0  # t0 has more work left than t1
    assert t["policy_age"] == t["shadow_age"] == 0.0  # both released at step 0
    alone = simulate(inst, make_policy("fcfs"), timing="step")
    assert evaluate(schedule).jct == evaluate(alone).jct


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=random_instances())
def test_a_policy_shadowed_by_itself_agrees_and_runs_as_alone(inst) -> None:
    for spec in ("spf", "topas", "topas-greedy"):
        schedule, t = sd.shadowed_run(inst, spec, spec, timing="calibrated")
        assert t["agree"] == t["decisions"] > 0
        assert t["policy_only"] == sum(t[k] for k in sd.COUNTS[2:]) == 0
        alone = simulate(inst, make_policy(spec), timing="calibrated")
        assert evaluate(schedule).jct == evaluate(alone).jct


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=random_instances())
def test_a_shadow_never_changes_the_run(inst) -> None:
    """The policy's schedule is its own whatever the shadow decides; every admitted stage
    is counted once: common plus policy-only is what the policy admitted."""
    schedule, t = sd.shadowed_run(inst, "fcfs", "topas", timing="step")
    alone = simulate(inst, make_policy("fcfs"), timing="step")
    assert evaluate(schedule).jct == evaluate(alone).jct
    assert t["common"] + t["policy_only"] == len(schedule.runs)


def test_calibrated_topas_shadowed_by_itself_agrees() -> None:
    job = {"workload": "chain", "load": 1.2, "seed": 1000, "num_tasks": 20, "kv_scale": 1.0}
    row = sd.run_shadowed({**job, "spec": "topas", "shadow": "topas"})
    assert row["agree"] == row["decisions"] > 0 and row["policy_only"] == 0
    assert row["mean_jct"] == sd.ex.run_point(spec="topas", **job)["mean_jct"]


def test_cli_writes_its_files(tmp_path: Path, capsys) -> None:
    out = tmp_path / "study"
    args = ["--workloads", "chain", "--loads", "1.0", "--seeds", "1", "--tasks", "8"]
    args += ["--policies", "fcfs,topas", "--shadow", "spf", "--jobs", "1", "--no-progress"]
    assert sd.ex.run_cli(sd.main, [*args, "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"config.json", "runs.csv", "summary.md"}
    with (out / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["policy"], r["shadow"]) for r in rows] == [("fcfs", "spf"), ("topas", "spf")]
    summary = (out / "summary.md").read_text()
    for r in rows:  # one seed: each cell is the run's own count
        cells = " | ".join(r[k] for k in ("decisions",))
        assert f"| `{r['policy']}` | {sd.ex.fmt_s(float(r['mean_jct']))} | {cells} |" in summary
    assert capsys.readouterr().out == summary


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--shadow", "nope"], "--shadow: bad policy spec 'nope'"),
        (["--shadow", "spf,fcfs"], "--shadow: one policy spec, got 2"),
        (["--policies", "nope"], "nope"),
        (["--seeds", "1000,1001"], "tuning"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path: Path, args, words, capsys) -> None:
    out = tmp_path / "study"
    assert sd.ex.run_cli(sd.main, [*args, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err
    assert not out.exists()
