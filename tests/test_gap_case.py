"""analysis/gap_case.py: one gap-study instance, a policy's schedule beside the optimum's."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from topas.policies import make_policy
from topas.schedule import PrefixInterval, StageRun, evaluate
from topas.simulator import simulate
from topas.workloads import small_instance

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
import gap_case  # noqa: E402


def test_both_schedules_and_the_jcts(capsys) -> None:  # type: ignore[no-untyped-def]
    argv = ["chain", "--tasks", "2", "--instance-seed", "2000", "--policy", "fcfs"]
    assert gap_case.main(argv) == 0
    out = capsys.readouterr().out
    sums = [int(x) for x in re.findall(r"sum of JCTs (\d+) steps", out)]
    assert len(sums) == 2 and sums[1] <= sums[0]  # the proven optimum is no worse
    assert "proven optimal" in out
    inst = small_instance("chain", seed=2000, num_tasks=2)
    stages = sum(len(t.stages) for t in inst.tasks)
    assert len(re.findall(r"^  t\d+/\S+ +\S+ +admit", out, re.MULTILINE)) >= 2 * stages
    rows = re.findall(r"^(t\d+) +(\d+) +(\d+) +([+-]\d+)$", out, re.MULTILINE)
    assert [r[0] for r in rows] == [t.id for t in inst.tasks]
    for _, ours, best, diff in rows:
        assert int(ours) - int(best) == int(diff)
    # the per-task differences add up to the difference of the sums
    assert sum(int(r[3]) for r in rows) == sums[0] - sums[1]


def test_a_load_undone_at_once_is_flagged() -> None:
    inst = small_instance("chain", seed=2000, num_tasks=2)
    sched = simulate(inst, make_policy("fcfs"), timing="step")
    wasted = PrefixInterval(agent=inst.agents[0].id, load_start=3.0, resident_from=5.0, end=5.0)
    kept = PrefixInterval(agent=inst.agents[0].id, load_start=6.0, resident_from=7.0, end=9.0)
    changed = dataclasses.replace(sched, prefixes=[wasted, kept])
    lines = gap_case.timeline("x", changed, evaluate(changed))
    flagged = [line for line in lines if "evicted as it became resident" in line]
    assert len(flagged) == 1 and "load    3" in flagged[0]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["nosuch", "--tasks", "2", "--instance-seed", "1"], "unknown workload 'nosuch'"),
        (["chain", "--tasks", "0", "--instance-seed", "1"], "--tasks"),
        (["chain", "--tasks", "2", "--instance-seed", "1", "--policy", "nope"], "nope"),
        (["chain", "--tasks", "2", "--instance-seed", "1", "--time-limit", "0"], "--time-limit"),
    ],
)
def test_bad_input_is_one_line_and_status_2(argv, words, capsys) -> None:  # type: ignore[no-untyped-def]
    assert gap_case.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gap_case: error:") and words in err and "\n" not in err


def test_plot_draws_both_schedules_to_a_png(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    png = tmp_path / "case.png"
    argv = ["chain", "--tasks", "2", "--instance-seed", "2000", "--policy", "fcfs"]
    assert gap_case.main([*argv, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert f"wrote {png}" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["case.png"]  # no temporary left


@pytest.mark.parametrize("name", ["case.svg", "blocker/case.png"])
def test_a_bad_plot_path_is_one_line_and_status_2(tmp_path, capsys, name) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "blocker").write_text("a file, not a folder")
    argv = ["chain", "--tasks", "2", "--instance-seed", "2000", "--policy", "fcfs"]
    assert gap_case.main([*argv, "--plot", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gap_case: error: --plot")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]


def test_overlapping_runs_of_a_task_get_lanes() -> None:
    # one task: a 0-5, b 1-3, c 3-6, d 5-7 (admission = start). a takes lane 0, b lane 1
    # (a still runs); c reuses lane 1 (b ended at 3), d lane 0 (a ended at 5): two lanes.
    # A task running one stage at a time needs one.
    def run(task: str, stage: str, start: float, end: float) -> StageRun:
        return StageRun(task, stage, "A", start, start, end)

    runs = [run("t", "a", 0, 5), run("t", "b", 1, 3), run("t", "c", 3, 6), run("t", "d", 5, 7)]
    runs += [run("u", "x", 0, 2), run("u", "y", 2, 4)]
    lane, lanes = gap_case._lanes(runs)
    assert [lane[("t", s)] for s in "abcd"] == [0, 1, 1, 0] and lanes == {"t": 2, "u": 1}
    assert lane[("u", "x")] == lane[("u", "y")] == 0
