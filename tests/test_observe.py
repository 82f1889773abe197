"""Building a State from what an engine observes (topas/observe.py)."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import kv_of, make, random_instances, stage, task
from hypothesis import given

from topas.observe import ObservationError, Request, observed_state
from topas.policies.search import TOPAS
from topas.simulator import simulate
from topas.state import Phase, PrefixStatus
from topas.workflow_metadata import decode, encode


def _observe(inst, state):
    """What a live engine would report about the simulator's ``state``: each queued and
    running request with the DAG from its metadata, the reserved KV, cached prompts."""
    reqs = []
    for ref, ready in state.waiting.items():
        reqs.append(_request(inst, state, ref, ready, running=False))
    for ref, run in state.running.items():
        reqs.append(_request(inst, state, ref, run.admitted_at, True, run.generated, run.reserved))
        reqs[-1] = dataclasses.replace(reqs[-1], started_at=run.started_at)
    resident = [a for a, p in state.prefixes.items() if p.status != PrefixStatus.ABSENT]
    prefix = {a.id: a.prefix_tokens for a in inst.agents}
    finished: dict[str, list[str]] = {}  # the plugin records the requests it saw finish
    for (tid, sid), phase in state.phase.items():
        if phase == Phase.DONE:
            finished.setdefault(tid, []).append(sid)
    return observed_state(
        inst.server,
        prefix,
        reqs,
        resident,
        state.time,
        state.kv_need,
        finished,
        kv_estimate=state.kv_estimate,
    )


def _request(inst, state, ref, queued_at, running, generated=None, reserved=None):
    task = inst.task_by_id[ref[0]]
    meta = decode(encode(task, ref[1], 1))  # the DAG as it travels: predicted lengths
    return Request(
        task=meta.task,
        stage=ref[1],
        release=state.tasks[ref[0]].release,
        queued_at=queued_at,
        running=running,
        generated=state.generated.get(ref, 0) if generated is None else generated,
        reserved=reserved,
    )


class CrossCheck(TOPAS):
    """Decides on the engine's state and, where the engine's view is what a live engine
    reports (no prefix mid-load), checks a fresh TOPAS on the observed state agrees."""

    checked = 0

    def decide(self, state):  # type: ignore[no-untyped-def]
        if all(p.status != PrefixStatus.LOADING for p in state.prefixes.values()):
            seen = _observe(self._inst, state)
            assert seen.free_kv == state.free_kv and seen.free_slots == state.free_slots
            assert list(seen.waiting) == list(state.waiting)
            assert set(seen.running) == set(state.running)
            for ref, phase in state.phase.items():
                assert seen.phase[ref] == phase, ref
            a, b = TOPAS(), TOPAS()
            a.reset(self.ctx)
            b.reset(self.ctx)
            assert a.decide(state).admit == b.decide(seen).admit
            CrossCheck.checked += 1
        return super().decide(state)


@given(inst=random_instances(max_tasks=4, max_stages=5))
def test_observed_state_matches_the_engine_step(inst):
    policy = CrossCheck()
    policy._inst = inst
    before = CrossCheck.checked
    simulate(inst, policy, timing="step")
    assert CrossCheck.checked > before  # step 0 at least: nothing is loading yet


@given(inst=random_instances(max_tasks=4, max_stages=5))
def test_observed_state_matches_the_engine_calibrated(inst):
    policy = CrossCheck()
    policy._inst = inst
    before = CrossCheck.checked
    simulate(inst, policy, timing="calibrated")
    assert CrossCheck.checked > before  # step 0 at least: nothing is loading yet


def test_hand_built_observation():
    # t0: a -> b -> c with b running: a is done (b depends on it), c blocked. t1's only
    # stage is queued. Agent y (running b) is resident though not reported cached.
    inst = make(
        {"x": 10, "y": 20},
        [
            task("t0", 0, stage("a", "x", 5, 2), stage("b", "y", 5, 3, ["a"]),
                 stage("c", "x", 5, 1, ["b"])),
            task("t1", 1, stage("s", "x", 4, 4)),
        ],
        capacity=200,
    )  # fmt: skip
    t0, t1 = inst.tasks
    reqs = [
        Request(t0, "b", release=0.0, queued_at=2.0, running=True, generated=1, reserved=8),
        Request(t1, "s", release=1.0, queued_at=1.0),
    ]
    st = observed_state(inst.server, {"x": 10, "y": 20}, reqs, ["x"], 3.0, kv_of(inst))
    assert [st.phase[("t0", s)] for s in "abc"] == [Phase.DONE, Phase.RUNNING, Phase.BLOCKED]
    assert list(st.waiting) == [("t1", "s")] and st.unfinished == {"t0": 2, "t1": 1}
    assert st.kv_committed == 10 + 20 + 8 and st.prefixes["y"].users == 1
    assert st.age("t1") == 2.0


def test_contradictions_are_errors():
    inst = make({"x": 10}, [task("t0", 0, stage("a", "x", 5, 2), stage("b", "x", 5, 3, ["a"]))],
                capacity=100)  # fmt: skip
    t0 = inst.tasks[0]
    with pytest.raises(ObservationError, match="observed twice"):
        observed_state(inst.server, {"x": 10}, [Request(t0, "a", 0, 0), Request(t0, "a", 0, 0)],
                       [], 0.0, kv_of(inst))  # fmt: skip
    with pytest.raises(ObservationError, match="depends on it"):
        observed_state(inst.server, {"x": 10}, [Request(t0, "a", 0, 0), Request(t0, "b", 0, 0)],
                       [], 0.0, kv_of(inst))  # fmt: skip
