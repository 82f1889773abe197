"""``analysis/frontier.py``: the mean/p99 trade-off of a study's policies.

The Pareto front and "best on both" on hand-placed points, their invariants under
hypothesis, and the command line on a small runs.csv (its table, its plot, and bad input
as one line with exit status 2 and nothing written).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
import frontier  # noqa: E402


def test_the_front_and_best_on_both_by_hand() -> None:
    # a, b, c trade mean for p99 (none beats another on both); d is behind b on both
    at = {"a": (1.0, 3.0), "b": (2.0, 2.0), "c": (3.0, 1.0), "d": (3.0, 3.0)}
    assert frontier.pareto(at) == ["a", "b", "c"]
    assert frontier.reaches_both(at) == []  # a has the best mean, c the best p99
    # e has a's mean and c's p99: it alone is on the front, and best on both
    at["e"] = (1.0, 1.0)
    assert frontier.pareto(at) == ["e"]
    assert frontier.reaches_both(at) == ["e"]


def test_a_tie_on_both_metrics_keeps_both_on_the_front() -> None:
    at = {"x": (1.0, 1.0), "y": (1.0, 1.0), "z": (1.0, 2.0)}
    assert frontier.pareto(at) == ["x", "y"]
    assert frontier.reaches_both(at) == ["x", "y"]


def test_family_members_are_ordered_by_their_parameter() -> None:
    specs = ["m:C:g=300", "m:C:g=100", "m:C:g=none", "m:C:h=1", "spf", "m:C:g=1e3"]
    assert frontier.family_members(specs, "m:C:g") == [
        (100.0, "m:C:g=100"),
        (300.0, "m:C:g=300"),
        (1000.0, "m:C:g=1e3"),
    ]


def test_each_topas_spec_has_its_own_black_marker() -> None:
    # two TOPAS specs drawn alike cannot be told apart in the legend (both were black dots)
    styles = frontier.point_styles(["lpm", "spf", "topas", "topas-greedy", "topas:aging=0"])
    tops = [styles[p] for p in ("topas", "topas-greedy", "topas:aging=0")]
    assert all(s["color"] == "black" for s in tops)
    assert len({s["marker"] for s in tops}) == 3
    assert all(styles[p].get("color") != "black" for p in ("lpm", "spf"))


def test_the_axes_keep_the_best_baseline_mean_and_p99_in_view() -> None:
    # topas (30, 10) is ahead of parrot-fcfs (40, 12) on both, so parrot-fcfs is off the
    # front; it still has the best p99 of the baselines and must stay on the chart, while
    # fcfs (90, 90), behind on both and best at neither, may fall outside
    at = {"spf": (20.0, 50.0), "parrot-fcfs": (40.0, 12.0), "topas": (30.0, 10.0)}
    at["fcfs"] = (90.0, 90.0)
    limits = {}

    class Axes:
        def set_xlim(self, lo: float, hi: float) -> None:
            limits["x"] = (lo, hi)

        def set_ylim(self, lo: float, hi: float) -> None:
            limits["y"] = (lo, hi)

    frontier._zoom(Axes(), at, ())
    for p in ("spf", "parrot-fcfs", "topas"):
        assert limits["x"][0] < at[p][0] < limits["x"][1], p
        assert limits["y"][0] < at[p][1] < limits["y"][1], p
    assert not limits["x"][0] < at["fcfs"][0] < limits["x"][1]


values = st.floats(0, 100, allow_nan=False)


@given(
    st.dictionaries(
        st.text("abcdef", min_size=1, max_size=3), st.tuples(values, values), min_size=1
    )
)
def test_every_point_off_the_front_is_beaten_by_one_on_it(at) -> None:
    front = frontier.pareto(at)
    assert front  # a finite set has a front
    for p, (m, q) in at.items():
        if p in front:
            continue
        assert any(at[f][0] <= m and at[f][1] <= q and at[f] != (m, q) for f in front)
    assert set(frontier.reaches_both(at)) <= set(front)


def write_runs(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "runs.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def run(policy: str, load: float, seed: int, mean: float, p99: float) -> dict:
    return {
        "workload": "w",
        "load": load,
        "seed": seed,
        "policy": policy,
        "mean_jct": mean,
        "p99_jct": p99,
    }


@pytest.fixture
def study(tmp_path: Path) -> Path:
    folder = tmp_path / "study"
    rows = []
    for seed, shift in ((20, -1.0), (21, 1.0)):  # the means over seeds are the middle values
        rows += [
            run("spf", 1.0, seed, 10 + shift, 50 + shift),
            run("parrot-fcfs", 1.0, seed, 14 + shift, 20 + shift),
            run("g:G:guard=100", 1.0, seed, 13 + shift, 21 + shift),
            run("g:G:guard=400", 1.0, seed, 11 + shift, 30 + shift),
            run("topas", 1.0, seed, 12 + shift, 35 + shift),  # behind guard=400 on both
        ]
    write_runs(folder, rows)
    return folder


def test_the_command_prints_the_front_and_writes_the_plot(study: Path, capsys) -> None:
    assert frontier.main([str(study), "--family", "g:G:guard"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| 1 |"))
    front = "spf (10.0 / 50.0), g:G:guard=400 (11.0 / 30.0), g:G:guard=100 (13.0 / 21.0)"
    assert front + ", parrot-fcfs (14.0 / 20.0)" in row and "topas (" not in row
    assert row.endswith("| none |")
    assert (study / "frontier.png").read_bytes().startswith(b"\x89PNG")


def test_two_families_are_each_drawn(study: Path, capsys) -> None:
    rows = list(csv.DictReader((study / "runs.csv").open()))
    for seed in (20, 21):  # a second family: one point between the guards, one behind 400
        rows += [
            run("b:B:scale=50", 1.0, seed, 12.5, 25),
            run("b:B:scale=800", 1.0, seed, 11.5, 40),
        ]
    write_runs(study, rows)
    args = [str(study), "--family", "g:G:guard", "--family", "b:B:scale"]
    plain = frontier.plot(frontier.points(rows, "w"), "w", ["g:G:guard"])
    assert frontier.main(args) == 0
    both = (study / "frontier.png").read_bytes()
    assert both.startswith(b"\x89PNG") and both != plain  # the second line is drawn
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 |"))
    assert "b:B:scale=50 (12.5 / 25.0)" in row and "scale=800" not in row


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--workload", "nope"], "'nope' is not in the study"),
        (["--family", "g:G:other"], "no spec g:G:other=X"),
        (["--family", "g:G:guard", "--family", "b:B:scale"], "no spec b:B:scale=X"),
        (["--out", "x.svg"], "a .png file expected"),
        (["--out", "no/such/x.png"], "no such folder 'no/such'"),
    ],
)
def test_bad_input_is_one_line_and_status_2(study: Path, args, words, capsys) -> None:
    assert frontier.ex.run_cli(frontier.main, [str(study), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err
    assert not (study / "frontier.png").exists()


def test_a_folder_without_runs_or_a_column_is_refused(tmp_path: Path, capsys) -> None:
    assert frontier.ex.run_cli(frontier.main, [str(tmp_path)]) == 2
    assert "runs.csv: no such file" in capsys.readouterr().err
    with (tmp_path / "runs.csv").open("w") as f:
        f.write("workload,load,seed,policy,mean_jct\nw,1,20,spf,1\n")
    assert frontier.ex.run_cli(frontier.main, [str(tmp_path)]) == 2
    assert "missing column 'p99_jct'" in capsys.readouterr().err
