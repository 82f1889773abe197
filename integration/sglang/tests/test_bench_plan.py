"""integration/sglang/bench_plan.py end to end on SGLang's objects: the schedule policy
it runs under, the cache flush, its summary and its errors."""

from __future__ import annotations

import json

import pytest
from conftest import script


@pytest.fixture(scope="module")
def bench():  # type: ignore[no-untyped-def]
    return script("bench_plan")


@pytest.mark.parametrize("schedule", ["lpm", "fcfs"])
def test_setup_builds_sglangs_schedule_policy_asked_for(bench, schedule):
    from sglang.srt.managers.schedule_policy import CacheAgnosticPolicy, CacheAwarePolicy

    _, policy, queue, running, _ = bench.setup(4, "topas", schedule=schedule)
    want = CacheAwarePolicy.LPM if schedule == "lpm" else CacheAgnosticPolicy.FCFS
    assert policy.policy == want
    assert len(queue) == 4 and len(running.reqs) == bench.RUNNING


def test_a_short_run_under_fcfs_with_a_flush_writes_its_summary(bench, tmp_path, capsys):
    out = tmp_path / "b"
    args = ["--waiting", "3", "--rounds", "2", "--policies", "topas-greedy", "--kinds",
            "churn", "--replays", "", "--schedule", "fcfs", "--flush-mb", "1",
            "--out", str(out)]  # fmt: skip
    assert bench.main(args) == 0
    summary = (out / "summary.md").read_text()
    assert "SGLang's schedule policy: `fcfs`. 1 MB written before each round" in summary
    assert "SGLang's fcfs alone p50 (ms wall)" in summary
    assert "| churn | 3 | `topas-greedy` |" in summary
    config = json.loads((out / "config.json").read_text())
    assert config["schedule"] == "fcfs" and config["flush_mb"] == 1
    assert capsys.readouterr().out == summary


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--flush-mb", "-1"], "--flush-mb >= 0"),
        (["--waiting", "x"], "--waiting: integers expected"),
    ],
)
def test_bad_options_get_one_line_and_status_2(bench, tmp_path, capsys, args, message):
    out = tmp_path / "never"
    assert bench.main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_an_unknown_schedule_policy_is_refused_by_argparse(bench, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--schedule", "dfs-weight"])
    assert e.value.code == 2
    assert "--schedule: invalid choice: 'dfs-weight'" in capsys.readouterr().err
