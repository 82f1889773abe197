"""Tests of analysis/reproduce_paper.py: the quick version end to end (part of `make test`),
its analysis on hand-made rows, and its bad-input handling."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import load_analysis

from topas.instance import HostLoad, RecomputeLoad

ROOT = Path(__file__).resolve().parents[1]
ANALYSIS = ROOT / "analysis"


rp = load_analysis("reproduce_paper")


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ANALYSIS / "reproduce_paper.py"), *args, "--no-progress"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def test_quick_version_runs_every_part_within_a_minute(tmp_path: Path) -> None:
    out = tmp_path / "paper"
    start = time.perf_counter()
    done = _script("--quick", "--jobs", "2", "--out", str(out))
    wall = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    assert wall < 90  # the budget is 60 s on 2 cores; leave room for a noisy CI
    files = {p.name for p in out.iterdir()}
    assert files == {"config.json", "runs.csv", "summary.md", "regime_map.png", "cuts.png"}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quick"] is True and cfg["profile"] == rp.PROFILE
    assert cfg["seed_split"]["tuning"].startswith(">= 1000")
    assert all(20 <= s < 1000 for s in cfg["seeds"] + cfg["map_seeds"])
    with (out / "runs.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    policies = {r["policy"] for r in rows}
    # every registered baseline, the paper's three included, and both TOPAS variants
    for name in ("fcfs", "lpm", "spf", "parrot-fcfs", "las", "topas", "topas:reuse=0,aging=0"):
        assert name in policies
    assert {r["workload"] for r in rows} == set(rp.WORKLOADS)
    assert {r["movement"] for r in rows} == {"", "swap", "recompute"}
    summary = (out / "summary.md").read_text()
    assert summary == done.stdout
    for w in rp.WORKLOADS:
        assert f"## {w}" in summary
    assert "Side by side with the paper" in summary and "Regime map" in summary
    assert "wins" in summary and "losses" in summary
    assert (out / "regime_map.png").read_bytes()[:4] == b"\x89PNG"


def _row(policy: str, seed: int, mean: float, p99: float, load: float = 1.0) -> dict:
    return {
        "workload": "dag-4",
        "load": load,
        "seed": seed,
        "policy": policy,
        "mean_jct": mean,
        "p99_jct": p99,
    }


def test_cut_against_the_best_baseline_by_hand() -> None:
    # lpm means 100 (p99 200), fcfs means 110 (p99 150): the best baseline is lpm for the
    # mean and fcfs for the p99. TOPAS: 80 and 90 on the two seeds -> mean-JCT ratios to
    # lpm 0.8 and 0.9 -> cut +15%; p99 120 both seeds vs fcfs 150 -> cut +20%, CI 0.
    cfg = {"baselines": ["fcfs", "lpm"], "proposed": "topas"}
    rows = [
        _row("lpm", 0, 100, 200),
        _row("lpm", 1, 100, 200),
        _row("fcfs", 0, 110, 150),
        _row("fcfs", 1, 110, 150),
        _row("topas", 0, 80, 120),
        _row("topas", 1, 90, 120),
    ]
    mean = rp.cut_point(rows, cfg, "mean_jct")
    assert mean["other"] == "lpm" and mean["cut"] == pytest.approx(15.0)
    p99 = rp.cut_point(rows, cfg, "p99_jct")
    assert p99["other"] == "fcfs" and p99["cut"] == pytest.approx(20.0)
    assert p99["half"] == pytest.approx(0.0)
    assert rp.verdict(p99["cut"], p99["half"]) == "win"
    assert rp.verdict(-5.0, 1.0) == "**loss**"
    assert rp.verdict(2.0, 3.0) == "tie"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--seeds", "1000,1001"), "tuning seeds"),
        (("--seeds", "0,1"), "tuning seeds"),
        (("--map-seeds", "0"), "--map-seeds: empty seed list"),
        (("--map-seeds", "1000,"), "--map-seeds: 1000 are tuning seeds"),
        (("--profile", "nope"), "unknown profile 'nope'"),
        (("--workloads", "nope"), "unknown workload 'nope'"),
        (("--policies", "lpm"), "must include 'topas'"),
        (("--proposed", "lpm"), "not a TOPAS variant"),
        # a rollout has no reuse and aging switches of its own: its TOPAS-base is named
        (
            ("--policies", "fcfs,topas-rollout", "--proposed", "topas-rollout"),
            "--topas-base (name one with --topas-base): bad policy spec "
            "'topas-rollout:reuse=0,aging=0'",
        ),
        (("--topas-base", "topas:nope=1"), "--topas-base: bad policy spec 'topas:nope=1'"),
        # a parameter out of range is refused as the spec is read, before any run
        (
            ("--policies", "fcfs,topas,topas:search=best"),
            "--policies: bad policy spec 'topas:search=best': search: unknown mode 'best'",
        ),
        (
            ("--policies", "fcfs,topas,guarded_spf:GuardedSPF:guard=-1"),
            "guard: must be >= 0 seconds, got -1.0",
        ),
        (("--ratios", "0.5,1.2"), "--ratios"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path: Path, args, message) -> None:
    out = tmp_path / "never"
    done = _script(*args, "--out", str(out))
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and message in done.stderr
    assert done.stderr.count("\n") == 1
    assert not out.exists()


def test_topas_base_is_the_proposed_family_without_reuse_and_aging_unless_named() -> None:
    assert rp.topas_base("topas", None) == "topas:reuse=0,aging=0"
    assert rp.topas_base("topas-greedy:horizon=2", None) == "topas-greedy:reuse=0,aging=0"
    assert rp.topas_base("topas-rollout", "topas-base") == "topas-base"
    with pytest.raises(rp.ex.CliError, match="--topas-base"):
        rp.topas_base("topas-rollout", None)


def test_the_regime_maps_two_movements_run_the_same_tasks_and_arrivals() -> None:
    """The recompute half of the map is the swap half's instance with its prompts moved
    by recompute: the same tasks and arrivals at each (budget, load, seed), those of the
    profile's own movement (swap) at that load. Drawn at the recompute's own load factor,
    which charges each task its prompts, the arrivals would be sparser: the map's
    semantics since 2026-12-07 (commit 8d31ac2), whose recompute cells before that ran
    at those sparser arrivals (docs/topas.md, "The regime map's two halves")."""
    args = rp.build_parser().parse_args(["--quick", "--loads", "1.0,1.5", "--ratios", "0.2,0.5"])
    cfg = rp.config_from_args(args)
    instances: dict[tuple, dict[str, object]] = {}
    for job in rp.map_jobs(cfg):
        if job["spec"] != cfg["policies"][0]:
            continue  # the instance does not depend on the policy
        kwargs = {k: v for k, v in job.items() if k not in ("workload", "load", "seed", "spec")}
        num_tasks, movement = kwargs.pop("num_tasks"), kwargs["movement"]
        inst = rp.ex.make_instance(job["workload"], job["load"], job["seed"], num_tasks, **kwargs)
        key = (job["load"], job["seed"], job["kv_capacity_tokens"])
        instances.setdefault(key, {})[movement] = inst
    assert len(instances) == 4
    for (load, seed, kv), by_movement in instances.items():
        swap, recompute = by_movement["swap"], by_movement["recompute"]
        assert isinstance(swap.server.prefix_load, HostLoad)
        assert isinstance(recompute.server.prefix_load, RecomputeLoad)
        assert recompute.server.kv_capacity_tokens == swap.server.kv_capacity_tokens == kv
        assert [t.arrival for t in recompute.tasks] == [t.arrival for t in swap.tasks]
        assert recompute.tasks == swap.tasks
        own = rp.generate(
            rp.MAP_WORKLOAD,
            num_tasks=len(swap.tasks),
            seed=seed,
            load=load,
            movement="recompute",
            kv_capacity_tokens=kv,
            **rp.ex.profile_kwargs(cfg),
        )
        assert own.tasks[-1].arrival > swap.tasks[-1].arrival  # sparser at its own load
