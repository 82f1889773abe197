"""Property tests over random DAG instances, for every policy and both timing modes.

Invariants (DESIGN.md): KV held never exceeds capacity; a running stage's prefix is
resident; no stage starts before its deps finish or its task is released; every
stage finishes exactly once; the same seed gives the same result. The simulator
checks its own accounting after every event (``debug=True``); the assertions below
re-derive the invariants from the recorded Schedule alone.
"""

from __future__ import annotations

import pytest
from conftest import random_instances
from hypothesis import given

from topas.policies import REGISTRY, make_policy
from topas.schedule import evaluate
from topas.simulator import simulate
from topas.timing import StepTiming
from topas.verify import verify_step

TOL = 1e-9

# every registered policy that decides on its own (replay needs a recorded schedule)
POLICIES = sorted(name for name in REGISTRY if name != "replay")


def check_schedule(inst, sched) -> None:
    m = evaluate(sched)  # raises unless every stage finished exactly once
    assert set(m.jct) == {t.id for t in inst.tasks}
    done = sched.completed()
    for r in done.values():
        task = inst.task_by_id[r.task]
        assert r.admit <= r.start + TOL <= r.end + 2 * TOL
        assert r.start >= sched.release(r.task) - TOL
        for dep in task.stage_by_id[r.stage].deps:
            assert done[(r.task, dep)].end <= r.start + TOL, "stage started before its dep"
        ivs = [p for p in sched.prefixes if p.agent == r.agent]
        assert any(p.resident_from <= r.start + TOL and r.end <= p.end + TOL for p in ivs), (
            "stage ran without its prefix resident"
        )
    assert sched.peak_kv_tokens <= inst.server.kv_capacity_tokens


@pytest.mark.parametrize("spec", POLICIES)
@given(inst=random_instances())
def test_step_invariants(spec, inst):
    sched = simulate(inst, make_policy(spec), timing="step", debug=True)
    check_schedule(inst, sched)
    verify_step(sched)  # rules 3-6, step by step, independent of the engine
    # each task takes at least its longest chain of stage durations
    st = StepTiming.of(inst)
    m = evaluate(sched)
    for t in inst.tasks:
        longest: dict[str, int] = {}
        for sid in t.topo_order:
            s = t.stage_by_id[sid]
            longest[sid] = st.stage_steps(s.input_tokens, s.output_tokens) + max(
                (longest[d] for d in s.deps), default=0
            )
        assert m.jct[t.id] >= max(longest.values()) * st.step_s - TOL


@pytest.mark.parametrize("spec", POLICIES)
@given(inst=random_instances())
def test_calibrated_invariants(spec, inst):
    sched = simulate(inst, make_policy(spec), timing="calibrated", debug=True)
    check_schedule(inst, sched)


@pytest.mark.parametrize("timing", ["step", "calibrated"])
@given(inst=random_instances(max_tasks=3))
def test_same_seed_same_result(timing, inst):
    for spec in POLICIES:
        a = simulate(inst, make_policy(spec), timing=timing, seed=7)
        b = simulate(inst, make_policy(spec), timing=timing, seed=7)
        assert a.runs == b.runs and a.prefixes == b.prefixes
        assert evaluate(a).jct == evaluate(b).jct
