"""Planning in a planner process (topas_sglang.offload) on SGLang's own objects: the plan
made there is the one the scheduler's own controller makes on the same round; a
retraction asks it; a planner that dies leaves SGLang's order; a whole CPU-loop replay
completes with it."""

from __future__ import annotations

import logging

import pytest
from conftest import script


@pytest.fixture(scope="module")
def bench():  # type: ignore[no-untyped-def]
    return script("bench_plan")


KV = 12_000  # tokens: about the agents' prompts and a few stages, so that TOPAS reorders


def _controllers(spec: str):  # type: ignore[no-untyped-def]
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from topas_sglang.controller import Controller
    from topas_sglang.offload import Offloaded

    sync = Controller(policy_spec=spec, budget_ms=0, key_factory=RadixKey)
    off = Offloaded(policy_spec=spec, budget_ms=0, key_factory=RadixKey)
    return sync, off


def _agent_ranks(c) -> dict:  # type: ignore[no-untyped-def]
    agent_of = {node: agent for agent, node in c.prompt_nodes.items()}
    return {agent_of[node]: rank for node, rank in c.ranks.items()}


@pytest.mark.parametrize("spec", ["topas-greedy", "topas", "topas:fill=greedy"])
def test_the_planner_plans_what_the_scheduler_would_round_after_round(bench, spec):
    # Two controllers see the same requests and the same tree, round after round, while
    # requests finish (with SGLang's signal), start, arrive and decode: the synchronous one
    # plans in the scheduler's thread, the offloaded one in its planner process. Once the
    # planner has answered a round's snapshot (settle), the offloaded order, hold-backs and
    # prompt ranks (from the second round) are the synchronous ones. Sending the queue in
    # another order, or applying the plan's order reversed, fails it.
    from topas_sglang.cpu_loop import payload_req

    cache, _, queue, batch, arrivals = bench.setup(12, "lru", 8, "fcfs", kv_tokens=KV)
    for i, req in enumerate(arrivals):
        req.time_stats.wait_queue_entry_time = 100.0 + i
    sync, off = _controllers(spec)
    moved = 0
    try:
        for i in range(8):
            done = batch.reqs.pop(0)
            sync.stage_finished(done)
            off.stage_finished(done)
            batch.reqs.append(queue.pop(0))
            queue.append(arrivals[i])
            for req in batch.reqs:
                req.output_ids.append(0)
            plain = {"rid": f"u{i}", "input_ids": [1, 2, i], "sampling_params": {}}
            waiting = [*queue[:3], payload_req(plain), *queue[3:]]  # one untagged
            now = 200.0 + i
            want = sync.plan_round(cache, waiting, batch.reqs, now)
            off.plan_round(cache, waiting, batch.reqs, now)  # sends this round's snapshot
            assert off.settle()
            got = off.plan_round(cache, waiting, batch.reqs, now)  # applies its plan
            assert [r.rid for r in got] == [r.rid for r in want]
            moved += any(a is not b for a, b in zip(want, waiting, strict=True))
            assert off.held_rids == sync.held_rids
            if i:  # an agent's prompt is matched in the tree once the planner has named
                # it (the scheduler does not decode metadata): from the second round
                assert _agent_ranks(off) == _agent_ranks(sync)
        assert moved  # TOPAS reordered SGLang's queue: the comparison has teeth
        assert off.stats.plans == 8 and off.stats.fallbacks == 0
        assert off.stats.planner_s > 0 and off.stats.finished == 8
        for st in (sync.stats, off.stats):  # the scheduler thread's CPU, within its wall
            assert 0 < st.decide_cpu_s <= st.decide_s + 1e-3, st
    finally:
        off.close()


