"""The docs' tables (docs/topas.md, the plugin README's live one) agree with their summaries.

Each study writes ``summary.md`` and ``config.json``; the ones behind the docs live in
``docs/results/``. These tests read a table in the docs and the summary it comes from
and compare every figure, so a re-run that is committed without the docs (or the other
way round) fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import load_analysis

DOCS = Path(__file__).resolve().parents[1] / "docs"
NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")


def table(text: str, header_start: str) -> list[list[str]]:
    """The rows (cells stripped, bold removed) of the first table whose header line
    starts with ``header_start``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip().replace("**", "") for c in line.strip("|").split("|")])
    return rows


def numbers(cell: str) -> list[float]:
    return [float(x) for x in NUMBER.findall(cell)]


def section(text: str, heading: str, until: str = "\n### ") -> str:
    """``text`` from ``heading`` up to the next ``until`` (a heading of that level)."""
    start = text.index(heading)
    end = text.find(until, start + len(heading))
    return text[start : None if end < 0 else end]


def specs(summary: str) -> dict[str, list[str]]:
    """The rows, by spec, of a ``compare_policies.py`` summary's "TOPAS spec" table."""
    return {r[0].strip("`"): r for r in table(summary, "| TOPAS spec |")}


def side_by_side(summary: str) -> dict[str, list[str]]:
    """The rows, by workload, of a ``reproduce_paper.py`` summary's side-by-side table."""
    return {r[0]: r for r in table(summary, "| workload | paper mean JCT cut %")}


@pytest.fixture(scope="module")
def topas_md() -> str:
    return (DOCS / "topas.md").read_text()


def _check_cuts(docs: list[list[str]], summary: str, first: int) -> None:
    """A docs table of peak cuts and means over loads (mean JCT, then p99, from column
    ``first`` on) against the side-by-side table of a ``reproduce_paper.py`` summary."""
    ours = side_by_side(summary)
    assert [r[0] for r in docs] == list(ours)
    for row in docs:
        s = ours[row[0]]
        # peak cut, its CI and its load; mean over loads; for mean then p99 JCT
        for d_peak, d_mean, s_peak, s_mean in (
            (row[first], row[first + 1], s[2], s[3]),
            (row[first + 2], row[first + 3], s[5], s[6]),
        ):
            assert numbers(d_peak)[:3] == numbers(s_peak)[:3], (row[0], d_peak, s_peak)
            assert numbers(d_mean) == numbers(s_mean), (row[0], d_mean, s_mean)


def _tally(summary: str) -> tuple[str, str, str]:
    counts = re.search(r"(\d+) wins, (\d+) ties \(CI includes 0\), (\d+) losses", summary)
    assert counts is not None
    wins, ties, losses = counts.groups()
    return wins, ties, losses


def test_paper_setting_table_matches_its_summary(topas_md: str) -> None:
    docs = table(section(topas_md, "### In the paper's setting"), "| workload | paper mean / p99")
    summary = (DOCS / "results" / "paper" / "summary.md").read_text()
    _check_cuts(docs, summary, 2)
    wins, ties, losses = _tally(summary)
    assert f"wins {wins} beyond the CI, ties {ties} and\n**loses {losses}**" in topas_md


def test_rollout_paper_table_matches_its_summaries(topas_md: str) -> None:
    """``topas-rollout``'s peak cuts in the paper's setting against its two studies (the
    DAG families, MetaGPT-TL-paper), and ``topas``'s beside them against its own."""
    docs = table(section(topas_md, "**In the paper's setting** (four"), "| workload | paper mean")

    def peaks(study: str) -> dict[str, list[str]]:
        return side_by_side((DOCS / "results" / study / "summary.md").read_text())

    rollout = peaks("paper_rollout") | peaks("paper_rollout_tl")
    topas = peaks("paper")
    fresh = peaks("paper_rollout_30") | peaks("paper_rollout_tl_30")
    assert [r[0] for r in docs] == list(rollout)
    for row in docs:
        s, t = rollout[row[0]], topas[row[0]]
        # peak cut and CI, mean then p99; topas and the fresh seeds: the peaks alone
        assert numbers(row[2]) == numbers(s[2])[:2] + numbers(s[5])[:2], row[0]
        assert numbers(row[3]) == numbers(t[2])[:1] + numbers(t[5])[:1], row[0]
        f = fresh[row[0]]
        assert numbers(row[4]) == numbers(f[2])[:1] + numbers(f[5])[:1], row[0]


def test_overload_table_matches_its_summary(topas_md: str) -> None:
    docs = table(section(topas_md, "#### Past load 1.5"), "| workload | paper mean / p99")
    summary = (DOCS / "results" / "paper_overload_registered" / "summary.md").read_text()
    assert "one_agent" not in summary  # the registered baselines only
    _check_cuts(docs, summary, 2)


def test_one_agent_table_matches_its_summary(topas_md: str) -> None:
    docs = table(
        section(topas_md, "#### Against a policy that serves one agent"), "| workload | mean: peak"
    )
    summary = (DOCS / "results" / "paper_one_agent" / "summary.md").read_text()
    assert "one_agent:OneAgent" in summary.split("## Side by side")[0]  # among the baselines
    _check_cuts(docs, summary, 1)
    wins, ties, losses = _tally(summary)
    assert f"{wins} wins, {ties} ties, **{losses} losses**" in topas_md


def test_polling_table_matches_its_summary(topas_md: str) -> None:
    docs = table(
        section(topas_md, "#### Against a polling policy that visits the longest queue"),
        "| workload | mean: peak",
    )
    summary = (DOCS / "results" / "paper_one_agent_most" / "summary.md").read_text()
    assert "one_agent:OneAgent:next=most" in summary.split("## Side by side")[0]
    _check_cuts(docs, summary, 1)
    wins, ties, losses = _tally(summary)
    assert f"{wins} wins, {ties} ties, **{losses} losses**" in section(
        topas_md, "#### Against a polling policy"
    )


def test_gap_table_matches_its_summary(topas_md: str) -> None:
    docs = table(section(topas_md, "### Distance to the optimum"), "| policy | mean gap")
    summary = (DOCS / "results" / "gap" / "summary.md").read_text()
    ours = {r[0]: r for r in table(summary, "| policy | n | mean gap %")}
    assert {r[0] for r in docs} == set(ours)
    for row in docs:
        s = ours[row[0]]
        # mean, p90 and max gap %; mean and max steps; at optimum
        want = [s[2], s[3], s[4], s[5], s[7], s[8]]
        assert [numbers(c) for c in row[1:]] == [numbers(c) for c in want], row[0]


def test_compare_table_matches_its_summary(topas_md: str) -> None:
    docs = table(
        section(topas_md, "### Against the best baseline on today's"), "| workload | mean JCT"
    )
    summary = (DOCS / "results" / "compare" / "summary.md").read_text()
    for row in docs:
        rows = {r[0]: r for r in table(section(summary, f"## {row[0]}\n"), "| load |")}
        for cell, load, col in (
            (row[1], "1", 4),
            (row[2], "1", 8),
            (row[3], "1.2", 4),
            (row[4], "1.2", 8),
        ):
            got = rows[load]
            assert numbers(cell)[:2] == numbers(got[col])[:2], (row[0], load, cell, got[col])
            best = got[1] if col == 4 else got[5]
            assert f"({best})" in cell, (row[0], load, cell)


def test_ablation_table_matches_its_summary(topas_md: str) -> None:
    docs = table(section(topas_md, "### Ablation"), "| variant | chain")
    summary = (DOCS / "results" / "ablation" / "summary.md").read_text()
    ours = {r[0].removeprefix("topas:"): r for r in table(summary, "| variant | chain")}
    for row in docs:
        names = [n.strip(" `") for n in row[0].split(",")]
        for name in names:
            s = ours[name]
            for d, w in zip(row[1:], s[1:], strict=True):
                assert numbers(d) == numbers(w) or numbers(d) == [0.0], (name, d, w)


@pytest.mark.parametrize(
    ("header", "study"),
    [
        ("| policy | mean, 1.0 | mean, 1.2 | p99", "sop_tradeoff"),
        ("| policy | mean, 0.8 | mean, 1.0 | mean, 1.2 | mean, 1.5 |", "sop_frontier"),
        ("| boost policy | mean, 0.8 | mean, 1.0 | mean, 1.2 | mean, 1.5 |", "sop_boost"),
    ],
)
def test_policy_by_load_tables_match_their_summaries(topas_md: str, header, study) -> None:
    """A docs table of mean and p99 JCT per policy (columns ``mean, LOAD`` then ``p99,
    LOAD``) against the per-policy tables of a ``compare_policies.py`` summary."""
    head = next(line for line in topas_md.splitlines() if line.startswith(header))
    columns = [c.strip().split(", ") for c in head.strip("|").split("|")][1:]
    docs = table(topas_md, header)
    summary = (DOCS / "results" / study / "summary.md").read_text()
    per_metric = {  # metric -> load -> the summary's row
        metric: {
            float(r[1]): r
            for r in table(section(summary, f"## {metric} JCT per policy"), "| workload | load |")
        }
        for metric in ("mean", "p99")
    }
    means = section(summary, "## mean JCT per policy")
    top = next(line for line in means.splitlines() if line.startswith("| workload | load |"))
    policies = [c.strip() for c in top.strip("|").split("|")][2:]
    assert docs
    for row in docs:
        col = 2 + policies.index(row[0].strip("`"))
        want = [float(per_metric[metric][float(load)][col]) for metric, load in columns]
        assert [float(x) for x in row[1:]] == want, row


def test_every_cited_summary_is_committed(topas_md: str) -> None:
    cited = set(re.findall(r"\(results/([\w-]+)/summary\.md\)", topas_md))
    assert cited >= {"paper", "paper-greedy", "gap", "compare", "ablation", "starvation"}
    for name in cited:
        assert (DOCS / "results" / name / "summary.md").is_file(), name


def test_gap_tuning_table_matches_its_summaries(topas_md: str) -> None:
    docs = table(section(topas_md, "### Distance to the optimum"), "| variant | mean gap, seed")
    ours = {}
    for seed in (1000, 0):
        summary = (DOCS / "results" / f"gap_tuning_{seed}" / "summary.md").read_text()
        ours[seed] = {r[0]: r for r in table(summary, "| policy | n | mean gap %")}
    assert {r[0] for r in docs} == set(ours[1000]) == set(ours[0])
    for row in docs:
        # mean and max gap % of each tuning study
        want = [
            ours[1000][row[0]][2],
            ours[1000][row[0]][4],
            ours[0][row[0]][2],
            ours[0][row[0]][4],
        ]
        assert [numbers(c) for c in row[1:]] == [numbers(c) for c in want], row[0]


def _worse_cells(summary: str) -> int:
    """Cells of the per-load tables of a ``compare_policies.py`` summary that say TOPAS is
    worse beyond the CI."""
    rows = [line for line in summary.splitlines() if re.match(r"\| \d", line)]
    return sum(line.count("**worse**") for line in rows)


