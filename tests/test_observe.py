"""Building a State from what an engine observes (topas/observe.py)."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from conftest import kv_of, make, random_instances, stage, task
from hypothesis import given

from topas.observe import ObservationError, Observer, Request, observed_state
from topas.policies.search import TOPAS
from topas.simulator import simulate
from topas.state import Phase, PrefixStatus
from topas.workflow_metadata import decode, encode


def _observe(inst, state, observer=None, resident=None, now=None):
    """What a live engine would report about the simulator's ``state``: each queued and
    running request with the DAG from its metadata, the reserved KV, cached prompts; built
    afresh, or by ``observer`` (which remembers the last round). ``resident`` and ``now``,
    when given, replace the cached prompts and the clock."""
    reqs = []
    for ref, ready in state.waiting.items():
        reqs.append(_request(inst, state, ref, ready, running=False))
    for ref, run in state.running.items():
        reqs.append(_request(inst, state, ref, run.admitted_at, True, run.generated, run.reserved))
        reqs[-1] = dataclasses.replace(reqs[-1], started_at=run.started_at)
    if resident is None:
        resident = [a for a, p in state.prefixes.items() if p.status != PrefixStatus.ABSENT]
    prefix = {a.id: a.prefix_tokens for a in inst.agents}
    finished: dict[str, list[str]] = {}  # the plugin records the requests it saw finish
    for (tid, sid), phase in state.phase.items():
        if phase == Phase.DONE:
            finished.setdefault(tid, []).append(sid)
    now = state.time if now is None else now
    seen = (inst.server, prefix, reqs, resident, now, state.kv_need, finished)
    if observer is not None:
        return observer.state(*seen, kv_estimate=state.kv_estimate)
    return observed_state(*seen, kv_estimate=state.kv_estimate)


def _request(inst, state, ref, queued_at, running, generated=None, reserved=None):
    return Request(
        task=_travelled(inst.task_by_id[ref[0]]),
        stage=ref[1],
        release=state.tasks[ref[0]].release,
        queued_at=queued_at,
        running=running,
        generated=state.generated.get(ref, 0) if generated is None else generated,
        reserved=reserved,
    )


@functools.lru_cache(maxsize=4096)
def _travelled(task):  # type: ignore[no-untyped-def]
    """The DAG as it travels in metadata (predicted lengths), one object per task, as the
    plugin's adapter shares it between a task's requests."""
    return decode(encode(task, task.stages[0].id, 1)).task


def _same_state(a, b) -> None:  # type: ignore[no-untyped-def]
    """``a`` and ``b`` are the same view, epochs aside."""
    assert a.phase == b.phase and list(a.waiting) == list(b.waiting)
    assert a.running == b.running and a.generated == b.generated
    assert a.kv_committed == b.kv_committed and a.unfinished == b.unfinished
    assert a.tasks == b.tasks and a.prefixes == b.prefixes
    assert list(a.tasks) == list(b.tasks)  # registered by release


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
            kept = _observe(self._inst, state, self._observer)
            self._check_observer(seen, kept)
            self._check_repeat(state, kept)
            self._check_fast_path(kept)
            CrossCheck.checked += 1
        return super().decide(state)

    def _check_observer(self, fresh, kept) -> None:  # type: ignore[no-untyped-def]
        """The Observer's state is the fresh one, and a task keeps its epoch exactly when
        its requests (queued or running), finished stages and phases are as last round."""
        _same_state(fresh, kept)
        stamps = list(kept.task_epoch.values())
        assert stamps == sorted(stamps) and set(kept.task_epoch) == set(kept.tasks)
        last, self._last = self._last, {}
        for tid, info in kept.tasks.items():
            refs = [(tid, sid) for sid in info.topo_order]
            sig = tuple((kept.phase[r], r in kept.waiting) for r in refs)
            self._last[tid] = (sig, kept.task_epoch[tid])
            if tid in last and last[tid][0] == sig:
                assert kept.task_epoch[tid] == last[tid][1], tid
            else:
                assert kept.task_epoch[tid] > max((e for _, e in last.values()), default=0)

    def _check_repeat(self, state, kept) -> None:  # type: ignore[no-untyped-def]
        """The same requests seen again, later and with fewer prompts cached (the Observer
        then keeps its tasks, phases and queue and reads the rest anew), and once more as
        they were: each time the state a fresh observation gives, with the same epochs and
        fresh wait stamps after the last ones."""
        epochs = dict(kept.task_epoch)
        resident = [a for a, p in state.prefixes.items() if p.status != PrefixStatus.ABSENT]
        for cached, now in ((resident[1:], state.time + 1.0), (resident, state.time)):
            last = max(kept.wait_stamp.values(), default=0)
            fresh = _observe(self._inst, state, resident=cached, now=now)
            again = _observe(self._inst, state, self._observer, resident=cached, now=now)
            _same_state(fresh, again)
            assert again.time == now and again.task_epoch == epochs
            stamps = list(again.wait_stamp.values())
            assert list(again.wait_stamp) == list(again.waiting)
            assert stamps == sorted(stamps) and min(stamps, default=last + 1) > last

    def _check_fast_path(self, kept) -> None:  # type: ignore[no-untyped-def]
        """Two TOPAS instances kept round after round decide alike on the Observer's
        state: one is given it as it is, changed in place (it reads only the tasks stamped
        since its last decision), the other a copy each round (a state it has not seen, so
        it compares the whole queue; the same epochs, so the same per-task caching)."""
        if not self._pair:
            self._pair = [TOPAS(), TOPAS()]
            for p in self._pair:
                p.reset(self.ctx)
        full, fast = self._pair
        assert full.decide(kept.copy()) == fast.decide(kept)


def _cross_check(inst, timing: str) -> None:  # type: ignore[no-untyped-def]
    policy = CrossCheck()
    policy._inst, policy._observer, policy._last, policy._pair = inst, Observer(), {}, []
    before = CrossCheck.checked
    simulate(inst, policy, timing=timing)
    assert CrossCheck.checked > before  # step 0 at least: nothing is loading yet


@given(inst=random_instances(max_tasks=4, max_stages=5))
def test_observed_state_matches_the_engine_step(inst):
    _cross_check(inst, "step")


@given(inst=random_instances(max_tasks=4, max_stages=5))
def test_observed_state_matches_the_engine_calibrated(inst):
    _cross_check(inst, "calibrated")


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
    assert {a: p.host_copy for a, p in st.prefixes.items()} == {"x": None, "y": None}
    tiered = observed_state(inst.server, {"x": 10, "y": 20}, reqs, ["x"], 3.0, kv_of(inst),
                            on_host=["x"])  # fmt: skip
    assert {a: p.host_copy for a, p in tiered.prefixes.items()} == {"x": True, "y": False}


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