@pytest.mark.parametrize("spec", ["topas-greedy", "topas"])
def test_the_plan_for_a_predicted_finish_is_the_schedulers_once_it_finishes(bench, spec):
    # A plan is made at a change and applied until the next one, which in a decoding batch
    # is a request finishing: its successor is queued and its KV freed. So the planner
    # also plans for that round, as predicted (next_round). Here the batch's first request
    # is 3 decode steps from its (exactly predicted) length, the others further. The
    # queue as it is gets the snapshot's own plan; after the three steps, the finish
    # signal and the client's request for the next stage, the scheduler's own controller
    # plans that round afresh, and the offloaded one applies its prediction: the same
    # order and hold-backs, where the snapshot's own plan would give another. Not queuing
    # the next stage in the prediction, or not switching to it, fails it (the prediction's
    # arithmetic: test_next_round.py).
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    from topas.serve_bench import prefix_ids, stage_payload
    from topas_sglang.cpu_loop import payload_req

    waiting = 12
    cache, _, queue, batch, _ = bench.setup(waiting, "lru", 0, "fcfs", kv_tokens=KV)
    inst = bench.bench_instance(waiting + bench.RUNNING)
    first, now = batch.reqs[0], 300.0
    first.output_ids.extend([0] * (first.sampling_params.max_new_tokens - 3))
    sync, off = _controllers(spec)
    try:
        assert sync.plan_round(cache, list(queue), batch.reqs, now) is not None
        off.plan_round(cache, list(queue), batch.reqs, now)
        assert off.settle()
        plan = off._plan
        assert plan.ending == (first,) and plan.branch is not None
        still = off.plan_round(cache, [*queue[1:], queue[0]], batch.reqs, now)
        assert off.stats.ahead == 0 and sorted(map(id, still)) == sorted(map(id, queue))
        for _ in range(3):
            for req in batch.reqs:
                req.output_ids.append(0)
        first.finished_reason = FINISH_LENGTH(length=len(first.output_ids))
        batch.reqs.remove(first)
        for c in (sync, off):
            c.stage_finished(first)
        tid, sid = first.rid.split("/", 1)
        task = inst.task_by_id[tid]
        nexts = [payload_req(stage_payload(inst, task, c, prefix_ids(inst)))
                 for c in task.children[sid]]  # fmt: skip
        assert nexts
        for req in nexts:
            req.time_stats.wait_queue_entry_time = now
        round_after = [*queue, *nexts]
        want = sync.plan_round(cache, round_after, batch.reqs, now)
        got = off.plan_round(cache, round_after, batch.reqs, now)
        assert off.stats.ahead == 1
        assert [r.rid for r in got] == [r.rid for r in want]
        assert off.held_rids == sync.held_rids
        stale, _, _ = off._arrange(round_after, plan, hold=True)
        assert [r.rid for r in stale] != [r.rid for r in want]  # it has teeth
    finally:
        off.close()


def test_a_plan_one_round_old_orders_what_it_knew_and_leaves_the_rest(bench, caplog):
    # The planner answered round 1; at round 2 two requests have joined the queue. They
    # keep their places (SGLang's order), the ones the plan ranked follow its order around
    # them, and the head of the queue that started running is simply gone.
    caplog.set_level(logging.INFO, logger="topas_sglang")
    cache, _, queue, batch, arrivals = bench.setup(10, "lru", 2, "fcfs", kv_tokens=KV)
    for i, req in enumerate(arrivals):
        req.time_stats.wait_queue_entry_time = 100.0 + i
    _, off = _controllers("topas-greedy")
    try:
        off.plan_round(cache, list(queue), batch.reqs, 200.0)
        assert off.settle()
        planned = off.plan_round(cache, list(queue), batch.reqs, 200.0)
        known = [r for r in planned if r.rid not in off.held_rids]
        waiting = [*queue[1:5], arrivals[0], *queue[5:], arrivals[1]]
        got = off.plan_round(cache, waiting, [*batch.reqs, queue[0]], 201.0)
        assert sorted(map(id, got)) == sorted(map(id, waiting))
        assert got[4] is arrivals[0] and arrivals[1] in got
        ranked = [r for r in got if r in known]
        assert ranked == [r for r in known if r is not queue[0]][: len(ranked)]
        assert off.stats.lag >= 0
        # the first plan to come back is logged with its counters (the live bench reads it)
        assert "topas stats: rounds=1 " in caplog.text and " plans=1 " in caplog.text
    finally:
        off.close()


def test_a_retraction_asks_the_planner_and_gets_the_schedulers_order(bench):
    cache, _, queue, batch, _ = bench.setup(6, "lru", schedule="fcfs", kv_tokens=KV)
    sync, off = _controllers("topas")
    try:
        for c in (sync, off):
            c.plan_round(cache, list(queue), batch.reqs, 50.0)
        assert off.settle()
        for req in batch.reqs:
            req.output_ids.extend([0] * 3)
        order = list(range(len(batch.reqs)))
        want = sync.retraction_order(batch.reqs, order, 51.0)
        assert off.retraction_order(batch.reqs, order, 51.0) == want
        assert off.stats.retraction_orders == 1
    finally:
        off.close()


def test_a_planner_that_dies_leaves_sglangs_order_from_then_on(bench, caplog):
    cache, _, queue, batch, _ = bench.setup(6, "lru", schedule="fcfs", kv_tokens=KV)
    _, off = _controllers("topas-greedy")
    off.plan_round(cache, list(queue), batch.reqs, 10.0)
    assert off.settle()
    off._proc.kill()
    off._proc.wait()
    outs = [off.plan_round(cache, list(queue[: 5 - i]), batch.reqs, 11.0 + i) for i in range(3)]
    assert outs[-1] is None and off.held_rids == frozenset() and off.ranks == {}
    assert off.stats.fallbacks >= 1
    assert "planner process unavailable" in caplog.text
    assert caplog.text.count("planner process unavailable") == 1