def test_replication_table_matches_its_summaries(topas_md: str) -> None:
    docs = {r[0]: r[1:] for r in table(section(topas_md, "### Replication"), "| study |")}
    results = DOCS / "results"
    paper = {
        name: (results / name / "summary.md").read_text()
        for name in ("paper", "replication/paper_seeds30")
    }
    for col, text in enumerate(paper.values()):
        got = numbers(docs["paper's setting, wins / ties / losses over 50 points"][col])
        assert got == [float(x) for x in _tally(text)], col
        ours = side_by_side(text)
        for name, label in (
            ("chain-3", "Chain-3"),
            ("dag-4", "DAG-4"),
            ("dag-10-wide", "DAG-10-Wide"),
            ("metagpt-tl-paper", "MetaGPT-TL-paper"),
        ):
            want = [numbers(ours[name][2])[0], numbers(ours[name][5])[0]]
            assert numbers(docs[f"{label}, peak mean / p99 cut"][col]) == want, (name, col)
        sop = ours["metagpt-sop-paper"]
        want = [numbers(sop[3])[0], numbers(sop[6])[0]]
        assert numbers(docs["MetaGPT-SOP-paper, mean / p99 cut over loads"][col]) == want

    for label, points, studies in (
        ("Chain-3 / DAG-4 / DAG-10-Wide", 30, ("paper_rollout", "paper_rollout_30")),
        ("MetaGPT-TL-paper", 10, ("paper_rollout_tl", "paper_rollout_tl_30")),
    ):
        tally = docs[f"`topas-rollout`, {label}: wins / ties / losses over {points} points"]
        for col, name in enumerate(studies):
            want = [float(x) for x in _tally((results / name / "summary.md").read_text())]
            assert numbers(tally[col]) == want, name

    reported = (results / "compare" / "summary.md").read_text()
    fresh = (results / "replication" / "compare_seeds40" / "summary.md").read_text()
    averaged = "today's five, `topas` mean / p99 change, averaged over 20 points"
    for col, text in enumerate((reported, fresh)):
        row = specs(text)["topas"]
        assert numbers(docs[averaged][col]) == [float(row[1]), float(row[3])], col
    fresh_specs = specs(fresh)
    worse = docs["today's five, `topas` worse beyond the CI (mean + p99, of 40)"]
    assert numbers(worse[0]) == [_worse_cells(reported)]
    assert numbers(worse[1]) == [_worse_cells(fresh)]
    spec_worse = sum(numbers(fresh_specs["topas"][i])[0] for i in (2, 4))
    assert spec_worse == _worse_cells(fresh)
    rollout_worse = docs["today's five, `topas-rollout` worse beyond the CI (mean + p99)"]
    today = ("compare_rollout", "compare_rollout_tl", *SOP_ROLLOUT)  # seeds 20-24
    worse_today = sum(_worse_cells((results / n / "summary.md").read_text()) for n in today)
    assert numbers(rollout_worse[0])[:2] == [worse_today, 40]
    assert numbers(rollout_worse[1])[:2] == [sum(map(_worse_cells, rollout_seeds40())), 28]
    greedy = docs["today's five, `topas-greedy` mean / p99 change, averaged"][1]
    assert numbers(greedy) == [
        float(fresh_specs["topas-greedy"][1]),
        float(fresh_specs["topas-greedy"][3]),
    ]

    for col, name in enumerate(("gap", "replication/gap_seed2")):
        text = (results / name / "summary.md").read_text()
        row = {r[0]: r for r in table(text, "| policy | n | mean gap %")}["`topas`"]
        assert numbers(docs["gap, `topas` mean / p90 / max %"][col]) == [
            float(row[2]),
            float(row[3]),
            float(row[4]),
        ]
        assert docs["gap, `topas` at the optimum"][col] == row[8]


def test_load12_table_matches_its_summary(topas_md: str) -> None:
    docs = table(topas_md, "| workload | `spf` | `parrot-fcfs` | `topas` |")
    summary = (DOCS / "results" / "tuning_today_load12" / "summary.md").read_text()
    header = next(line for line in summary.splitlines() if line.startswith("| workload | load |"))
    policies = [c.strip() for c in header.strip("|").split("|")][2:]
    by_metric = [
        {r[0]: r for r in table(section(summary, heading), "| workload | load |")}
        for heading in ("## mean JCT per policy", "## p99 JCT per policy")
    ]
    names = [
        "spf",
        "parrot-fcfs",
        "topas",
        "topas:aging=0,reserve=0",
        "topas:aging=0,reserve=0,search=all",
        "topas-greedy:aging=0,reserve=0",
    ]
    assert {r[0] for r in docs} == set(by_metric[0])
    for row in docs:
        for cell, name in zip(row[1:], names, strict=True):
            col = 2 + policies.index(name)
            assert numbers(cell) == [float(m[row[0]][col]) for m in by_metric], (row[0], name)


def _live_groups(header_start: str, n: int):  # type: ignore[no-untyped-def]
    """The rows of a live-bench table of the plugin README (``n`` of them), each with the
    rows of the summary it comes from, by (workload, seed, policy): a row whose first
    cell links a summary starts a group of rows from that summary."""
    readme = DOCS.parent / "integration" / "sglang" / "README.md"
    rows = table(readme.read_text(), header_start)
    assert len(rows) == n
    live: dict[tuple[str, str, str], list[str]] = {}
    for row in rows:
        link = re.search(r"\(\.\./\.\./(docs/results/[\w/]+/summary\.md)\)", row[0])
        if link:
            summary = (DOCS.parent / link.group(1)).read_text()
            live = {
                (r[0], r[1], r[2].strip("`")): r
                for r in table(summary, "| workload | seed | policy | loop |")
            }
        yield row, live


@pytest.mark.parametrize(
    ("header", "n", "policies", "column"),
    [
        # the table behind the offloaded default; its last column: scheduler CPU ms per call
        ("| seeds | workload | seed | `topas` | `topas-offload`", 12,
         ("topas", "topas-offload", "lru"), 8),
        # the table behind the default scorer; its last column: planner ms per plan
        ("| seeds | workload | seed | `topas-greedy` | `topas` |", 8,
         ("topas-greedy-offload", "topas-offload", "lru"), 13),
    ],
)  # fmt: skip
def test_plugin_live_tables_match_their_summaries(
    header: str, n: int, policies: tuple[str, ...], column: int
) -> None:
    # integration/sglang/README.md's live-bench tables: columns 3-5 the live mean JCTs of
    # ``policies``, column 6 the summary's ``column`` for the first two
    for row, live in _live_groups(header, n):
        workload, seed = row[1], row[2]
        for policy, cell in zip(policies, row[3:6], strict=True):
            got = live[(workload, seed, policy)]  # live mean / p99, then ... CPU ms per call
            assert numbers(cell) == numbers(got[4])[:1], (workload, seed, policy)
        last = [numbers(live[(workload, seed, p)][column])[0] for p in policies[:2]]
        assert numbers(row[6]) == last, (workload, seed)


def _headline_averages(summary: str) -> dict[str, list[float]]:
    """Per workload, the mean and p99 change averaged over loads, from a
    ``compare_policies.py`` summary's headlines."""
    found = re.findall(
        r"- \*\*([\w-]+)\*\*: mean JCT ([+-]\d+\.\d)% averaged over loads.*?"
        r"p99 JCT ([+-]\d+\.\d)% averaged over loads",
        summary,
    )
    return {w: [float(m), float(p)] for w, m, p in found}


def _part(summary: str, workload: str) -> str:
    """A ``compare_policies.py`` summary's part on ``workload``."""
    return section(summary, f"## {workload}\n", until="\n## ")


def test_rollout_today_table_matches_its_summaries(topas_md: str) -> None:
    """``topas-rollout`` on today's five against its study, ``topas`` beside it against
    the reported comparison on the same seeds."""
    docs = table(section(topas_md, "**On today's five**"), "| workload | `topas-rollout`")
    rollout = (DOCS / "results" / "compare_rollout" / "summary.md").read_text()
    topas = (DOCS / "results" / "compare" / "summary.md").read_text()
    ours, theirs = _headline_averages(rollout), _headline_averages(topas)
    assert [r[0] for r in docs] == list(ours)
    assert set(ours) <= set(theirs)
    for row in docs:
        worse = _worse_cells(_part(rollout, row[0]))
        assert numbers(row[1]) == ours[row[0]], row[0]
        assert numbers(row[2]) == [worse], row[0]
        assert numbers(row[3]) == theirs[row[0]], row[0]
        assert numbers(row[4]) == [_worse_cells(_part(topas, row[0]))], row[0]
    ours_specs = specs(rollout)
    names = ("topas-rollout", "topas", BEFORE, "topas-greedy")
    averaged = [ours_specs[name][i] for name in names for i in (1, 3)]
    text = " ".join(section(topas_md, "**On today's five**").split())
    assert (
        "change is {}% mean and {}% p99, against `topas`'s {}% / {}%, its base's {}% / {}% and "
        "`topas-greedy`'s {}% / {}%"
    ).format(*averaged) in text
    every = (DOCS / "results" / "compare_rollout_tl" / "summary.md").read_text()
    (row,) = [r for r in table(_part(every, "metagpt-tl"), "| load |") if r[0] == "1.2"]
    assert (row[1], row[5]) == ("spf", "parrot-fcfs")
    cells = [row[4].removesuffix(" worse"), row[8]]  # table() drops the bold
    assert f"mean is {cells[0]}% against `spf`" in text
    assert f"p99 {cells[1]}% against `parrot-fcfs`" in text
    every_specs = specs(every)
    averaged = [every_specs[name][i] for name in names for i in (1, 3)]
    assert (
        "change is {}% mean and {}% p99, against `topas`'s {}% / {}%, its base's {}% / {}% and "
        "`topas-greedy`'s {}% / {}%"
    ).format(*averaged) in text
    assert _worse_cells(every) == 1 and "worse beyond the CI at 1 of 8 points" in text


def test_rollout_tl_max_stages_sentence_matches_its_summary(topas_md: str) -> None:
    """The tuning-seed figures of "Why the rollout does not help at load 1.2" against the
    committed tuning summary."""
    summary = (DOCS / "results" / "tuning_rollout_tl12" / "summary.md").read_text()
    assert "**Tuning seeds**" in summary
    rows = specs(summary)
    names = ("topas-rollout:max_stages=256", "topas-rollout", "topas", "topas-greedy")
    cells = [rows[name][i] for name in names for i in (1, 3)]
    text = " ".join(section(topas_md, "**On today's five**").split())
    assert (
        "is {}% / {}% with `max_stages=256`, against {}% / {}% for the default rollout, "
        "{}% / {}% for `topas` and {}% / {}% for `topas-greedy`"
    ).format(*cells) in text


SOP_ROLLOUT = ("compare_rollout_sop_05", "compare_rollout_sop_08", "compare_rollout_sop_10_12")


def study_runs(folder: str) -> tuple[dict, list[dict]]:
    """A committed study's config.json and its runs.csv rows (``load`` as a float)."""
    import csv

    study = DOCS / "results" / folder
    cfg = json.loads((study / "config.json").read_text())
    with (study / "runs.csv").open(newline="") as f:
        return cfg, [{**r, "load": float(r["load"])} for r in csv.DictReader(f)]


def test_rollout_sop_table_matches_its_runs(topas_md: str) -> None:
    """Every cell of the MetaGPT-SOP table of "On today's five" recomputed from the three
    studies' runs.csv with compare_policies' own comparison, the averages beside it, and
    the baselines' JCTs against the reported comparison's summary (its `topas` has had
    ``drain_load`` since 2026-12-07; these studies' `topas` is the one of before)."""
    import numpy as np

    cp = load_analysis("compare_policies")
    bullet = section(topas_md, "- **MetaGPT-SOP** (2026-12-06", until="\n- **")
    dedented = "\n".join(line.removeprefix("  ") for line in bullet.splitlines())
    docs = {row[0]: row[1:] for row in table(dedented, "| load | best baselines |")}
    reported = (DOCS / "results" / "compare" / "summary.md").read_text()
    names = ("topas-rollout", BEFORE, "topas-greedy")  # BEFORE: the rollout's base
    changes: dict[str, list[float]] = {f"{n} {m}": [] for n in names for m in ("mean", "p99")}
    for folder in SOP_ROLLOUT:
        cfg, rows = study_runs(folder)
        summary = (DOCS / "results" / folder / "summary.md").read_text()
        assert _worse_cells(summary) == 0, folder
        for load in cfg["loads"]:
            point = [r for r in rows if r["load"] == load]
            row = docs.pop(f"{load:.1f}")
            for col, name in enumerate(names, start=1):
                cells, best = [], []
                for metric, short in (("mean_jct", "mean"), ("p99_jct", "p99")):
                    c = cp.compare_point(point, {**cfg, "proposed": name}, metric)
                    cells.append(cp.ex.fmt_change(c["change"], c["half"]))
                    best.append(c["best"])
                    changes[f"{name} {short}"].append(c["change"])
                    assert not cp.ex.worse_beyond_ci(c["change"], c["half"]), (load, name)
                assert row[col] == " / ".join(cells), (load, name)
                assert row[0] == " / ".join(best), load
            # the baselines: the reported comparison's JCTs, to 0.1 s (its last two
            # columns are its `topas` and `topas:token_floor=0`)
            for per in ("mean JCT", "p99 JCT"):
                own = table(section(summary, f"## {per} per policy"), "| workload |")
                theirs = table(section(reported, f"## {per} per policy"), "| workload |")
                (a,) = [r for r in own if r[0] == "metagpt-sop" and float(r[1]) == load]
                (b,) = [r for r in theirs if r[0] == "metagpt-sop" and float(r[1]) == load]
                assert a[: len(b) - 2] == b[:-2], (load, per)
    assert not docs  # every row of the docs' table has a study
    averaged = [f"{np.mean(changes[f'{n} {m}']):+.1f}" for n in names for m in ("mean", "p99")]
    text = " ".join(bullet.split())
    assert (
        "Averaged over the loads: rollout {}% / {}%, its base {}% / {}%, `topas-greedy` {}% / {}%"
    ).format(*averaged) in text


