"""The real SGLang server on the CPU with the fake model, and the short live bench.

The first tests check the fake model's forward against hand-worked batches; the last one
runs ``live_bench.py --quick``: two real servers (TOPAS and SGLang's defaults) serve a
4-task MetaGPT-SOP instance over HTTP, in about two minutes.
"""

from __future__ import annotations

import json
import math
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from conftest import script
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from topas.profiles import get_profile
from topas.timing import iteration_s
from topas_sglang.controller import stats_from_log
from topas_sglang.fake_model import MODEL_DIR
from topas_sglang.fake_model.causal_lm import TopasFakeForCausalLM, batch_cost
from topas_sglang.fake_server import FakeServer


def scrape_topas_metrics(url: str) -> dict[str, float]:
    """The plugin's counters in a live server's Prometheus text at ``url``/metrics."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    rows = [ln.split() for ln in text.splitlines() if ln.startswith("topas:")]
    return {row[0]: float(row[1]) for row in rows}


def sop_through_metrics_server(tmp_path: Path, **server_kw):  # type: ignore[no-untyped-def]
    """A 4-task ``metagpt-sop`` instance replayed by ``topas serve-bench`` on a fake-model
    server with ``--enable-metrics`` (``server_kw`` to :class:`FakeServer`): (the instance,
    the server, the client's completed run, the plugin's exported counters)."""
    import subprocess

    from topas.instance import save_instance
    from topas.workloads import generate

    inst = generate("metagpt-sop", num_tasks=4, seed=0, load=1.0, token_scale=4)
    path = tmp_path / "sop.json"
    save_instance(inst, str(path))
    extra = (*server_kw.pop("extra_args", ()), "--enable-metrics")
    server = FakeServer(port=0, max_total_tokens=inst.server.kv_capacity_tokens,
                        policy="topas", extra_args=extra, log_path=tmp_path / "server.log",
                        **server_kw)  # fmt: skip
    with server:
        topas = Path(sys.executable).with_name("topas")
        run = subprocess.run(
            [str(topas), "serve-bench", str(path), "--url", server.url,
             "--out", str(tmp_path / "r.json"), "--timeout", "300"],
            capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        exported = scrape_topas_metrics(server.url)
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(json.loads((tmp_path / "r.json").read_text())["jct"]) == 4
    assert exported["topas:finished_stages_total"] == inst.num_stages  # one signal per stage
    assert exported["topas:fallbacks_total"] == 0
    return inst, server, run, exported


def _batch(mode, rows, seq_lens, extend=None):  # type: ignore[no-untyped-def]
    """The ForwardBatch fields the fake model reads."""
    return types.SimpleNamespace(
        forward_mode=mode,
        batch_size=rows,
        seq_lens_sum=sum(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens),
        seq_lens=torch.tensor(seq_lens),
        extend_seq_lens_cpu=extend,
        input_ids=torch.zeros(sum(extend) if extend else rows, dtype=torch.long),
    )


def test_batch_cost_by_hand():
    # a decode of 3 sequences with contexts 101, 102 and 40: 3 decode sequences, KV read
    # 243; an extend of two prompts, 100 new tokens beside 0 cached and 1 beside 299:
    # 101 prefill tokens, KV read 100 + 300
    assert batch_cost(_batch(ForwardMode.DECODE, 3, [101, 102, 40])) == (3, 0, 3, 243)
    assert batch_cost(_batch(ForwardMode.EXTEND, 2, [100, 300], [100, 1])) == (2, 101, 0, 400)
    assert batch_cost(_batch(ForwardMode.IDLE, 0, [])) == (0, 0, 0, 0)


def test_forward_sleeps_the_profiles_iteration_time_and_emits_one_token(monkeypatch):
    monkeypatch.setenv("TOPAS_FAKE_PROFILE", "llama-3-8b/h100")
    monkeypatch.setenv("TOPAS_FAKE_TIME_SCALE", "0")  # no sleeping in a unit test
    config = json.loads((MODEL_DIR / "config.json").read_text())
    model = TopasFakeForCausalLM(types.SimpleNamespace(**config))
    out = model.forward(torch.zeros(3), None, _batch(ForwardMode.DECODE, 3, [101, 102, 40]))
    assert out.next_token_logits.shape == (3, config["vocab_size"])
    assert out.next_token_logits.argmax(dim=1).tolist() == [7, 7, 7]
    expected = iteration_s(get_profile("llama-3-8b/h100").cost, 0, 3, 243)
    assert model.model_time_s == pytest.approx(expected)


def test_noise_has_mean_one_and_a_bad_setting_is_refused(monkeypatch):
    monkeypatch.setenv("TOPAS_FAKE_NOISE", "0.5")
    config = types.SimpleNamespace(**json.loads((MODEL_DIR / "config.json").read_text()))
    model = TopasFakeForCausalLM(config)
    samples = [
        model.iteration_time(100, 4, 1000) / iteration_s(model.cost, 100, 4, 1000)
        for _ in range(4000)
    ]
    assert abs(sum(samples) / len(samples) - 1.0) < 0.05  # log-normal with mean 1
    assert min(samples) > 0 and max(samples) > 1.5
    monkeypatch.setenv("TOPAS_FAKE_TIME_SCALE", "-1")
    with pytest.raises(ValueError, match="TOPAS_FAKE_TIME_SCALE"):
        TopasFakeForCausalLM(config)


def test_server_command_runs_every_policy_on_the_python_tree_core():
    topas = FakeServer(port=1, max_total_tokens=2048, policy="topas:aging=0", overlap=False)
    cmd = topas.command()
    assert cmd[cmd.index("--radix-eviction-policy") + 1] == "topas"
    assert json.loads(cmd[cmd.index("--radix-eviction-policy-config") + 1]) == {
        "policy": "topas:aging=0",
        "offload": False,  # said either way: the plugin's default is the planner process
    }
    assert "--disable-overlap-schedule" in cmd
    assert cmd[cmd.index("--max-total-tokens") + 1] == "2048"
    lru = FakeServer(port=1, max_total_tokens=2048, policy="lru", schedule_policy="fcfs")
    assert "--radix-eviction-policy-config" not in lru.command()
    for server in (topas, lru):
        env = server.environment()
        assert env["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "topas_sglang.fake_model"
        assert env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] == "python"


def _bench():  # type: ignore[no-untyped-def]
    """integration/sglang/live_bench.py as a module."""
    return script("live_bench")


def test_the_plugins_servers_start_from_the_schedule_policy_asked_for(tmp_path):
    # --topas-schedule sets SGLang's order under the plugin; SGLang's own policies keep
    # theirs (lpm: lpm with LRU eviction; lru: fcfs with LRU).
    import argparse

    bench = _bench()
    for base in ("lpm", "fcfs"):
        args = argparse.Namespace(
            port=0, time_scale=1.0, noise=0.0, out=str(tmp_path), topas_schedule=base
        )
        cmd = bench.server_for("topas", 1000, True, "t", args).command()
        assert cmd[cmd.index("--schedule-policy") + 1] == base
        assert cmd[cmd.index("--radix-eviction-policy") + 1] == "topas"
        for policy, (schedule, eviction) in bench.SGLANG_SIDE.items():
            cmd = bench.server_for(policy, 1000, True, "s", args).command()
            assert cmd[cmd.index("--schedule-policy") + 1] == schedule
            assert cmd[cmd.index("--radix-eviction-policy") + 1] == eviction


def test_quick_live_bench_serves_every_task_in_the_real_server(tmp_path):
    bench = _bench()
    out = tmp_path / "live"
    assert bench.main(["--quick", "--out", str(out)]) == 0  # free ports, chosen at start
    rows = {r["policy"]: r for r in _csv(out / "runs.csv")}
    assert set(rows) == {"topas", "lru"}
    for policy, row in rows.items():
        doc = json.loads((out / f"metagpt-sop-s20-{policy}-overlap.json").read_text())
        assert doc["timing"] == "live" and len(doc["jct"]) == 4  # every task finished
        assert 0 < float(row["live_mean_jct"]) < 120
    topas = rows["topas"]  # the plugin planned rounds in SGLang's own loop, without error
    assert float(topas["rounds"]) > 0 and float(topas["fallbacks"]) == 0
    assert math.isfinite(float(topas["decide_ms_per_call"]))
    cpu_ms, wall_ms = float(topas["decide_cpu_ms_per_call"]), float(topas["decide_ms_per_call"])
    assert 0 < cpu_ms <= wall_ms + 0.01  # the scheduler thread's CPU, within its wall clock
    assert rows["lru"]["rounds"] == ""  # SGLang alone: no TOPAS counters
    assert {r["seed"] for r in rows.values()} == {"20"}  # a reporting seed


def _csv(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path) as f:
        return list(csv.DictReader(f))


def test_chunked_requests_are_never_taken_for_finished_and_counters_reach_metrics(tmp_path):
    # With a 64-token chunk every stage's prompt is prefilled over several rounds, during
    # which SGLang keeps it in Scheduler.chunked_req: in neither the waiting queue nor the
    # running batch. The controller used to take it for finished and then see it again
    # (Stats.reappeared: 1-2 per run before the fix); now the adder tells it, and a stage
    # is finished only on SGLang's finish signal, one per stage. With --enable-metrics
    # the plugin's counters are in SGLang's own /metrics.
    _, server, _, exported = sop_through_metrics_server(
        tmp_path, extra_args=("--chunked-prefill-size", "64")
    )
    assert exported["topas:plan_rounds_total"] > 0
    cpu, wall = exported["topas:plan_cpu_seconds_total"], exported["topas:plan_seconds_total"]
    assert 0 < cpu <= wall + 1e-3  # the scheduler thread's CPU, within the wall clock
    assert exported["topas:reappeared_total"] == 0 and "topas:held_requests_total" in exported
    text = server.log_path.read_text(errors="replace")
    assert "chunked_prefill_size': 64" in text  # the server really chunked
    stats = [line for line in text.splitlines() if "topas stats:" in line]
    assert stats and "reappeared=0 " in stats[-1], stats[-1:]
    assert "fallbacks=0 " in stats[-1]


def test_the_real_server_plans_in_a_planner_process_with_offload(tmp_path):
    # {"offload": true}: the scheduler sends snapshots to a planner process and applies its
    # plans; every stage finishes (one signal each), plans come back, nothing fell back,
    # and the planner ends with the server (its pipe closes).
    import subprocess

    _, server, _, _ = sop_through_metrics_server(tmp_path, offload=True)
    assert '"offload": true' in " ".join(server.command())
    text = server.log_path.read_text(errors="replace")
    stats = stats_from_log(text)  # logged as plans come back (the live bench reads it)
    assert stats["plans"] > 0 and stats["planner_s"] > 0 and stats["fallbacks"] == 0, stats
    assert "planner process unavailable" not in text
    for _ in range(50):  # the planner reads the end of its pipe and exits
        left = subprocess.run(["pgrep", "-f", "topas_sglang.offload"], capture_output=True)
        if not left.stdout:
            break
        time.sleep(0.1)
    assert left.stdout == b"", "a planner process outlived its server"


def test_exporter_adds_only_what_changed():
    from prometheus_client import REGISTRY

    from topas_sglang.controller import Stats
    from topas_sglang.metrics import Exporter

    def value() -> float:
        return REGISTRY.get_sample_value("topas:plan_rounds_total") or 0.0

    before = value()
    exporter, stats = Exporter(), Stats()
    stats.rounds = 3
    exporter.update(stats)
    exporter.update(stats)  # nothing new: nothing added
    stats.rounds = 5
    exporter.update(stats)
    assert value() - before == 5


def test_a_stats_line_reads_back_from_a_log():
    # Stats.line writes the counters the benches read back with stats_from_log
    from topas_sglang.controller import Stats, stats_from_log

    stats = Stats(rounds=5, held=2, over_budget=1, decide_s=0.25, decide_cpu_s=0.1)
    log = f"[2026-12-01] INFO {Stats().line()}\nother\n[2026-12-01] INFO {stats.line()}\n"
    got = stats_from_log(log)
    assert got["rounds"] == 5 and got["held"] == 2 and got["over_budget"] == 1
    assert got["decide_ms_per_call"] == 50.0 and got["decide_cpu_ms_per_call"] == 20.0
    assert stats_from_log("no such line\n") == {}