def test_offload_and_lookahead_must_be_true_or_false():
    from topas_sglang.retention import TopasRetention

    with pytest.raises(ValueError, match="offload: true or false expected"):
        TopasRetention(offload="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lookahead: true or false expected"):
        TopasRetention(offload=True, lookahead=1)  # type: ignore[arg-type]
    assert not TopasRetention(offload=True, lookahead=False).controller.lookahead


def test_a_replay_with_the_planner_process_completes_and_repeats_itself():
    # The CPU loop gives the planner each iteration's time (it waits for the answer), so
    # every plan is applied one round late, as on a server whose planner keeps up, and two
    # replays agree task for task. Every task completes, plans arrive, nothing failed.
    from topas.workloads import generate
    from topas_sglang.cpu_loop import replay

    inst = generate("metagpt-sop", num_tasks=6, seed=1000, load=1.5)
    kv = int(inst.server.kv_capacity_tokens * 0.5)
    first, again = (replay(inst, "topas", kv_tokens=kv, offload=True) for _ in range(2))
    assert len(first.jct) == len(inst.tasks) and first.jct == again.jct
    st = first.stats
    assert st.plans > 0 and st.fallbacks == 0 and st.rounds >= st.plans
    assert st.lag == 0  # every plan came back before the next round that changed


def _loop_study():  # type: ignore[no-untyped-def]
    """``analysis/sglang_in_the_loop.py`` as a module (a study script, not a package)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "analysis" / "sglang_in_the_loop.py"
    spec = importlib.util.spec_from_file_location("sglang_in_the_loop", path)
    study = importlib.util.module_from_spec(spec)
    sys.modules["sglang_in_the_loop"] = study
    spec.loader.exec_module(study)
    return study


def test_the_in_the_loop_study_adds_a_planner_process_arm(tmp_path):
    # analysis/sglang_in_the_loop.py --offload: a third replay per seed, paired against
    # the plugin planning in the scheduler, in its own two columns.
    study = _loop_study()
    out = tmp_path / "loop"
    args = ["--workloads", "metagpt-sop", "--tasks", "3", "--seeds", "20,", "--kv-scale",
            "0.5", "--offload", "--out", str(out)]  # fmt: skip
    assert study.main(args) == 0
    summary = (out / "summary.md").read_text()
    assert "planner process: mean JCT s (change)" in summary
    runs = (out / "runs.csv").read_text()
    assert runs.count("topas-offload") == 1 and runs.count(",lru,") == 1


def test_the_in_the_loop_study_replays_other_plugin_specs(tmp_path):
    # analysis/sglang_in_the_loop.py --policies: one more replay per seed and spec, with
    # the plugin planning that spec, in a second table against lru and the default.
    study = _loop_study()
    out = tmp_path / "loop"
    args = ["--workloads", "metagpt-sop", "--tasks", "3", "--seeds", "20,", "--kv-scale",
            "0.5", "--policies", "topas,topas:drain_load=0", "--out", str(out)]  # fmt: skip
    assert study.main(args) == 0
    summary = (out / "summary.md").read_text()
    assert "| metagpt-sop | `topas:drain_load=0` |" in summary
    runs = (out / "runs.csv").read_text()
    assert runs.count(",plugin:topas,") == 1 and runs.count(",plugin:topas:drain_load=0,") == 1
    from topas.workloads import generate
    from topas_sglang.cpu_loop import CpuLoop
    from topas_sglang.retention import controller_of

    inst = generate("metagpt-sop", num_tasks=2, seed=20)
    loop = CpuLoop(inst, "topas", policy_spec="topas:drain_load=0")
    assert controller_of(loop.cache).policy_spec == "topas:drain_load=0"


def test_the_in_the_loop_study_takes_tuning_seeds_only_with_tuning(tmp_path):
    # a run for choosing defaults says so in its summary; without --tuning a tuning seed
    # is refused, as by every other study
    study = _loop_study()
    out = tmp_path / "loop"
    args = ["--workloads", "metagpt-sop", "--tasks", "2", "--seeds", "1000,", "--kv-scale",
            "0.5", "--out", str(out)]  # fmt: skip
    with pytest.raises(study.ex.CliError, match="tuning seed"):
        study.main(args)
    assert not out.exists()
    assert study.main([*args, "--tuning"]) == 0
    assert "**Tuning seeds** (`--tuning`)" in (out / "summary.md").read_text()