def test_rollout_max_stages_on_reporting_seeds_matches_its_summary(topas_md: str) -> None:
    """The reporting-seed figures of `topas-rollout:max_stages=256` on MetaGPT-TL at load
    1.2 against its summary (the default rollout's against the same summary)."""
    summary = (DOCS / "results" / "compare_rollout256_tl12" / "summary.md").read_text()
    (row,) = table(_part(summary, "metagpt-tl"), "| load |")
    assert row[0] == "1.2" and (row[1], row[5]) == ("spf", "parrot-fcfs")
    assert _worse_cells(summary) == 0
    text = " ".join(section(topas_md, "**On today's five**").split())
    assert f"its mean is {row[4]}% against `spf` and its p99 {row[8]}% against" in text
    default = specs(summary)["topas-rollout"]
    assert f"where the default rollout's mean is worse ({default[1]} ± 4.4%)" in text
    every = (DOCS / "results" / "compare_rollout_tl" / "summary.md").read_text()
    (then,) = [r for r in table(_part(every, "metagpt-tl"), "| load |") if r[0] == "1.2"]
    assert then[4] == f"{default[1]} ± 4.4 worse"  # the same runs as the all-loads study


def _check_rollout256(text: str, study: str, default_study: str, workloads: list[str]) -> tuple:
    """The docs' table of `max_stages=256` peaks in ``text`` against the summary of
    ``study``, its default-rollout column against ``default_study``'s, and its tally in
    the text; returns both tallies."""
    docs = table(text, "| workload | paper mean / p99 | `max_stages=256`")
    ours_md = (DOCS / "results" / study / "summary.md").read_text()
    default_md = (DOCS / "results" / default_study / "summary.md").read_text()
    ours, default = side_by_side(ours_md), side_by_side(default_md)
    assert [r[0] for r in docs] == list(ours) == workloads
    for row in docs:
        s, d = ours[row[0]], default[row[0]]
        assert numbers(row[2]) == numbers(s[2])[:2] + numbers(s[5])[:2], row[0]
        assert numbers(row[3]) == numbers(d[2])[:1] + numbers(d[5])[:1], row[0]
    wins, ties, losses = _tally(ours_md)
    assert f"{wins} wins, {ties} ties, **{losses} loss" in " ".join(text.split())
    return (wins, ties, losses), _tally(default_md)


def test_rollout_at_every_scale_in_the_papers_setting_matches_its_summary(topas_md: str) -> None:
    """`topas-rollout:max_stages=256` on the three DAG families (seeds 20-29): the docs'
    peaks and tally against its summary, the default rollout's column against its own."""
    text = section(topas_md, "**Rolling out at every scale in the paper's setting**")
    families = ["chain-3", "dag-4", "dag-10-wide"]
    ours, default = _check_rollout256(text, "paper_rollout256", "paper_rollout", families)
    assert ours == default


def test_rollout_at_every_scale_on_fresh_seeds_matches_its_summary(topas_md: str) -> None:
    """The same on seeds 30-39: the docs' peaks and tally against its summary, the
    default rollout's column against that of the default rollout on the same seeds."""
    text = section(topas_md, "**The same on fresh seeds 30-39**")
    families = ["chain-3", "dag-4", "dag-10-wide"]
    ours, default = _check_rollout256(text, "paper_rollout256_30", "paper_rollout_30", families)
    assert ours == default == ("27", "3", "0")


def test_rollout_at_every_scale_on_metagpt_tl_paper_matches_its_summary(topas_md: str) -> None:
    """`topas-rollout:max_stages=256` on MetaGPT-TL-paper (seeds 20-29): the docs' peak
    cuts and tally against its summary, the default rollout's column against its own."""
    text = section(topas_md, "**MetaGPT-TL-paper with `max_stages=256`**")
    tl = ["metagpt-tl-paper"]
    ours, default = _check_rollout256(text, "paper_rollout256_tl", "paper_rollout_tl", tl)
    assert ours == ("10", "0", "0") and default == ("9", "0", "1")


def test_rollout_at_every_scale_on_metagpt_tl_paper_fresh_seeds_matches_its_summary(
    topas_md: str,
) -> None:
    """The same on seeds 30-39 at loads 1.2 and 1.5, against the default rollout's
    summary on those seeds (all five loads)."""
    text = section(topas_md, "**MetaGPT-TL-paper with `max_stages=256` on fresh seeds")
    tl = ["metagpt-tl-paper"]
    ours, default = _check_rollout256(text, "paper_rollout256_tl_30", "paper_rollout_tl_30", tl)
    assert ours == ("4", "0", "0") and default == ("9", "1", "0")


ROLLOUT_40 = ("tl_mixed", "chain_fanout", "sop")


def rollout_seeds40() -> list[str]:
    """The summaries of the three ``topas-rollout`` studies of today's five, seeds 40-44."""
    results = DOCS / "results" / "replication"
    return [(results / f"rollout_seeds40_{p}" / "summary.md").read_text() for p in ROLLOUT_40]


def test_rollout_today_fresh_seeds_table_matches_its_summaries(topas_md: str) -> None:
    """``topas-rollout`` on today's five, seeds 40-44: the docs' tally, averages and the
    rollout's losses against the three studies' summaries, and every other policy's JCTs
    against the replication study's summary on the same seeds."""
    text = section(topas_md, "**Today's five on fresh seeds 40-44**")
    docs = {r[0].strip("`"): r for r in table(text, "| spec | worse beyond the CI, of 28")}
    studies = rollout_seeds40()
    assert list(docs) == ["topas-rollout", "topas", BEFORE, "topas-greedy"]
    for name, row in docs.items():
        worse = of = 0
        averages = [0.0, 0.0]
        for summary in studies:
            rows = specs(summary)[name]
            for k, cell in enumerate((rows[2], rows[4])):  # "worse/points", mean then p99
                bad, points = (int(x) for x in cell.split("/"))
                worse, of = worse + bad, of + points
                averages[k] += float(rows[1 + 2 * k]) * points  # weighted by its points
        assert of == 28 and int(row[1]) == worse, name
        assert numbers(row[3]) == [round(a / 14, 1) for a in averages], name
    lost = [
        cell.replace("**worse**", "").strip()
        for summary in studies
        for line in summary.splitlines()
        if re.match(r"\| \d", line)
        for cell in line.split("|")
        if "**worse**" in cell
    ]
    assert len(lost) == int(docs["topas-rollout"][1])
    assert all(f"{cell}%" in docs["topas-rollout"][2] for cell in lost)
    replication = (DOCS / "results" / "replication" / "compare_seeds40" / "summary.md").read_text()
    for summary in studies:
        for heading in ("## mean JCT per policy", "## p99 JCT per policy"):
            theirs = per_policy(section(replication, heading, until="\n## "))
            ours = per_policy(section(summary, heading, until="\n## "))
            for name, cells in ours.items():  # every column but the rollout's, renamed
                if name != "topas-rollout":
                    theirs_now = theirs[RENAMED.get(name, name)]
                    assert all(theirs_now[k] == v for k, v in cells.items()), name


def per_policy(part: str) -> dict[str, dict[tuple[str, str], str]]:
    """A "per policy" table of a compare_policies summary: policy -> (workload, load) ->
    its cell."""
    top = next(ln for ln in part.splitlines() if ln.startswith("| workload | load |"))
    names = [c.strip() for c in top.strip("|").split("|")][2:]
    out: dict[str, dict[tuple[str, str], str]] = {n: {} for n in names}
    for row in table(part, "| workload | load |"):
        for name, cell in zip(names, row[2:], strict=True):
            out[name][row[0], row[1]] = cell
    return out


NARROW = "topas-rollout:narrow_stages=256"
METRICS2 = ("mean_jct", "p99_jct")
NARROW_POINTS = (
    ("narrow256_tl12_20", "20-24", "metagpt-tl"),
    ("narrow256_12_40", "40-44", "metagpt-tl"),
    ("narrow256_12_40", "40-44", "mixed"),
)


def narrow_rows() -> list[list[str]]:
    """The rows of the `narrow_stages=256` table, computed from the studies' runs.csv
    with compare_policies' own comparison and experiments' paired change."""
    cp = load_analysis("compare_policies")
    out = []
    for folder, seeds, workload in NARROW_POINTS:
        cfg, rows = study_runs(folder)
        point = [r for r in rows if r["workload"] == workload]
        cells = [f"{seeds}, {workload}"]
        for name in (NARROW, "topas-rollout", "topas-greedy"):
            changes = []
            for metric in METRICS2:
                c = cp.compare_point(point, {**cfg, "proposed": name}, metric)
                changes.append(cp.ex.fmt_change(c["change"], c["half"]))
            cells.append(" / ".join(changes))
        cuts = []
        for metric in METRICS2:
            change, half = cp.ex.paired_change(
                point, {"policy": NARROW}, {"policy": "topas-rollout"}, metric
            )
            cuts.append(cp.ex.fmt_change(-change, half))
        cells.append(" / ".join(cuts))
        runtime = [
            cp.ex.mean_of(cp.ex.select(point, policy=p), "runtime_s")
            for p in (NARROW, "topas-rollout")
        ]
        cells.append(f"{runtime[0]:.0f} / {runtime[1]:.0f}")
        out.append(cells)
    return out


def test_narrow_rollout_table_matches_its_runs(topas_md: str) -> None:
    """The `narrow_stages=256` table of "On today's five", every cell recomputed."""
    bullet = section(
        topas_md,
        "- **A narrow rollout above `max_stages`** (`narrow_stages`, 2026",
        until="\n- **MetaGPT-SOP**",
    )
    dedented = "\n".join(line.removeprefix("  ") for line in bullet.splitlines())
    assert table(dedented, "| seeds, workload |") == narrow_rows()


FRONTIER12 = (("frontier12_20", "20-24"), ("frontier12_40", "40-44"))
FRONTIER12_SPECS = ("topas", "topas-greedy", "topas-greedy:aging=0.1", "topas-greedy:aging=0")


def vs_registered(
    point: list[dict], cfg: dict, spec: str, metric: str
) -> tuple[float, float, bool]:
    """``spec``'s change against the best of the 8 registered baselines at one point (a
    study's own config may count probes as baselines), by compare_policies' comparison:
    (change %, CI half-width, worse beyond the CI)."""
    from topas.policies import BASELINES

    cp = load_analysis("compare_policies")
    c = cp.compare_point(point, {**cfg, "baselines": list(BASELINES), "proposed": spec}, metric)
    return c["change"], c["half"], cp.ex.worse_beyond_ci(c["change"], c["half"])


def against_registered(point: list[dict], cfg: dict, spec: str) -> str:
    """:func:`vs_registered` as a table cell: ``mean / p99`` with their CIs, each bold
    where worse beyond the CI."""
    fmt = load_analysis("compare_policies").ex.fmt_change
    cells = []
    for m in METRICS2:
        change, half, worse = vs_registered(point, cfg, spec, m)
        cells.append(f"**{fmt(change, half)}**" if worse else fmt(change, half))
    return " / ".join(cells)


