"""``analysis/jct_by_size.py``: each run's JCTs split by task size.

The split is checked by hand and, under hypothesis, as a partition into groups of equal
size ordered by demand; a run's group means are cross-checked against the run's own
mean JCT and against ``compare_policies``' row for the same point; the CLI writes its
files and refuses bad input with one line and status 2.
"""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import pytest
from conftest import load_analysis
from hypothesis import given
from hypothesis import strategies as st

jbs = load_analysis("jct_by_size")


def test_size_groups_by_hand() -> None:
    # demands sorted: b 1, c 2, d 2 (ties by id: c before d), a 3, e 5; five tasks in two
    # groups: numpy's array_split makes the first group the larger, [b, c, d] and [a, e]
    demand = {"a": 3.0, "b": 1.0, "c": 2.0, "d": 2.0, "e": 5.0}
    assert jbs.size_groups(demand, 2) == [["b", "c", "d"], ["a", "e"]]
    assert jbs.size_groups(demand, 5) == [["b"], ["c"], ["d"], ["a"], ["e"]]


@given(
    demands=st.lists(st.floats(0.0, 1e4), min_size=1, max_size=40),
    groups=st.integers(1, 40),
)
def test_size_groups_partition_the_tasks_smallest_first(demands, groups) -> None:
    demand = {f"t{i}": d for i, d in enumerate(demands)}
    groups = min(groups, len(demand))
    parts = jbs.size_groups(demand, groups)
    assert len(parts) == groups
    assert sorted(t for p in parts for t in p) == sorted(demand)  # each task once
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    for smaller, larger in itertools.pairwise(parts):
        assert max(demand[t] for t in smaller) <= min(demand[t] for t in larger)


def test_a_run_splits_its_own_jcts() -> None:
    """The group means, weighted by group size, give back the run's mean JCT, which is
    compare_policies' mean JCT for the same point and spec."""
    job = {"workload": "chain", "load": 1.0, "seed": 1000, "spec": "topas", "num_tasks": 10}
    row = jbs.run_sized({**job, "groups": 3})  # groups of 4, 3 and 3 tasks
    weighted = (4 * row["g1_jct"] + 3 * row["g2_jct"] + 3 * row["g3_jct"]) / 10
    assert weighted == pytest.approx(row["mean_jct"], rel=1e-12)
    assert row["mean_jct"] == jbs.ex.run_point(**job)["mean_jct"]
    assert row["g1_demand_s"] <= row["g2_demand_s"] <= row["g3_demand_s"]


def test_cli_writes_its_files(tmp_path: Path, capsys) -> None:
    out = tmp_path / "study"
    args = ["--workloads", "chain", "--loads", "1.0", "--seeds", "1", "--tasks", "8"]
    args += ["--groups", "2", "--policies", "spf,topas", "--jobs", "1", "--no-progress"]
    assert jbs.ex.run_cli(jbs.main, [*args, "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert names == {"config.json", "runs.csv", "summary.md", "jct_by_size.png"}
    with (out / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["policy"] for r in rows] == ["spf", "topas"]
    summary = (out / "summary.md").read_text()
    for r in rows:  # each table row shows the run's group means (one seed: no averaging)
        cells = [jbs.ex.fmt_s(float(r[f"g{i}_jct"])) for i in (1, 2)]
        assert f"| `{r['policy']}` | {cells[0]} | {cells[1]} |" in summary
    assert capsys.readouterr().out == summary


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--groups", "0"], "--groups"),
        (["--groups", "9", "--tasks", "8"], "--groups: 9 groups of 8 tasks"),
        (["--policies", "nope"], "nope"),
        (["--workloads", "nope"], "nope"),
        (["--seeds", "1000"], "tuning"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path: Path, args, words, capsys) -> None:
    out = tmp_path / "study"
    assert jbs.ex.run_cli(jbs.main, [*args, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err
    assert not out.exists()
