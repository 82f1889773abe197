"""analysis/bench_decision.py: the serving-loop harness and the --quick CLI run."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_analysis

from topas.policies import PolicyContext, make_policy
from topas.state import Decision

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "analysis" / "bench_decision.py"
bench = load_analysis("bench_decision")


def _run(*args: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def test_quick_run_writes_table_and_json(tmp_path) -> None:
    out = tmp_path / "bd"
    proc = _run("--quick", out=out)
    assert proc.returncode == 0, proc.stderr
    summary = (out / "summary.md").read_text()
    assert proc.stdout == summary
    assert "| policy | agents | waiting | p50 (ms) | p99 (ms) |" in summary
    assert "## Growth of p50 per 10x of waiting stages" in summary
    assert "| agents | waiting | p50 topas/lpm | p99 topas/lpm |" in summary
    doc = json.loads((out / "runs.json").read_text())
    assert doc["config"]["waiting"] == [10, 100]
    assert set(doc["policy_source_sha256"]) == {"topas", "lpm"}
    runs = doc["runs"]
    keys = {(r["policy"], r["agents"], r["waiting"]) for r in runs}
    grid = {(p, a, n) for p in ("topas", "lpm") for a in (8, 64) for n in (10, 100)}
    forced = {(f"lpm:{bench.SORT_ALL}", a, 128) for a in (8, 64)}
    assert keys == grid | forced and len(runs) == len(keys)
    for r in runs:
        assert r["decisions"] == 10
        assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert r["waiting"] <= r["mean_waiting"] <= r["waiting"] + 5  # the queue is held at N
        assert r["mean_running"] > 0
        if r["policy"] == "topas":  # the sets it scored: R_t at least; every subset of at
            # most M = 6 active agents, or the greedy's |A|^2; plus the never-idle fallback
            bound = max(2**6, 16, r["agents"] ** 2) + 1
            assert 1 <= r["mean_evaluated"] <= r["max_evaluated"] <= bound
        else:
            assert r["mean_evaluated"] is None
        table_row = f"| `{r['policy']}` | {r['agents']} | {r['waiting']} |"
        assert table_row in summary


def test_repeat_runs_the_plan_in_rounds_and_takes_medians(tmp_path) -> None:
    out = tmp_path / "bd"
    args = ["--policies", "topas", "--agents", "8", "--waiting", "10", "--decisions", "5"]
    assert bench.main([*args, "--warmup", "1", "--repeat", "3", "--out", str(out)]) == 0
    (run,) = json.loads((out / "runs.json").read_text())["runs"]
    assert run["repeats"] == 3 and len(run["p50_runs_ms"]) == 3
    assert run["p50_ms"] == sorted(run["p50_runs_ms"])[1]  # the median of the three
    summary = (out / "summary.md").read_text()
    assert "Every configuration ran 3 times, in 3 rounds" in summary
    assert "| p50 of each run (ms) |" in summary
    assert ", ".join(f"{t:.3f}" for t in run["p50_runs_ms"]) in summary


def test_repeated_runs_that_decide_differently_fail() -> None:
    # the decisions are deterministic: rounds that scored different prefix sets are a bug
    # (of the policy or the harness), not noise
    a = bench.bench_one("topas", 8, 10, 3, 1)
    assert bench.combine([a, a]).p50_runs_ms == (a.p50_ms, a.p50_ms)
    other = dataclasses.replace(a, mean_evaluated=(a.mean_evaluated or 0) + 1)
    with pytest.raises(bench.BenchError, match="decided differently .*mean_evaluated"):
        bench.combine([a, other])


@pytest.mark.parametrize(
    "args",
    [
        ["--policies", "nosuch"],
        ["--repeat", "0"],
        ["--waiting", "0"],
        ["--agents", "x"],
        ["--decisions", "0"],
        ["--decisions", "many"],
        ["--bogus"],
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, args) -> None:
    assert bench.main([*args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert not any(tmp_path.iterdir())


def test_bad_input_from_the_shell_has_no_traceback(tmp_path) -> None:
    proc = _run("--waiting", "ten", out=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == "error: --waiting: expected comma-separated integers, got 'ten'\n"


def test_loop_is_a_fresh_consistent_state_each_call() -> None:
    # the harness drives the state the way the engine does: every decision is applied,
    # the queue is refilled to N, time moves on, and the simulator's invariants hold
    inst = bench.make_instance(8, seed=1)
    loop = bench.ServingLoop(inst, waiting=30, seed=1)
    policy = make_policy("topas")
    policy.reset(PolicyContext(server=inst.server, timing="calibrated", seed=0))
    st = loop.state
    seen = set()
    for _ in range(40):
        assert len(st.waiting) >= 30
        d = policy.decide(st)
        assert isinstance(d, Decision)
        seen.update(d.admit)
        before = st.time
        loop.step(d)  # raises BenchError on an infeasible decision; checks invariants
        assert st.time > before
    assert len(seen) >= 40  # stages keep flowing through
    assert loop.released > 30


def test_tasks_are_small_dags_on_random_agents() -> None:
    inst = bench.make_instance(64, seed=0, tasks=200)
    sizes = {len(t.stages) for t in inst.tasks}
    assert sizes <= set(range(2, 6)) and len(sizes) > 1
    fanouts = [t for t in inst.tasks if len(t.stages[-1].deps) > 1]
    assert fanouts and len(fanouts) < len(inst.tasks)
    assert len({s.agent for t in inst.tasks for s in t.stages}) > 32
    total = sum(a.prefix_tokens for a in inst.agents)
    assert total / 3 < inst.server.kv_capacity_tokens < total  # a third plus a batch