def frontier12_rows() -> list[str]:
    """The table lines of "The trade at load 1.2 on reporting seeds", recomputed from the
    two studies' runs.csv: each spec's change against the best *registered* baseline
    (bold where worse beyond the CI), and how many probe settings are ahead of ``topas``
    and of ``topas-greedy`` on both metrics (means over the seeds)."""
    cp = load_analysis("compare_policies")
    lines = []
    for folder, seeds in FRONTIER12:
        cfg, rows = study_runs(folder)
        for workload in cfg["workloads"]:
            point = [r for r in rows if r["workload"] == workload]
            cells = [f"{seeds}, {workload}"]
            cells += [against_registered(point, cfg, name) for name in FRONTIER12_SPECS]
            at = {
                p: tuple(cp.ex.mean_of(cp.ex.select(point, policy=p), m) for m in METRICS2)
                for p in cfg["policies"]
            }
            probes = [p for p in at if p.startswith(("guarded_spf:", "boost:"))]
            assert len(probes) == 13
            ahead = [
                sum(at[q][0] <= at[t][0] and at[q][1] <= at[t][1] for q in probes)
                for t in ("topas", "topas-greedy")
            ]
            cells.append(f"{ahead[0]} / {ahead[1]}")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def test_frontier12_table_matches_its_runs(topas_md: str) -> None:
    """The load-1.2 trade table, every cell and its bold recomputed; no policy of the two
    studies best on both metrics (``frontier.py``'s test); the registered baselines' and
    ``topas-greedy``'s JCTs equal to the earlier studies' on these seeds, and ``topas``'s
    to the comparison's of the same seeds (both run with the defaults of 2026-12-07)."""
    text = section(topas_md, "**The trade at load 1.2 on reporting seeds", until="\n### ")
    start = text.index("| seeds, workload | `topas` |")
    lines = [ln.strip() for ln in text[start:].splitlines()[2:6]]
    assert lines == frontier12_rows()
    before = []  # the `topas` of before's cells, quoted after the table
    for folder, _ in FRONTIER12:
        cfg, rows = study_runs(folder)
        for workload in cfg["workloads"]:
            before.append(
                against_registered([r for r in rows if r["workload"] == workload], cfg, BEFORE_NOW)
            )
    quoted = " ".join(text[start:].split())
    assert "in the table's order, {}, {}, {} and {}, with".format(*before) in quoted
    frontier = load_analysis("frontier")
    earlier = {  # (studies of the `topas` of before, the comparison of today's `topas`)
        "frontier12_20": (("narrow256_tl12_20", "compare_rollout"), "compare"),
        "frontier12_40": (("narrow256_12_40",), "replication/compare_seeds40"),
    }
    for folder, _ in FRONTIER12:
        cfg, rows = study_runs(folder)
        for workload in cfg["workloads"]:
            for at in frontier.points(rows, workload).values():
                assert frontier.reaches_both(at) == []
        mine = {(r["workload"], r["seed"], r["policy"]): r["mean_jct"] for r in rows}
        older, current = earlier[folder]
        checked = 0
        for other in older:
            for r in study_runs(other)[1]:
                key = (r["workload"], r["seed"], r["policy"])
                if r["load"] == 1.2 and key in mine and r["policy"] != "topas":
                    assert mine[key] == r["mean_jct"], (other, key)
                    checked += 1
        assert checked >= 5 * 9 * len(cfg["workloads"]), folder
        assert shared_runs(folder, current, policy="topas") == 5 * len(cfg["workloads"])


def averaged_changes(folder: str, spec: str) -> dict[str, float]:
    """``spec``'s change against the best registered baseline over every (workload, load)
    point of a committed study, by compare_policies' comparison: the mean of each metric's
    change, the worst p99 change, and the cells worse beyond the CI."""
    return averaged_over(*study_runs(folder), spec)


def averaged_over(cfg: dict, rows: list[dict], spec: str) -> dict[str, float]:
    """:func:`averaged_changes` over a study's config and rows, given."""
    changes: dict[str, list[float]] = {m: [] for m in METRICS2}
    worse = 0
    for workload in cfg["workloads"]:
        for load in cfg["loads"]:
            point = [r for r in rows if r["workload"] == workload and r["load"] == load]
            for m in METRICS2:
                change, _, beyond = vs_registered(point, cfg, spec, m)
                changes[m].append(change)
                worse += beyond
    return {
        "mean": sum(changes["mean_jct"]) / len(changes["mean_jct"]),
        "p99": sum(changes["p99_jct"]) / len(changes["p99_jct"]),
        "worst_p99": max(changes["p99_jct"]),
        "worse": worse,
        "points": len(changes["mean_jct"]),
    }


def test_greedy_aging_tuning_averages_match_its_runs(topas_md: str) -> None:
    """The tuning averages quoted for `topas-greedy:aging=0.1` against the default,
    recomputed with compare_policies' comparison over the study's 20 points."""
    low, default = (
        averaged_changes("tuning_greedy_aging", s)
        for s in ("topas-greedy:aging=0.1", "topas-greedy")
    )
    assert low["points"] == 20
    text = " ".join(section(topas_md, "- **`topas-greedy:aging=0.1` ties", until="\n- **").split())
    assert (
        f"is {low['mean']:+.1f}% mean / {low['p99']:+.1f}% p99 "
        f"(worst p99 {low['worst_p99']:+.1f}%)" in text
    )
    assert (
        f"against {default['mean']:+.1f}% / {default['p99']:+.1f}% "
        f"(worst p99 {default['worst_p99']:+.1f}%) at the default" in text
    )


def test_drain_switch_tuning_averages_match_their_runs(topas_md: str) -> None:
    """The drain switches' tuning averages in "Parameters and defaults", recomputed."""
    text = " ".join(section(topas_md, "**The drain switches**", until="\n\n").split())
    for folder in ("tuning_drain_paper", "tuning_drain_today"):
        for spec in ("topas", "topas:drain_running=0", "topas:drain=0"):
            a = averaged_changes(folder, spec)
            quoted = f"`{spec}` {a['mean']:+.1f} / {a['p99']:+.1f}% ({a['worse']} worse)"
            assert quoted in text, (folder, quoted)


def nodrain_rows() -> list[str]:
    """The drain ablation's table lines: per paper workload, `topas`'s and
    `topas:drain=0`'s change against the best registered baseline (mean / p99, bold where
    worse beyond the CI) at each load of the study."""
    cfg, rows = study_runs("paper_nodrain")
    lines = []
    for workload in cfg["workloads"]:
        cells = [workload]
        for spec in ("topas", "topas:drain=0"):
            per_load = []
            for load in cfg["loads"]:
                point = [r for r in rows if r["workload"] == workload and r["load"] == load]
                pair = []
                for m in METRICS2:
                    change, _, worse = vs_registered(point, cfg, spec, m)
                    pair.append(f"**{change:+.1f}**" if worse else f"{change:+.1f}")
                per_load.append(" / ".join(pair))
            cells.append("; ".join(per_load))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def test_drain_ablation_table_matches_its_runs(topas_md: str) -> None:
    """The paper-setting drain ablation: every cell recomputed, the averages quoted, and
    every registered baseline's and `topas`'s JCTs equal to the paper study's."""
    text = section(topas_md, "- **The drain ablation**", until="\n- **")
    start = text.index("| workload | `topas`")
    lines = [ln.strip() for ln in text[start:].splitlines()[2:7]]
    assert lines == nodrain_rows()
    flat = " ".join(text.split())
    for spec in ("topas", "topas:drain=0"):
        a = averaged_changes("paper_nodrain", spec)
        assert f"`{spec}` {a['mean']:+.1f} / {a['p99']:+.1f}% ({a['worse']} worse)" in flat
    paper = {
        (r["workload"], r["load"], r["seed"], r["policy"], r["kv_capacity_tokens"]): r["mean_jct"]
        for r in study_runs("paper")[1]
    }
    cfg, rows = study_runs("paper_nodrain")
    checked = 0
    for r in rows:
        key = (r["workload"], r["load"], r["seed"], r["policy"], r["kv_capacity_tokens"])
        if key in paper:
            assert paper[key] == r["mean_jct"], key
            checked += 1
    assert checked == 5 * 3 * 10 * 9  # every baseline's and topas's run of the study


def shared_runs(mine: str, other: str, **match: object) -> int:
    """How many runs of committed study ``mine`` are also in study ``other`` (same
    workload, load, seed and policy; ``other``'s rows narrowed to ``match``), each
    asserted to have the same mean JCT in both."""

    def key(r: dict) -> tuple:
        return r["workload"], r["load"], r["seed"], r["policy"]

    runs = {key(r): r["mean_jct"] for r in study_runs(mine)[1]}
    shared = [
        r
        for r in study_runs(other)[1]
        if key(r) in runs and all(r[k] == v for k, v in match.items())
    ]
    for r in shared:
        assert r["mean_jct"] == runs[key(r)], (mine, other, key(r))
    return len(shared)


NARROW_NODRAIN = (
    "topas-rollout:narrow_stages=256,narrow_bases=3,"
    "bases=topas+topas-greedy+topas:drain=0+lpm+parrot-fcfs"
)


NARROW_NODRAIN_POINTS = (
    ("20-24", "metagpt-tl", "narrow_nodrain_tl12_20", "narrow256_tl12_20"),
    ("40-44", "metagpt-tl", "narrow_nodrain_tl12_40", "narrow256_12_40"),
    ("40-44", "mixed", "narrow_nodrain_mixed12_40", "narrow256_12_40"),
)
"""(seeds, workload, its study, the `narrow_stages=256` study of the same instances)."""


