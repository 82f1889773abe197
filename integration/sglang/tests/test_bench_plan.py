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


def short_run(bench, out, *extra: str) -> tuple[str, dict]:  # type: ignore[no-untyped-def]
    """A few `churn` rounds at 3 waiting under fcfs, no replay: (summary, config)."""
    args = ["--waiting", "3", "--rounds", "2", "--policies", "topas-greedy", "--kinds",
            "churn", "--replays", "", "--schedule", "fcfs", *extra, "--out", str(out)]  # fmt: skip
    assert bench.main(args) == 0
    return (out / "summary.md").read_text(), json.loads((out / "config.json").read_text())


def test_a_short_run_under_fcfs_with_a_flush_writes_its_summary(bench, tmp_path, capsys):
    summary, config = short_run(bench, tmp_path / "b", "--flush-mb", "1")
    assert "SGLang's schedule policy: `fcfs`. 1 MB written before each round" in summary
    assert "SGLang's fcfs alone p50 (ms wall)" in summary
    assert "| churn | 3 | `topas-greedy` |" in summary
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


def test_offload_rows_give_the_planners_share_beside_the_schedulers(bench, tmp_path):
    summary, config = short_run(bench, tmp_path / "o", "--offload", "--gap-ms", "5")
    assert "| churn | 3 | `topas-greedy` | in the scheduler |" in summary
    assert "| churn | 3 | `topas-greedy` | planner process |" in summary
    assert "5 ms of sleep after each round" in summary
    assert config["offload"] is True and config["gap_ms"] == 5


def test_a_negative_gap_is_refused(bench, capsys):
    assert bench.main(["--gap-ms", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--gap-ms and --flush-mb >= 0" in err and err.count("\n") == 1


@pytest.mark.parametrize("offload", [False, True])
def test_a_replay_counts_the_queue_it_planned_either_way(bench, offload):
    # The planner process answers through Offloaded.plan_round, not Controller's: the
    # replay must count the waiting requests at the hook SGLang calls in both modes.
    row = bench.replay_cost(4, 1.5, offload=offload)
    assert row["offload"] is offload
    assert row["calls"] >= row["planned"] > 0
    assert row["waiting_max"] >= 1 and row["waiting_mean"] > 0
