"""Tests of analysis/audit_results.py: it finds a committed run that today's code does not
give, passes one that it does, samples the same runs on every call, and refuses bad
input with one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_analysis

ROOT = Path(__file__).resolve().parents[1]
audit = load_analysis("audit_results")


def _item(folder: str, want: dict) -> dict:
    cfg = json.loads((audit.RESULTS / folder / "config.json").read_text())
    rows = audit.read_rows(audit.RESULTS / folder)
    return audit.audit_item(folder, cfg, rows, audit.find_job(cfg, want))


def test_a_run_that_moved_is_found_and_one_that_did_not_passes() -> None:
    item = _item("paper", {"workload": "chain-3", "load": 0.5, "seed": 20, "spec": "lpm"})
    assert audit.check(item)["same"]
    # the committed mean 0.1% higher: what a change of the code would leave behind
    moved = {**item, "committed_mean_jct": item["committed_mean_jct"] * 1.001}
    row = audit.check(moved)
    assert not row["same"] and audit.same(row["mean_jct"], item["committed_mean_jct"])
    summary = audit.summarize([audit.check(item), row | {"spec": "spf"}], "cmd", 1.0)
    assert "| `paper` |" in summary and "`lpm`" in summary
    assert "`spf` (chain-3 0.5: " in summary and "1 came out different" in summary


def test_the_sample_is_fixed_per_spec_and_within_the_load() -> None:
    cfg = json.loads((audit.RESULTS / "compare" / "config.json").read_text())
    jobs = audit.study_jobs(cfg)
    first = audit.sample("compare", jobs, 2, 1.0, rollout=False)
    assert first == audit.sample("compare", jobs, 2, 1.0, rollout=False)
    specs = {j["spec"] for j in jobs}
    assert sorted(j["spec"] for j in first) == sorted([s for s in specs for _ in range(2)])
    assert all(j["load"] <= 1.0 for j in first)
    rollout = [{**j, "spec": "topas-rollout"} for j in jobs[:3]]
    assert audit.sample("compare", rollout, 2, 1.2, rollout=False) == []
    assert len(audit.sample("compare", rollout, 2, 1.2, rollout=True)) == 2


def test_cli_writes_its_files_and_refuses_an_unknown_study(tmp_path: Path) -> None:
    out = tmp_path / "audit"
    args = ["--studies", "paper_one_agent_most", "--per-spec", "1", "--max-load", "0.5"]
    cmd = [sys.executable, "analysis/audit_results.py", *args, "--jobs", "1", "--no-progress"]
    done = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert {p.name for p in out.iterdir()} == {"config.json", "runs.csv", "summary.md"}
    assert "| `paper_one_agent_most` |" in done.stdout and "in 0 of the 1 studies" in done.stdout
    bad = subprocess.run(
        [*cmd[:3], "no_such_study", *cmd[4:], "--out", str(tmp_path / "never")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("error: --studies: no study at docs/results/no_such_study")
    assert not (tmp_path / "never").exists()


def test_a_usage_error_is_one_line(capsys) -> None:
    assert audit.ex.run_cli(audit.main, ["--bogus"]) == 2
    err = capsys.readouterr().err
    assert err == "error: unrecognized arguments: --bogus\n"


def test_a_moved_topas_spec_is_tried_with_the_defaults_of_before_switched_back() -> None:
    assert audit.pinned("topas", ("token_floor=0",)) == "topas:token_floor=0"
    # a key the spec sets itself is kept, the others are added in the pin's order
    pin = ("drain_load=0", "token_floor=0")
    assert audit.pinned("topas:drain_load=1", pin) == "topas:drain_load=1,token_floor=0"
    assert (
        audit.pinned("topas-base:visit=2", pin) == "topas-base:visit=2,drain_load=0,token_floor=0"
    )
    assert audit.pinned("topas:drain_load=0,token_floor=0", pin) is None  # nothing to add
    assert audit.pinned("topas-greedy", pin) is None and audit.pinned("lpm", pin) is None
    # the first pin (in the order of PINS) that gives every sampled run is the one named
    rows = [
        {"study": "s", "spec": "topas", "pinned": "topas:token_floor=0", "same": True},
        {"study": "s", "spec": "topas", "pinned": "topas:token_floor=0", "same": False},
        {"study": "s", "spec": "topas", "pinned": "topas:drain_load=0,token_floor=0", "same": True},
        {"study": "t", "spec": "topas", "pinned": "topas:token_floor=0", "same": False},
    ]
    assert audit.equivalents(rows) == {
        ("s", "topas"): "topas:drain_load=0,token_floor=0",
        ("t", "topas"): "",
    }


def test_a_study_of_today_s_defaults_before_token_floor_is_found(tmp_path: Path) -> None:
    """compare_rollout ran before drain_load and token_floor became defaults: its `topas`
    moved, and switching both back gives its runs again."""
    item = _item("compare_rollout", {"workload": "mixed", "load": 1.0, "seed": 20, "spec": "topas"})
    row = audit.check(item)
    assert not row["same"]
    pins = [audit.check(i) for i in audit.pin_items([item], [row])]
    assert [p["pinned"] for p in pins] == [
        "topas:token_floor=0",
        "topas:drain_load=0,token_floor=0",
        "topas:fill=search,stall=0,drain_load=0,token_floor=0",
    ]
    assert audit.equivalents(pins) == {
        ("compare_rollout", "topas"): "topas:drain_load=0,token_floor=0"
    }


def test_a_job_finds_its_own_row_by_noise_and_shadow_too() -> None:
    """The ablation runs a spec at several noise levels, the shadow study beside several
    shadows: the committed row of a job is the one with its own."""
    base = {"workload": "chain", "load": "1.2", "seed": "20", "policy": "topas"}
    rows = [
        {**base, "prediction_error": "0", "mean_jct": "1"},
        {**base, "prediction_error": "0.5", "mean_jct": "2"},
        {**base, "prediction_error": "0", "shadow": "spf", "mean_jct": "3"},
    ]
    job = {"workload": "chain", "load": 1.2, "seed": 20, "spec": "topas"}
    assert audit.row_of(rows[:2], job)["mean_jct"] == "1"
    assert audit.row_of(rows[:2], {**job, "prediction_error": 0.5})["mean_jct"] == "2"
    assert audit.row_of(rows, {**job, "shadow": "spf"})["mean_jct"] == "3"
    with pytest.raises(LookupError, match="0 committed rows"):
        audit.row_of(rows, {**job, "prediction_error": 1.0})


def test_every_audited_script_builds_its_jobs_and_names_its_runner() -> None:
    for script in audit.SCRIPTS:
        module = audit.study_module(script)
        assert callable(module.make_jobs) and callable(audit.runner(script))
    assert audit.script_of({"command": "python analysis/ablation.py --out x"}) == "ablation"
    assert audit.script_of({"command": "python analysis/optimality_gap.py"}) is None