def narrow_nodrain_rows() -> list[str]:
    """The no-drain narrow rollout's table lines, recomputed: against the best registered
    baseline from its own studies (bold where worse beyond the CI), paired against the
    narrow and the default rollouts from the `narrow_stages=256` studies on the same
    instances, and its mean run time."""
    cp = load_analysis("compare_policies")
    lines = []
    for seeds, workload, folder, earlier in NARROW_NODRAIN_POINTS:
        cfg, rows = study_runs(folder)
        cells = [f"{seeds}, {workload}"]
        cells += [against_registered(rows, cfg, spec) for spec in (NARROW_NODRAIN, "topas:drain=0")]
        rollouts = (NARROW, "topas-rollout")
        merged = rows + [
            r
            for r in study_runs(earlier)[1]
            if r["workload"] == workload and r["policy"] in rollouts
        ]
        for other in rollouts:
            pairs = [
                cp.ex.paired_change(merged, {"policy": NARROW_NODRAIN}, {"policy": other}, m)
                for m in METRICS2
            ]
            cells.append(" / ".join(cp.ex.fmt_change(*p) for p in pairs))
        runtime = cp.ex.mean_of(cp.ex.select(rows, policy=NARROW_NODRAIN), "runtime_s")
        cells.append(f"{runtime:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def test_narrow_nodrain_table_matches_its_runs(topas_md: str) -> None:
    """The no-drain narrow rollout's table, every cell recomputed, and the two studies'
    baselines, `topas` and `topas-greedy` equal to the `narrow_stages=256` studies'."""
    from topas.policies import BASELINES

    text = section(topas_md, "- **A narrow rollout with a no-drain base**", until="\n- **")
    start = text.index("| seeds, workload | SPEC against")
    rows = narrow_nodrain_rows()
    assert [ln.strip() for ln in text[start:].splitlines()[2 : 2 + len(rows)]] == rows
    for _, _, folder, earlier in NARROW_NODRAIN_POINTS:
        # 5 seeds x (8 baselines, topas-greedy); these studies ran before the defaults of
        # 2026-12-07, so their `topas` is BEFORE, which the re-run studies hold
        for policy in (*BASELINES, "topas-greedy"):
            assert renamed_runs(folder, policy, earlier, policy) == 5, (folder, policy)
        assert renamed_runs(folder, "topas", earlier, BEFORE) == 5, folder


BY_SIZE = (("jct_by_size_12", "20-24"), ("jct_by_size_paper12", "20-29"))
BY_SIZE_SPECS = ("spf", "topas", "topas-greedy")


def by_size_rows() -> list[str]:
    """The table lines of "Which tasks pay for the mean", recomputed from the two
    studies' runs.csv: the smallest and the largest quarter's mean JCT under `spf`,
    `topas` and `topas-greedy` (means over the seeds), and `topas`'s over `spf`'s."""
    jbs = load_analysis("jct_by_size")
    lines = []
    for folder, seeds in BY_SIZE:
        cfg, rows = study_runs(folder)
        assert cfg["groups"] == 4 and cfg["loads"] == [1.2]
        for w in cfg["workloads"]:
            quarters = {p: jbs.group_means(rows, cfg, w, 1.2, p) for p in BY_SIZE_SPECS}
            cells = [f"{seeds}, {w}"]
            for g in (0, 3):
                cells.append(" / ".join(jbs.ex.fmt_s(quarters[p][g]) for p in BY_SIZE_SPECS))
                cells.append(f"{quarters['topas'][g] / quarters['spf'][g]:.2f}")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def test_by_size_table_matches_its_runs(topas_md: str) -> None:
    """The task-size table of "Which tasks pay for the mean", every cell recomputed, and
    the two studies' baselines' mean JCTs equal, run by run, to the earlier studies of the
    same instances (the load-1.2 trade study, the SOP-paper frontier study)."""
    text = section(topas_md, "**Which tasks pay for the mean**", until="\n- **")
    start = text.index("| seeds, workload | smallest quarter |")
    lines = [ln.strip() for ln in text[start:].splitlines()[2:9]]
    assert lines == by_size_rows()
    # the baselines' runs (the earlier studies' `topas` is the one before drain_load):
    # ten seeds of MetaGPT-TL and mixed at 1.2 (frontier12_20), and of SOP-paper at 1.2
    for mine, other in (
        ("jct_by_size_12", "frontier12_20"),
        ("jct_by_size_paper12", "sop_frontier"),
    ):
        assert [shared_runs(mine, other, policy=p) for p in ("spf", "parrot-fcfs", "lpm")] == [
            10
        ] * 3


def readme_findings() -> str:
    """The README's "What the studies find", as one line of text."""
    readme = (DOCS.parent / "README.md").read_text()
    return " ".join(section(readme, "## What the studies find", until="\n## ").split())


def summary(folder: str) -> str:
    return (DOCS / "results" / folder / "summary.md").read_text()


def worse_of(row: list[str]) -> int:
    """Cells worse beyond the CI in a "TOPAS spec" row (``specs``): mean's plus p99's."""
    return int(row[2].split("/")[0]) + int(row[4].split("/")[0])


def test_readme_findings_match_their_summaries() -> None:
    """Every figure of the README's summary of the studies, read again from the committed
    summaries (and the task-size ratios from their runs) it stands for."""
    text = readme_findings()
    paper = summary("paper")
    ours = side_by_side(paper)
    cuts = []
    for w in ("chain-3", "dag-4", "dag-10-wide", "metagpt-tl-paper"):
        row = ours[w]
        mean, p99 = (row[i].split(" ± ")[0].lstrip("+") for i in (2, 5))
        cuts.append(f"{mean} / {p99}%")
        assert f"{row[1]} / {row[4]}" in text, w  # the paper's own
    assert (
        f"are {cuts[0]} on Chain-3, {cuts[1]} on DAG-4, {cuts[2]} on DAG-10-Wide and "
        f"{cuts[3]} on MetaGPT-TL-paper" in text
    )
    fresh_tally = " / ".join(_tally(summary("replication/paper_seeds30")))
    assert f"(on fresh seeds 30-39: {fresh_tally}," in text
    sop = ours["metagpt-sop-paper"]
    assert f"its mean is {-float(sop[3]):.0f}% and its p99 {-float(sop[6]):.0f}% above" in text
    assert "{} wins, {} ties, {} losses".format(*_tally(paper)) in text
    topas = specs(summary("compare"))["topas"]
    assert f"{topas[1]}% mean / {topas[3]}% p99 averaged (seeds 20-24)" in text
    assert f"at {worse_of(topas)} of 40 points" in text
    fresh = [
        f"{worse_of(specs(summary(f'replication/{folder}'))['topas'])} of 40 on seeds {seeds}"
        for folder, seeds in (("compare_seeds40", "40-44"), ("compare_seeds50", "50-59"))
    ]
    assert f"({fresh[0]}, {fresh[1]})" in text
    greedy = [
        worse_of(specs(summary(f"replication/{folder}"))["topas-greedy"])
        for folder in ("compare_seeds40", "compare_seeds50")
    ]
    assert f"best baseline at as many points or fewer ({greedy[0]} and none)" in text
    assert greedy[1] == 0
    cells = [ln.strip("| ").split(" | ") for ln in by_size_rows()[:5]]  # today's five
    smallest = [float(c[2]) for c in cells]
    largest = [1 / float(c[4]) for c in cells]
    assert f"finishes {min(smallest):.1f}-{max(smallest):.1f}x sooner" in text
    assert f"quarter {min(largest):.1f}-{max(largest):.1f}x later" in text
    gap = {r[0].strip("`"): r for r in table(summary("gap"), "| policy | n | mean gap %")}
    assert f"{gap['topas'][2]}% mean gap, {gap['topas'][4]}% max" in text
    rollout = gap["topas-rollout"]
    assert f"simulating what follows, {rollout[2]}% and {rollout[4]}%" in text
    runs = json.loads((DOCS / "results" / "bench_decision" / "runs.json").read_text())["runs"]
    (bench,) = [r for r in runs if (r["policy"], r["agents"], r["waiting"]) == ("topas", 64, 1000)]
    assert f"{bench['p50_ms']:.2f} ms p50 and {bench['p99_ms']:.2f} ms p99" in text  # as the
    # table of "Decision time" (rounded once, from the runs, not from the summary's 3 places)


def test_decision_time_table_matches_its_runs(topas_md: str) -> None:
    """The table of "Decision time", every cell read again from the committed bench's
    runs.json (ms: TOPAS to two decimals, `lpm` to three)."""
    runs = json.loads((DOCS / "results" / "bench_decision" / "runs.json").read_text())["runs"]
    text = section(topas_md, "### Decision time", until="\nTargets (issue 11)")
    lines = [ln.replace("**", "") for ln in text.splitlines() if re.match(r"\| (8|64) \| ", ln)]
    assert len(lines) == 8
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        agents, waiting = int(cells[0]), int(cells[1].replace(",", ""))
        by = {r["policy"]: r for r in runs if (r["agents"], r["waiting"]) == (agents, waiting)}
        topas, lpm = by["topas"], by["lpm"]
        assert cells[2] == f"{topas['p50_ms']:.2f} / {topas['p99_ms']:.2f}", line
        assert cells[3] == f"{topas['mean_evaluated']:.1f}, {topas['max_evaluated']}", line
        assert cells[4].split(" (")[0] == f"{lpm['p50_ms']:.3f} / {lpm['p99_ms']:.3f}", line


BEFORE = "topas:fill=search,stall=0"  # `topas` before the defaults of 2026-12-07
BEFORE_NOW = "topas:fill=search,stall=0,drain_load=0,token_floor=0"
"""BEFORE's name in the replications re-written on 2026-12-07 for ``drain_load`` and then
for ``token_floor`` (the same runs)."""
DRAIN_LOAD_0 = "topas:drain_load=0,token_floor=0"  # `topas` before `drain_load`
HOLD = "topas:token_floor=0"  # `topas` before `token_floor` (with the hold of a waiting load)
RENAMED = {"topas": DRAIN_LOAD_0, BEFORE: BEFORE_NOW}
"""The names that the specs of studies run before ``drain_load`` became a default have in
the replications re-written for it and for ``token_floor`` (``topas`` then is
``topas:drain_load=0,token_floor=0`` now)."""


def search_against_scorer(
    folder: str, spec: str = "topas", other: str = "topas-greedy", regime_map: bool = True
) -> tuple[int, int, float]:
    """``spec`` against ``other`` over a study's points, paired per seed: the (point,
    metric) cells worse and better beyond the CI, and the mean JCT change averaged.
    ``regime_map=False`` leaves out a ``reproduce_paper.py`` study's regime-map runs
    (``default_budget_rows``), which share a workload and loads with its comparison."""
    ex = load_analysis("compare_policies").ex
    cfg, rows = study_runs(folder) if regime_map else default_budget_rows(folder)
    worse = better = 0
    means = []
    for w in cfg["workloads"]:
        for load in cfg["loads"]:
            point = [r for r in rows if r["workload"] == w and r["load"] == load]
            for m in METRICS2:
                c, h = ex.paired_change(point, {"policy": spec}, {"policy": other}, m)
                worse += ex.worse_beyond_ci(c, h)
                better += ex.worse_beyond_ci(-c, h)
                if m == "mean_jct":
                    means.append(c)
    return worse, better, sum(means) / len(means)


def test_third_replication_set_matches_its_runs(topas_md: str) -> None:
    """The ten-seed replication of today's five: the tally of each spec against the best
    registered baseline, and each `topas` against `topas-greedy` and the others, recomputed
    from its runs."""
    folder = "replication/compare_seeds50"
    text = " ".join(
        section(topas_md, "- **A third set, ten seeds", until="\n- **`topas-rollout`").split()
    )
    names = ("topas", "topas-greedy", HOLD, DRAIN_LOAD_0, BEFORE_NOW)
    topas, greedy, hold, prev, before = (averaged_changes(folder, s) for s in names)
    worse = (topas["worse"], greedy["worse"], hold["worse"], prev["worse"], before["worse"])
    assert worse == (0, 0, 1, 2, 6)
    assert (
        "the hold of a waiting load and `token_floor=1` among them): "
        f"{topas['mean']:+.1f}% mean / {topas['p99']:+.1f}% p99 against the best baseline "
        "averaged over the 20 points, worse beyond the CI at none of 40" in text
    )
    assert f"(`{HOLD}`) {hold['mean']:+.1f}% / {hold['p99']:+.1f}%, worse at 1" in text
    assert search_against_scorer(folder, "topas", HOLD)[:2] == (1, 1)
    assert "better beyond the CI at 1 cell (that mean, -2.1 ± 1.5%) and worse at 1" in text
    assert f"`topas-greedy`: {greedy['mean']:+.1f}% / {greedy['p99']:+.1f}%, worse at none" in text
    assert f"(`{DRAIN_LOAD_0}`): {prev['mean']:+.1f}% / {prev['p99']:+.1f}%, worse at 2" in text
    assert (
        f"`{BEFORE_NOW}`): {before['mean']:+.1f}% / {before['p99']:+.1f}%, worse at 6 of 40" in text
    )
    assert search_against_scorer(folder)[:2] == (0, 3)
    assert search_against_scorer(folder, HOLD)[:2] == (1, 3)
    assert "paired against it `topas` is better beyond the CI at 3 cells" in text
    assert "better at 3, worse at 1, MetaGPT-TL's mean at 1.2, +2.3 ± 1.2%" in text
    assert search_against_scorer(folder, DRAIN_LOAD_0)[:2] == (0, 2)
    assert search_against_scorer(folder, BEFORE_NOW)[:2] == (8, 0)
    assert "worse beyond the CI at 8 cells" in text
    assert search_against_scorer(folder, DRAIN_LOAD_0, BEFORE_NOW)[:2] == (0, 17)
    assert "ahead of it beyond the CI at 17 of the 40 cells, behind at none" in text


ROLLOUT50 = "replication/rollout_seeds50_12"


def rollout50_rows() -> list[str]:
    """The table lines of the ten-seed rollout check at load 1.2: per workload, each
    TOPAS spec's change against the best registered baseline (mean / p99, bold where worse
    beyond the CI)."""
    cfg, rows = study_runs(ROLLOUT50)
    lines = []
    for workload in cfg["workloads"]:
        point = [r for r in rows if r["workload"] == workload]
        cells = [workload]
        cells += [
            against_registered(point, cfg, s) for s in ("topas", "topas-greedy", "topas-rollout")
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def test_rollout_seeds50_table_matches_its_runs(topas_md: str) -> None:
    """The ten-seed rollout table, every cell recomputed, and its runs of the baselines,
    `topas` and `topas-greedy` equal, run by run, to the ten-seed replication's at 1.2
    (whose `topas` of then is its `topas:drain_load=0,token_floor=0`)."""
    text = section(topas_md, "- **`topas-rollout` on the ten seeds at load 1.2**", until="\n- **")
    start = text.index("| workload | `topas` | `topas-greedy` | `topas-rollout` |")
    lines = [ln.strip() for ln in text[start:].splitlines()[2:7]]
    assert lines == rollout50_rows()
    from topas.policies import BASELINES

    # its runs of the baselines, `topas-greedy` and `topas` (now DRAIN_LOAD_0) are
    # the ten-seed replication's at 1.2
    for name in (*BASELINES, "topas-greedy", "topas"):
        as_ = RENAMED.get(name, name)
        assert renamed_runs(ROLLOUT50, name, "replication/compare_seeds50", as_) == 50, name


SHADOW_SPECS = ("topas", "topas:drain=0", "topas-greedy")


def shadow_rows() -> list[str]:
    """The table lines of "Where the search and the single-pass scorer part", recomputed
    from the shadow study's runs.csv (each figure a mean over the seeds)."""
    sd = load_analysis("shadow_decisions")
    cfg, rows = study_runs("tuning_shadow_12")
    assert cfg["shadow"] == "topas-greedy" and cfg["loads"] == [1.2] and cfg["tuning"]
    lines = []
    for w in cfg["workloads"]:

        def m(spec: str, key: str, w=w) -> float:
            return sd.ex.mean_of(sd.ex.select(rows, workload=w, load=1.2, policy=spec), key)

        cells = [w, " / ".join(sd.ex.fmt_s(m(p, "mean_jct")) for p in SHADOW_SPECS)]
        for p in SHADOW_SPECS[:2]:
            cells.append(f"{100 * m(p, 'agree') / m(p, 'decisions'):.0f}%")
            cells.append(f"{m(p, 'shadow_held'):.0f} / {m(p, 'shadow_ranked'):.0f}")
            cells.append(f"{m(p, 'policy_only_left_s'):.1f} / {m(p, 'shadow_only_left_s'):.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def test_shadow_table_matches_its_runs(topas_md: str) -> None:
    """Every cell of the shadow-decisions table recomputed; `topas-greedy` shadowed by
    itself agrees at every decision in every run."""
    text = section(topas_md, "**Where the search and the single-pass scorer part**", "\n- **")
    start = text.index("| workload | mean JCT (s): `topas` / `topas:drain=0`")
    lines = [ln.strip() for ln in text[start:].splitlines()[2:7]]
    assert lines == shadow_rows()
    _, rows = study_runs("tuning_shadow_12")
    self_runs = [r for r in rows if r["policy"] == "topas-greedy"]
    assert len(self_runs) == 50 and all(r["agree"] == r["decisions"] for r in self_runs)


FILL = "topas:fill=greedy"


def changes_vs_topas(folder: str, spec: str) -> list[tuple[str, float, str, float, float]]:
    """``spec``'s paired change against `topas` at every (workload, load, metric) of a
    committed study, by compare_policies' comparison with `topas` as the only baseline:
    (workload, load, metric, change %, CI half-width), in the study's order."""
    cp = load_analysis("compare_policies")
    cfg, rows = study_runs(folder)
    out = []
    for workload in cfg["workloads"]:
        for load in cfg["loads"]:
            point = [r for r in rows if r["workload"] == workload and r["load"] == load]
            for m in METRICS2:
                c = cp.compare_point(point, {**cfg, "baselines": ["topas"], "proposed": spec}, m)
                out.append((workload, load, m, c["change"], c["half"]))
    return out


def fill_rows(folder: str) -> list[str]:
    """The lines of a `fill=greedy` table: per workload and load, :func:`changes_vs_topas`'
    mean / p99 cells, bold where worse beyond the CI."""
    ex = load_analysis("compare_policies").ex
    cells: dict[str, list[str]] = {}
    for workload, _, _, change, half in changes_vs_topas(folder, FILL):
        cell = ex.fmt_change(change, half)
        cells.setdefault(workload, []).append(
            f"**{cell}**" if ex.worse_beyond_ci(change, half) else cell
        )
    return [
        "| " + " | ".join([w, *(" / ".join(c[i : i + 2]) for i in range(0, len(c), 2))]) + " |"
        for w, c in cells.items()
    ]


def fill_bullet(topas_md: str) -> str:
    """The `fill=greedy` bullet of docs/topas.md."""
    return section(topas_md, "- **Filling `R'` with the single pass", until="\n- **")


def test_fill_tables_match_their_runs(topas_md: str) -> None:
    """The `fill=greedy` bullet: both tables recomputed, the averages against the best
    registered baseline quoted for the three specs, and the runs of `topas`, `topas-greedy`
    and the baselines equal, run by run, to earlier studies' (so the switch leaves the
    default as it was)."""
    text = fill_bullet(topas_md)
    dedented = "\n".join(line.removeprefix("  ") for line in text.splitlines())
    for folder, header in (
        ("tuning_fill_paper", "| paper's five | 1.0 |"),
        ("tuning_fill_today", "| today's five | 0.5 |"),
    ):
        start = dedented.index(header)
        lines = dedented[start:].splitlines()[2:7]
        assert [ln.strip() for ln in lines] == fill_rows(folder), folder
    flat = " ".join(text.split())
    for folder in ("tuning_fill_paper", "tuning_fill_today"):
        for spec in ("topas", FILL, "topas-greedy"):
            a = averaged_changes(folder, spec)
            quoted = f"`{spec}` {a['mean']:+.1f} / {a['p99']:+.1f}% ({a['worse']} worse)"
            assert quoted in flat, (folder, quoted)
    assert shared_runs("tuning_fill_today", "tuning_shadow_12") == 3 * 5 * 10  # with spf
    assert shared_runs("tuning_fill_paper", "tuning_drain_paper") == 9 * 5 * 3 * 5


def test_fill_gap_and_speed_figures_match_their_summaries(topas_md: str) -> None:
    """The mean / max gaps the `fill=greedy` bullet quotes, per tuning study and spec, and
    its decision times."""
    text = " ".join(fill_bullet(topas_md).split())
    bench = (DOCS / "results" / "bench_decision_fill" / "summary.md").read_text()
    times = {(r[0].strip("`"), r[2]): r for r in table(bench, "| policy | agents | waiting |")}
    fill, base = (
        (times[FILL, "1000"], times[FILL, "10000"]),
        (times["topas", "1000"], times["topas", "10000"]),
    )
    assert f"p50 {float(fill[0][3]):.2f} ms (p99 {float(fill[0][4]):.2f}) at 1,000" in text
    assert f"and {float(fill[1][3]):.2f} ms at 10,000" in text
    p50, p99, far = float(base[0][3]), float(base[0][4]), float(base[1][3])
    assert f"`topas`'s {p50:.2f} ({p99:.2f}) and {far:.2f} ms" in text
    quoted = {}
    for spec, label in (
        ("topas", "`topas`"),
        (FILL, "`fill=greedy`"),
        ("topas-greedy", "`topas-greedy`"),
    ):
        figures = []
        for seed in (0, 1000, 1001, 1002):
            summary = (DOCS / "results" / f"gap_tuning_fill_{seed}" / "summary.md").read_text()
            row = {r[0].strip("`"): r for r in table(summary, "| policy | n | mean gap % |")}[spec]
            figures.append(f"{row[2]} / {row[4]}")
        quoted[spec] = f"{label} " + ", ".join(figures)
        assert quoted[spec] in text, quoted[spec]


def test_fill_on_more_tuning_seeds_matches_its_runs(topas_md: str) -> None:
    """The counts and ranges quoted for `fill=greedy` on tuning seeds 1010-1019."""
    worse_beyond_ci = load_analysis("compare_policies").ex.worse_beyond_ci
    text = " ".join(fill_bullet(topas_md).split())
    today = changes_vs_topas("tuning_fill_today_1010", FILL)
    better = sum(m == "mean_jct" and ch + h < 0 for _, _, m, ch, h in today)
    worse = sum(worse_beyond_ci(ch, h) for *_, ch, h in today)
    worse_at = "none" if worse == 0 else str(worse)
    assert f"better beyond the CI at {better} of the 10 mean cells and worse at {worse_at};" in text
    paper = changes_vs_topas("tuning_fill_paper_1010", FILL)
    assert not any(worse_beyond_ci(ch, h) for *_, ch, h in paper)
    assert f"{sum(ch > 0 for *_, ch, _ in paper)} of its 20 cells are on the worse side" in text
    four = [c for c in paper if c[0] != "metagpt-sop-paper"]
    for m, label in (("mean_jct", "mean"), ("p99_jct", "p99")):
        got = [ch for _, _, mm, ch, _ in four if mm == m]
        assert f"{label} {min(got):+.1f} to {max(got):+.1f}%" in text, (m, got)


NOISE_STUDIES = ("paper_nodrain", "paper_noise_0.5", "paper_noise_1")  # sigma 0, 0.5, 1


def noise_rows(spec: str, studies: tuple[str, ...], load: float) -> list[str]:
    """The noise table's lines: per workload, ``spec``'s change against the best registered
    baseline at ``load`` in each study (:func:`against_registered`)."""
    runs = [study_runs(folder) for folder in studies]
    lines = []
    for workload in runs[0][0]["workloads"]:
        cells = [workload]
        for cfg, rows in runs:
            if workload not in cfg["workloads"]:
                continue
            point = [r for r in rows if r["workload"] == workload and r["load"] == load]
            cells.append(against_registered(point, cfg, spec))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def test_noise_table_matches_its_runs(topas_md: str) -> None:
    """The paper setting with noisy predictions: every cell recomputed from the runs, the
    averages over the points quoted, and each study told the noise it says."""
    text = section(topas_md, "#### With noisy predictions", until="\n#### ")
    start = text.index("| workload | exact")
    assert [ln.strip() for ln in text[start:].splitlines()[2:7]] == noise_rows(
        "topas", NOISE_STUDIES, 1.5
    )
    flat = " ".join(text.split())
    for folder in NOISE_STUDIES:
        a = averaged_changes(folder, "topas")
        assert f"{a['mean']:+.1f} / {a['p99']:+.1f}% ({a['worse']} worse)" in flat, folder
        cfg, rows = study_runs(folder)
        sigma = {"paper_nodrain": 0.0, "paper_noise_0.5": 0.5, "paper_noise_1": 1.0}[folder]
        assert cfg.get("prediction_error", 0.0) == sigma
        assert {float(r["prediction_error"]) for r in rows} == {sigma}
        assert cfg["seeds"] == list(range(20, 30)) and not cfg["tuning"]
    for folder in NOISE_STUDIES[1:]:
        a = averaged_changes(folder, "topas-greedy")
        assert f"{a['mean']:+.1f} / {a['p99']:+.1f}%" in flat, folder
    # the mean JCTs quoted at load 1.5, per (workload, policy), in the order of the studies
    for workload, policy, studies in (
        ("chain-3", "parrot-fcfs", NOISE_STUDIES[:2]),
        ("dag-10-wide", "lpm", NOISE_STUDIES),
        ("dag-10-wide", "topas", NOISE_STUDIES),
        ("chain-3", "topas", NOISE_STUDIES),
        ("metagpt-tl-paper", "topas", NOISE_STUDIES),
        ("metagpt-tl-paper", "lpm", NOISE_STUDIES),
    ):
        values = []
        for folder in studies:
            rows = study_runs(folder)[1]
            jcts = [
                float(r["mean_jct"])
                for r in rows
                if (r["workload"], r["load"], r["policy"]) == (workload, 1.5, policy)
            ]
            assert len(jcts) == 10
            values.append(f"{sum(jcts) / len(jcts):.1f}")
        assert re.search(r"\D+".join(map(re.escape, values)), flat), (workload, policy, values)


def test_fill_on_the_other_profile_matches_its_runs(topas_md: str) -> None:
    """`fill=greedy` with the two profiles swapped: the cells better beyond the CI counted
    and quoted, none worse, and `topas-greedy`'s cells on MetaGPT-TL-paper on the 8B
    profile."""
    ex = load_analysis("compare_policies").ex
    flat = " ".join(fill_bullet(topas_md).split())
    for folder, profile, better in (
        ("tuning_fill_today_on_32b", "qwen2.5-32b/a100-80gb", "better beyond the CI at 3 of 10"),
        ("tuning_fill_paper_on_8b", "llama-3-8b/h100", "better at 2 of 20"),
    ):
        cfg, _ = study_runs(folder)
        assert cfg["profile"] == profile and cfg["tuning"]
        changes = changes_vs_topas(folder, FILL)
        gains = [c for c in changes if c[3] + c[4] < 0]
        assert not [c for c in changes if ex.worse_beyond_ci(c[3], c[4])], folder
        assert f"{better} cells" in flat and len(changes) == int(better.split()[-1])
        assert int(better.split()[-3]) == len(gains), folder
        for _, _, _, change, half in gains:
            assert ex.fmt_change(change, half) in flat, (folder, change)
    greedy = changes_vs_topas("tuning_fill_paper_on_8b", "topas-greedy")
    for _, _, _, change, half in (c for c in greedy if c[0] == "metagpt-tl-paper"):
        assert ex.fmt_change(change, half) in flat
    wide = [c[3] for c in greedy if c[0] == "dag-10-wide" and c[2] == "mean_jct"]
    assert f"{min(wide):.0f}-{max(wide):.0f}% behind on DAG-10-Wide's mean" in flat


STALL = "topas:stall=1"


def stall_bullet(topas_md: str) -> str:
    return " ".join(section(topas_md, "**The stall switch**", until="\n\n").split())


def assert_better_nowhere_worse(folder: str, spec: str, quoted: str, text: str) -> None:
    """``spec`` against `topas` in a committed study (:func:`changes_vs_topas`): worse
    beyond the CI at no cell, and ``quoted``, found in ``text``, counts the cells where it
    is better ("N of [the] M cells")."""
    ex = load_analysis("compare_policies").ex
    changes = changes_vs_topas(folder, spec)
    better = [c for c in changes if c[3] + c[4] < 0]
    assert not [c for c in changes if ex.worse_beyond_ci(c[3], c[4])], folder
    assert quoted in text, folder
    assert re.search(rf"\b{len(better)} of (the )?{len(changes)} cells", quoted), folder


def test_stall_figures_match_their_runs(topas_md: str) -> None:
    """The stall switch's paired cells against `topas` counted, its averages against the
    best registered baseline (with the baselines of the study on the same seeds, whose
    `topas` runs are the same) quoted for the three specs, on tuning and reporting seeds."""
    ex = load_analysis("compare_policies").ex
    text = stall_bullet(topas_md)
    for folder, quoted in (
        ("tuning_stall_today", "better beyond the CI at 8 of the 40 cells"),
        ("tuning_stall_today_1010", "better at 2 of the 20 cells"),
        ("replication/stall_seeds50", "better than `topas` at 7 of 40 cells"),
        ("replication/stall_seeds40", "better than `topas` at 4 of 40 cells"),
        ("replication/stall_seeds20", "better than `topas` at 5 of 40 cells"),
    ):
        assert_better_nowhere_worse(folder, STALL, quoted, text)
    tl = {
        c[2]: c
        for c in changes_vs_topas("tuning_stall_today", STALL)
        if c[:2] == ("metagpt-tl", 1.2)
    }
    greedy = {
        c[2]: c
        for c in changes_vs_topas("tuning_fill_today", "topas-greedy")
        if c[:2] == ("metagpt-tl", 1.2)
    }
    assert f"({ex.fmt_change(*tl['mean_jct'][3:])}%, against" in text
    assert f"`topas-greedy`'s {ex.fmt_change(*greedy['mean_jct'][3:])}%)" in text
    # the stall studies ran before the defaults of 2026-12-07: their `topas` is BEFORE,
    # which the re-written replication studies of the same seeds hold as BEFORE_NOW
    for folder, baselines, before in (
        ("tuning_stall_today", "tuning_fill_today", "topas"),
        ("replication/stall_seeds50", "replication/compare_seeds50", BEFORE_NOW),
    ):
        assert renamed_runs(folder, "topas", baselines, before) == 200
        cfg, rows = study_runs(baselines)
        if before != "topas":
            rows = [r for r in rows if r["policy"] != "topas"]
            rows = [{**r, "policy": "topas"} if r["policy"] == before else r for r in rows]
        rows += [r for r in study_runs(folder)[1] if r["policy"] == STALL]
        for spec in (STALL, "topas", "topas-greedy"):
            a = averaged_over(cfg, rows, spec)
            assert f"{a['mean']:+.1f} / {a['p99']:+.1f}% ({a['worse']} worse" in text, spec
    # studies with their own baselines, whose other policies' runs equal those of the
    # re-run studies of the same seeds
    for folder, other, others in (
        ("replication/stall_seeds40", "replication/compare_seeds40", ("topas-greedy",)),
        ("replication/stall_seeds20", "compare", ()),
    ):
        for spec in (STALL, "topas", *others):
            a = averaged_changes(folder, spec)
            assert f"{a['mean']:+.1f} / {a['p99']:+.1f}% ({a['worse']} worse" in text, spec
        for policy in (*study_runs(other)[0]["baselines"], *others):
            assert renamed_runs(folder, policy, other, policy) > 0, (folder, policy)
    assert renamed_runs(
        "replication/stall_seeds40", "topas", "replication/compare_seeds40", BEFORE_NOW
    )


def matched_runs(mine: str, policy: str, other: str, as_: str) -> tuple[int, int]:
    """The runs of ``policy`` in committed study ``mine`` that study ``other`` also has,
    under the name ``as_`` (same workload, load and seed): how many have the same mean and
    p99 JCT in both, and how many differ."""
    runs = {
        (r["workload"], r["load"], r["seed"]): r for r in study_runs(other)[1] if r["policy"] == as_
    }
    same = differ = 0
    for r in study_runs(mine)[1]:
        theirs = runs.get((r["workload"], r["load"], r["seed"]))
        if r["policy"] == policy and theirs is not None:
            if (r["mean_jct"], r["p99_jct"]) == (theirs["mean_jct"], theirs["p99_jct"]):
                same += 1
            else:
                differ += 1
    return same, differ


def renamed_runs(mine: str, policy: str, other: str, as_: str) -> int:
    """How many runs of ``policy`` in committed study ``mine`` study ``other`` also has,
    under the name ``as_``, each asserted to have the same mean and p99 JCT in both."""
    same, differ = matched_runs(mine, policy, other, as_)
    assert differ == 0, (mine, policy, other, as_, differ)
    return same


def default_budget_rows(
    folder: str, loads: tuple[float, ...] | None = None
) -> tuple[dict, list[dict]]:
    """A paper-setting study's config (narrowed to ``loads``, by default its own) and its
    runs at those loads on the default KV budget (``reproduce_paper.py`` adds regime-map
    runs at others)."""
    from collections import Counter

    cfg, rows = study_runs(folder)
    loads = tuple(cfg["loads"]) if loads is None else loads
    kv = Counter(r["kv_capacity_tokens"] for r in rows).most_common(1)[0][0]
    rows = [r for r in rows if r["load"] in loads and r["kv_capacity_tokens"] == kv]
    return {**cfg, "loads": list(loads)}, rows


def test_rollout_under_noise_matches_its_runs(topas_md: str) -> None:
    """`topas-rollout` with noisy lengths: its paired cells against `topas` counted and
    their range, its loss on DAG-4 at 1.0, and the averages of both specs quoted."""
    ex = load_analysis("compare_policies").ex
    text = " ".join(section(topas_md, "- **`topas-rollout` loses its lead", until="\n\n").split())
    changes = changes_vs_topas("paper_noise_rollout_0.5", "topas-rollout")
    worse = [c[3] for c in changes if ex.worse_beyond_ci(c[3], c[4])]
    assert not [c for c in changes if c[3] + c[4] < 0]
    assert f"at {len(worse)} of the {len(changes)} cells, paired, by " in text
    assert f"by {min(worse):.1f} to {max(worse):.1f}%" in text
    loads = (1.0, 1.2, 1.5)
    cfg, rows = default_budget_rows("paper_noise_rollout_0.5", loads)
    assert cfg["prediction_error"] == 0.5 and cfg["seeds"] == list(range(20, 30))
    point = [r for r in rows if r["workload"] == "dag-4" and r["load"] == 1.0]
    mean, p99 = against_registered(point, cfg, "topas-rollout").replace("**", "").split(" / ")
    assert f"({mean}% mean, {p99}% p99)" in text
    for folder, spec in (
        ("paper_noise_rollout_0.5", "topas-rollout"),
        ("paper_rollout", "topas-rollout"),
        ("paper_noise_rollout_0.5", "topas"),
    ):
        a = averaged_over(*default_budget_rows(folder, loads), spec)
        assert f"{a['mean']:+.1f} / {a['p99']:+.1f}% ({a['worse']} worse)" in text, (folder, spec)


AUTO = "topas:fill=auto,stall=1"


def test_fill_auto_figures_match_their_runs(topas_md: str) -> None:
    """ "Filling by the timing mode": `fill=greedy` against `topas` with the prompts
    recomputed (cells counted, the one gain quoted), `fill=auto,stall=1` on today's five
    (cells counted on both tuning studies; its averages against the best registered
    baseline, beside the other specs', with the baselines of the `fill=greedy` study,
    whose `topas` runs are the same)."""
    ex = load_analysis("compare_policies").ex
    text = " ".join(section(topas_md, "**Filling by the timing mode", until="\n\n").split())
    recomputed = changes_vs_topas("tuning_fill_paper_recompute", FILL)
    assert study_runs("tuning_fill_paper_recompute")[0]["movement"] == "recompute"
    assert not [c for c in recomputed if ex.worse_beyond_ci(c[3], c[4])]
    (gain,) = [c for c in recomputed if c[3] + c[4] < 0]
    assert gain[:3] == ("chain-3", 1.2, "mean_jct")
    assert f"worse beyond the CI at 0 of the {len(recomputed)} cells and better at 1" in text
    assert f"mean at 1.2, {ex.fmt_change(gain[3], gain[4])}%)" in text
    for folder in ("tuning_fill_paper", "tuning_fill_paper_recompute"):  # swap, recompute
        at = {c[:3]: c[3] for c in changes_vs_topas(folder, FILL)}
        dags = ", ".join(
            f"{at[w, 1.5, 'mean_jct']:+.1f}" for w in ("chain-3", "dag-4", "dag-10-wide")
        )
        assert f"({dags}%)" in text, folder
    for folder, quoted in (
        ("tuning_auto_stall_today", "better than `topas` beyond the CI at 13 of the 40 cells"),
        ("tuning_auto_stall_today_1010", "better at 8 of the 20 cells"),
    ):
        assert_better_nowhere_worse(folder, AUTO, quoted, text)
    assert shared_runs("tuning_fill_today", "tuning_auto_stall_today", policy="topas") == 200
    assert shared_runs("tuning_fill_today", "tuning_stall_today", policy="topas") == 200
    cfg, rows = study_runs("tuning_fill_today")
    for folder, spec in (("tuning_auto_stall_today", AUTO), ("tuning_stall_today", STALL)):
        rows += [r for r in study_runs(folder)[1] if r["policy"] == spec]
    for spec in (AUTO, "topas", FILL, STALL, "topas-greedy"):
        a = averaged_over(cfg, rows, spec)
        assert f"{a['mean']:+.1f} / {a['p99']:+.1f}% ({a['worse']}" in text, spec


def assert_spec_line_is_defaults(line: str, cls: type) -> None:
    """``line``, a policy spec, names every parameter of ``cls`` once, and the policy it
    builds has ``cls``'s defaults."""
    import dataclasses

    from topas.params import split_outside
    from topas.policies import make_policy

    fields = [f.name for f in dataclasses.fields(cls) if f.init and f.name != "name"]
    _, _, params = line.partition(":")
    assert sorted(p.partition("=")[0] for p in split_outside(params, ",")) == sorted(fields)
    built, default = make_policy(line), cls()
    assert {f: getattr(built, f) for f in fields} == {f: getattr(default, f) for f in fields}


def test_parameters_line_is_topas_defaults(topas_md: str) -> None:
    """The spec line under "Parameters and defaults" names every parameter of TOPAS with
    its default (booleans as 0 / 1)."""
    from topas.policies.search import TOPAS

    line = section(topas_md, "## Parameters and defaults").split("`")[1]
    assert line.partition(":")[0] == "topas"
    assert_spec_line_is_defaults(line, TOPAS)


def test_parameters_line_is_rollout_defaults(topas_md: str) -> None:
    """The rollout's spec line (its "Parameters and defaults") is its defaults, and a spec
    that can be used as it is: its first base, with parameters, in parentheses."""
    from topas.policies.rollout import Rollout

    line = section(topas_md, "**Parameters and defaults.**").split("`")[1]
    assert line.partition(":")[0] == "topas-rollout"
    assert_spec_line_is_defaults(line, Rollout)


def test_rollout_new_base_probe_matches_its_runs(topas_md: str) -> None:
    """The rollout with the new `topas` as its base against the pinned one (no cell
    beyond the CI either way) and against `topas` (better on the mean at 2 cells)."""
    new = "topas-rollout:bases=topas+topas-greedy+lpm+parrot-fcfs"
    text = " ".join(section(topas_md, "**The defaults of 2026-12-07", until="\n\n").split())
    assert search_against_scorer("tuning_rollout_newbase", new, "topas-rollout")[:2] == (0, 0)
    assert search_against_scorer("tuning_rollout_newbase", new, "topas")[:2] == (0, 2)
    assert "within the CI of the pinned rollout at all 6 cells" in text
    assert "the new base beyond the CI on chain and mixed" in text


def drain_load_text(topas_md: str) -> str:
    return " ".join(
        section(topas_md, "**Loading into drained memory", until="\n**The stall switch").split()
    )


def test_drain_load_tuning_figures_match_their_runs(topas_md: str) -> None:
    """The switch's tuning figures: its average and cells worse against the best baseline
    (the paper's five and today's), paired against `topas`, and the four gap studies."""
    text = drain_load_text(topas_md)
    paper = specs(summary("tuning_drain_load_paper"))
    assert paper["topas"][1:] == ["-6.8", "3/15", "-11.9", "2/15"]
    assert paper["topas:drain_load=1"][1:] == ["-9.2", "3/15", "-15.7", "3/15"]
    assert "-6.8 / -11.9% (mean / p99) for `topas` and **-9.2 / -15.7%**" in text
    assert search_against_scorer("tuning_drain_load_paper", SWITCH, "topas")[:2] == (0, 11)
    assert "better beyond the CI at 11 of the 30 cells and worse at none" in text
    today = specs(summary("tuning_drain_load_today"))
    assert today["topas"][1:] == ["+0.8", "0/15", "-2.0", "0/15"]
    assert today[SWITCH][1:] == ["+1.0", "0/15", "-2.6", "0/15"]
    assert search_against_scorer("tuning_drain_load_today", SWITCH, "topas")[:2] == (0, 1)
    for seed, before, after in (
        (1000, (2.4, 18.6), (2.7, 23.8)),
        (0, (3.7, 25.3), (3.6, 25.3)),
        (1001, (2.8, 27.4), (2.8, 27.4)),
        (1002, (3.3, 26.4), (3.5, 26.4)),
    ):
        assert gap_mean_max(f"gap_tuning_drain_load_{seed}") == {"topas": before, SWITCH: after}


SWITCH = "topas:drain_load=1"


def gap_mean_max(folder: str) -> dict[str, tuple[float, float]]:
    """Mean and max gap (%) by policy, from a gap study's summary."""
    rows = table(summary(folder), "| policy | n | mean gap %")
    return {r[0].strip("`"): (float(r[2]), float(r[4])) for r in rows}


def test_drain_load_reporting_figures_match_their_runs(topas_md: str) -> None:
    """The switch on reporting seeds: the paper's setting (tallies, peaks, paired against
    `topas`, whose runs are the reported studies'), the gap and today's five."""
    text = drain_load_text(topas_md)
    for folder, reported, tally, better, quoted, changed in (
        (
            "paper_drain_load",
            "paper",
            ("30", "12", "8"),
            18,
            (
                "**30 wins, 12 ties, 8 losses**",
                "better beyond the CI at 18 of the 50 cells, worse at none",
            ),
            (38, 212),
        ),
        (
            "replication/paper_drain_load_30",
            "replication/paper_seeds30",
            ("28", "14", "8"),
            17,
            ("**28 / 14 / 8**", "better at 17 of 50 cells, worse at none"),
            (37, 213),
        ),
    ):
        assert _tally(summary(folder)) == tally
        assert search_against_scorer(folder, SWITCH, "topas", regime_map=False)[:2] == (0, better)
        assert all(q in text for q in quoted), quoted
        # the switch's runs were the reported `topas` until `token_floor` (a host swap:
        # only the regime map's recompute runs changed with the hold of a waiting load),
        # which changed most of them
        assert matched_default_runs(folder, SWITCH, reported, "topas") == changed
        losses = [r for r in _loss_rows(summary(folder))]
        assert losses and all(w == "metagpt-sop-paper" for w in losses)
        peaks = side_by_side(summary(folder))
        for w, row in peaks.items():
            if w != "metagpt-sop-paper":
                pair = f"{numbers(row[2])[0]:+.1f} / {numbers(row[5])[0]:+.1f}%"
                assert pair in text, (folder, w, pair)
    for seed, before, after in ((1, (1.9, 12.4), (2.0, 12.4)), (2, (2.9, 20.2), (3.0, 20.2))):
        assert gap_mean_max(f"replication/gap_drain_load_{seed}") == {
            "topas": before,
            SWITCH: after,
        }
    # the reported gap studies, re-run with the switch as the default, have its figures
    assert gap_mean_max("gap")["topas"] == gap_mean_max("replication/gap_drain_load_1")[SWITCH]
    assert (
        gap_mean_max("replication/gap_seed2")["topas"]
        == gap_mean_max("replication/gap_drain_load_2")[SWITCH]
    )
    for folder, topas, switch in (
        ("replication/drain_load_seeds20", "-0.6/0/-1.8/0", "-0.7/0/-1.6/0"),
        ("replication/drain_load_seeds40", "+1.9/2/-1.3/1", "+2.0/1/-1.8/1"),
        ("replication/drain_load_seeds50", "+0.1/1/-0.9/1", "+0.3/0/-1.3/1"),
        ("paper_noise_drain_load_0.5", "-3.7/3/-6.0/3", "-4.6/3/-8.3/3"),
    ):
        rows = specs(summary(folder))
        for spec, want in (("topas", topas), (SWITCH, switch)):
            got = rows[spec][1:]
            assert "/".join((got[0], got[1].split("/")[0], got[2], got[3].split("/")[0])) == want
    assert search_against_scorer("replication/drain_load_seeds50", SWITCH, "topas")[:2] == (0, 0)
    assert search_against_scorer("replication/drain_load_seeds20", SWITCH, "topas")[:2] == (1, 0)
    assert search_against_scorer("replication/drain_load_seeds40", SWITCH, "topas")[:2] == (0, 0)
    assert search_against_scorer("paper_noise_drain_load_0.5", SWITCH, "topas")[:2] == (1, 9)
    # its baselines' runs are the noise study's (whose `topas` was re-run with the
    # defaults of 2026-12-07, `token_floor` among them)
    from topas.policies import BASELINES

    shared = [
        shared_runs("paper_noise_drain_load_0.5", "paper_noise_0.5", policy=p) for p in BASELINES
    ]
    assert shared == [5 * 3 * 10] * len(BASELINES)
    # the switch's runs were the reported `topas` until a waiting load held the kept
    # agents' stages, which changed most of them (a recompute: the pass no longer fills
    # the memory kept for the load); that `topas` is HOLD since `token_floor`. Every other
    # spec's runs are the same runs, renamed
    for mine, other, changed in (
        ("replication/drain_load_seeds20", "compare", (18, 82)),
        ("replication/drain_load_seeds40", "replication/compare_seeds40", (15, 85)),
        ("replication/drain_load_seeds50", "replication/compare_seeds50", (43, 157)),
    ):
        assert matched_runs(mine, SWITCH, other, HOLD) == changed
        if other != "compare":
            n = sum(changed)
            assert renamed_runs(mine, "topas", other, DRAIN_LOAD_0) == n
            assert renamed_runs(mine, "topas-greedy", other, "topas-greedy") == n


def _loss_rows(summary_text: str) -> list[str]:
    """The workloads of a ``reproduce_paper.py`` summary's per-workload rows marked a
    loss (one entry per loss)."""
    out = []
    for part in summary_text.split("\n## ")[1:]:
        name = part.split("\n", 1)[0].strip()
        out += [name] * part.count("(**loss**)")
    return out


def matched_default_runs(mine: str, policy: str, other: str, as_: str) -> tuple[int, int]:
    """:func:`matched_runs` over two ``reproduce_paper.py`` studies' runs on the default
    budget (:func:`default_budget_rows`: their regime maps share workloads, loads and
    seeds with other budgets)."""
    runs = {
        (r["workload"], r["load"], r["seed"]): r
        for r in default_budget_rows(other)[1]
        if r["policy"] == as_
    }
    same = differ = 0
    for r in default_budget_rows(mine)[1]:
        if r["policy"] == policy:
            theirs = runs[(r["workload"], r["load"], r["seed"])]
            equal = (r["mean_jct"], r["p99_jct"]) == (theirs["mean_jct"], theirs["p99_jct"])
            same, differ = same + equal, differ + (not equal)
    return same, differ


WORKLOADS_PAPER = ("chain-3", "dag-4", "dag-10-wide", "metagpt-sop-paper", "metagpt-tl-paper")


def test_sglang_loop_figures_match_their_runs(topas_md: str) -> None:
    """The paper's five through SGLang's own scheduler objects ("Loading into drained
    memory"): `topas` and the `topas` of before `token_floor` paired against each other,
    `topas:drain_load=0`, SGLang as it ships and the plugin's default, recomputed from the
    committed runs."""
    import csv

    ex = load_analysis("compare_policies").ex
    path = DOCS / "results" / "sglang_in_the_loop_paper" / "runs.csv"
    with path.open(newline="") as f:
        rows = [{**r, "mean_jct": float(r["mean_jct"])} for r in csv.DictReader(f)]
    text = drain_load_text(topas_md)

    def change(workload: str, mine: str, other: str) -> str:
        point = [r for r in rows if r["workload"] == workload]
        paired = ex.paired_change(point, {"policy": mine}, {"policy": other}, "mean_jct")
        return ex.fmt_change(*paired)

    tl, search, plain = "metagpt-tl-paper", "plugin:topas", "plugin:topas:drain_load=0"
    hold = "plugin:topas:token_floor=0"  # the `topas` of before `token_floor`
    assert f"(`lru`, {change(tl, hold, 'lru')}%)" in text
    assert f"`topas-greedy` ({change(tl, hold, 'topas')}%, beyond the CI)" in text
    assert f"by {change(tl, search, hold)}% on the mean" in text
    assert f"on Chain-3's mean by {change('chain-3', search, hold)}%" in text
    means = [change(w, search, "topas").split(" ± ")[0] for w in WORKLOADS_PAPER]
    assert "mean ({}, {}, {}, {} and {}% on".format(*means) in text
    assert f"is behind ({change('dag-10-wide', search, plain)}%)" in text
    lru = " / ".join(change(w, search, "lru").split(" ± ")[0] for w in WORKLOADS_PAPER)
    assert f"against `lru` {lru}% on the mean" in text
    assert f"behind it by {change('dag-10-wide', 'topas', 'lru')}% on DAG-10-Wide" in text


def test_audit_figures_match_its_runs(topas_md: str) -> None:
    """The counts of "Checked by machine" recomputed from the committed audit's runs."""
    from topas.policies import BASELINES

    _, rows = study_runs("audit")
    moved = [r for r in rows if r["same"] == "false"]
    studies = {r["study"] for r in rows}
    stale = {r["study"] for r in moved}
    pairs = {(r["study"], r["spec"]) for r in moved}
    unpinned = {(r["study"], r["spec"]) for r in moved if not r["reproduces_as"]}
    baselines = [r for r in moved if r["spec"] in BASELINES]
    assert all(r["movement"] == "recompute" for r in baselines)
    text = " ".join(section(topas_md, "**Checked by machine").split())
    assert f"Of {len(rows):,} runs of {len(studies)} studies, {len(moved)} moved, in " in text
    assert f"moved, in {len(stale)} studies:" in text
    assert f"- {len(studies - stale)} studies reproduce in full" in text
    assert f"Every sampled baseline run reproduces but {len(baselines)}, all" in text
    assert f"Of the {len(pairs)} (study, spec) pairs that moved, {len(pairs - unpinned)} " in text
    assert f"- {len(unpinned)} reproduce under none of the three" in text


def test_audit_rollout_figures_match_its_runs(topas_md: str) -> None:
    """ "both `topas-rollout` runs reproduce ... the one run that moved": the rollout
    audit's committed runs."""
    _, rows = study_runs("audit_rollout")
    rollout = [r for r in rows if r["spec"] == "topas-rollout"]
    moved = [r for r in rows if r["same"] == "false"]
    assert len(rollout) == 2 and all(r["same"] == "true" for r in rollout)
    assert [(r["study"], r["spec"], r["movement"]) for r in moved] == [
        ("paper_rollout", "topas", "recompute")
    ]
    text = " ".join(section(topas_md, "**Checked by machine").split())
    assert "both `topas-rollout` runs reproduce (Chain-3, seed 25; fanout, seed 21)" in text
    assert {(r["workload"], r["seed"]) for r in rollout} == {("chain-3", "25"), ("fanout", "21")}
