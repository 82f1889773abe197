"""KV accounting rules (topas/kv.py), by hand and against their users."""

from __future__ import annotations

from conftest import make, random_instances, stage, task
from hypothesis import given, settings
from hypothesis import strategies as st

from topas.kv import (
    decode_steps_that_fit,
    overrun_need,
    reservation,
    sglang_kv_need,
    step_estimate,
    step_need,
    step_peak_kv,
)
from topas.policies import make_policy
from topas.simulator import CalibratedEngine, simulate
from topas.state import TaskInfo, task_arrives


def test_reservation_by_hand():
    # input 100, predicted 50: 150 reserved; after a retraction with 70 generated the
    # generated tokens come back and the next one needs KV: 100 + 71
    assert reservation(100, 50, 0, room=1000) == 150
    assert reservation(100, 50, 70, room=1000) == 171
    # a prediction too long to fit beside the prompt is clipped to the room, never below 1
    assert reservation(100, 5000, 0, room=400) == 400
    assert reservation(100, 50, 0, room=0) == 1


def test_step_need_and_overrun_by_hand():
    assert step_need(30, 12) == 42  # rule 3: input + output
    assert step_estimate(30, 5, room=100) == 35  # told 5 output tokens, whatever the truth
    assert step_estimate(30, 500, room=100) == 100  # clipped: it always fits alone
    assert overrun_need(171) == 172  # what it holds plus its next token


def test_decode_room_by_hand():
    # 1,000 tokens of KV, 970 held, 4 sequences decoding: 7 iterations add 28 tokens and
    # fit, the 8th would need 32; with 997 held none fits and a retraction comes first
    assert decode_steps_that_fit(1000, 970, 4) == 7
    assert decode_steps_that_fit(1000, 997, 4) == 0
    assert decode_steps_that_fit(1000, 1003, 4) == 0  # over already: still none


def test_step_peak_kv_by_hand():
    # one agent (prompt 20 tokens, loaded in 2 steps at chunk 10); two stages of 10 + 5
    # tokens in a row: prompt 20 from step 0, each stage 15 while it runs: peak 35
    inst = make(
        {"a": 20},
        [task("t", 0, stage("x", "a", 10, 5), stage("y", "a", 10, 5, deps=["x"]))],
        capacity=100,
    )
    sched = simulate(inst, make_policy("fcfs"), timing="step")
    assert step_peak_kv(sched) == sched.peak_kv_tokens == 35


@settings(max_examples=20, deadline=None)
@given(random_instances(max_tasks=3, max_stages=3), st.integers(0, 600))
def test_plugin_and_calibrated_engine_reserve_alike(inst, generated):
    # the live plugin binds sglang_kv_need to its own task table; the calibrated engine
    # reads its state: for every stage and any number of generated tokens they must agree
    engine = CalibratedEngine(
        inst, make_policy("fcfs"), debug=False, predicted=None, progress=False
    )
    for t in inst.tasks:
        task_arrives(engine.state, TaskInfo.of(t, 0.0))
    by_id = {t.id: t for t in inst.tasks}
    prompts = {a.id: a.prefix_tokens for a in inst.agents}
    plugin = sglang_kv_need(
        lambda ref: by_id[ref[0]].stage_by_id[ref[1]],
        prompts.__getitem__,
        inst.server.kv_capacity_tokens,
    )
    for t in inst.tasks:
        for s in t.stages:
            ref = (t.id, s.id)
            assert plugin(ref, generated) == engine.kv_need(ref, generated)
