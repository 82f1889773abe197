"""The post-decision transition (``apply``), the engine hooks and the Planner.

States are built directly (no simulator): ``State.initial`` plus ``task_arrives``,
then decisions through ``apply`` / ``apply_inplace`` and the engine hooks
``prefix_ready`` / ``complete_stage``. A property test drives random states with
random valid events and checks that every Planner decision is accepted by ``apply``
and keeps the accounting exact.
"""

from __future__ import annotations

import copy
import itertools
import random

import pytest
from conftest import kv_of, make, random_instances, stage, task
from hypothesis import given
from hypothesis import strategies as st

from topas.policies.base import WaitingQueue
from topas.policies.baselines import fcfs_key
from topas.state import (
    Decision,
    InfeasibleDecision,
    Phase,
    PrefixStatus,
    State,
    TaskInfo,
    apply,
    apply_inplace,
    complete_stage,
    prefix_ready,
    stamp_task,
    task_arrives,
)

# --------------------------------------------------------------------------- helpers


def build(inst, tasks=None, kv_need=None) -> State:
    """The initial state with ``tasks`` (default: all) released at their arrival."""
    state = State.initial(inst, kv_need or kv_of(inst))
    for t in inst.tasks:
        if tasks is None or t.id in tasks:
            task_arrives(state, TaskInfo.of(t, t.arrival))
    return state


def make_resident(state: State, *agents: str) -> None:
    """Load the agents' prefixes and make them resident, one time unit apart (LRU)."""
    for agent in agents:
        apply_inplace(state, Decision(load=(agent,)))
        prefix_ready(state, agent)
        state.time += 1


def snap(state: State) -> dict:
    """A deep snapshot of every mutable field, dict orders included."""
    fields = (
        "time capacity max_running tasks phase waiting wait_stamp running prefixes "
        "kv_committed generated done_service unfinished task_epoch"
    ).split()
    out = {f: copy.deepcopy(getattr(state, f)) for f in fields}
    out["waiting_order"] = list(state.waiting)
    out["running_order"] = list(state.running)
    return out


def recomputed_kv(state: State) -> int:
    prefixes = sum(p.tokens for p in state.prefixes.values() if p.status != PrefixStatus.ABSENT)
    return prefixes + sum(run.reserved for run in state.running.values())


def check_invariants(state: State) -> None:
    assert state.kv_committed <= state.capacity
    if state.max_running is not None:
        assert len(state.running) <= state.max_running
    assert state.kv_committed == recomputed_kv(state)
    for agent, p in state.prefixes.items():
        assert p.users == sum(1 for r in state.running if state.agent_of(r) == agent)
    by_phase: dict[Phase, set] = {ph: set() for ph in Phase}
    for ref, ph in state.phase.items():
        by_phase[ph].add(ref)
    assert set(state.waiting) == set(state.wait_stamp)
    assert set(state.waiting) == by_phase[Phase.WAITING]
    assert set(state.running) == by_phase[Phase.ADMITTED] | by_phase[Phase.RUNNING]
    stamps = [state.wait_stamp[r] for r in state.waiting]
    assert stamps == sorted(stamps), "waiting order must follow the stamps"
    for ref in by_phase[Phase.ADMITTED]:
        assert state.prefixes[state.agent_of(ref)].status == PrefixStatus.LOADING
    for ref in by_phase[Phase.RUNNING]:
        assert state.prefixes[state.agent_of(ref)].status == PrefixStatus.RESIDENT
    for ref, ph in state.phase.items():
        deps_done = all(state.phase[(ref[0], d)] == Phase.DONE for d in state.stage(ref).deps)
        assert deps_done == (ph != Phase.BLOCKED), ref
    for tid, info in state.tasks.items():
        left = sum(1 for s in info.stages if state.phase[(tid, s)] != Phase.DONE)
        assert state.unfinished[tid] == left > 0
    assert set(state.task_epoch) == set(state.tasks) == set(state.unfinished)


# A small world: agents a (10), b (5), c (20); capacity 100.
#   t1: s1(a) -> s2(b), s1 -> s3(a), {s2, s3} -> s4(c)   (a diamond)
#   t2: s1(b)
#   t3: s1(c), arriving later
def world(capacity=100, max_running=None):
    return make(
        {"a": 10, "b": 5, "c": 20},
        [
            task(
                "t1",
                0,
                stage("s1", "a", 6, 4),
                stage("s2", "b", 3, 2, ["s1"]),
                stage("s3", "a", 2, 2, ["s1"]),
                stage("s4", "c", 5, 5, ["s2", "s3"]),
            ),
            task("t2", 0, stage("s1", "b", 8, 2)),
            task("t3", 5, stage("s1", "c", 4, 1)),
        ],
        capacity,
        max_running=max_running,
    )


T1S1, T1S2, T1S3, T1S4 = ("t1", "s1"), ("t1", "s2"), ("t1", "s3"), ("t1", "s4")
T2S1, T3S1 = ("t2", "s1"), ("t3", "s1")


# --------------------------------------------------------------------------- apply


def test_release_task_queues_roots_and_blocks_the_rest():
    state = build(world(), tasks={"t1", "t2"})
    assert list(state.waiting) == [T1S1, T2S1]
    assert state.phase[T1S2] == state.phase[T1S4] == Phase.BLOCKED
    assert state.unfinished == {"t1": 4, "t2": 1}
    assert T3S1 not in state.phase
    check_invariants(state)


def test_apply_returns_a_new_state_and_leaves_the_input_unchanged():
    state = build(world(), tasks={"t1", "t2"})
    make_resident(state, "a", "c")
    apply_inplace(state, Decision(admit=(T2S1,)))  # b absent: admitted, b loading
    before = snap(state)
    decision = Decision(preempt=(T2S1,), evict=("c",), admit=(T1S1,))
    new = apply(state, decision)
    assert snap(state) == before
    assert new is not state
    assert new.phase[T1S1] == Phase.RUNNING and state.phase[T1S1] == Phase.WAITING
    assert new.phase[T2S1] == Phase.WAITING and state.phase[T2S1] == Phase.ADMITTED
    assert new.prefixes["c"].status == PrefixStatus.ABSENT
    assert state.prefixes["c"].status == PrefixStatus.RESIDENT
    check_invariants(new)
    check_invariants(state)


def test_apply_inplace_mutates_and_returns_the_started_stages():
    state = build(world(), tasks={"t1", "t2"})
    make_resident(state, "a")
    started = apply_inplace(state, Decision(admit=(T1S1, T2S1)))
    assert started == [T1S1]  # t2/s1's prefix b is absent: admitted, not started
    assert state.phase[T1S1] == Phase.RUNNING
    assert state.phase[T2S1] == Phase.ADMITTED
    check_invariants(state)


def test_admit_with_resident_prefix_runs_and_counts_a_user():
    state = build(world(), tasks={"t1"})
    make_resident(state, "a")
    kv0 = state.kv_committed
    new = apply(state, Decision(admit=(T1S1,)))
    assert new.phase[T1S1] == Phase.RUNNING
    assert new.prefixes["a"].users == 1
    assert new.prefixes["a"].last_used == new.time
    run = new.running[T1S1]
    assert run.started_at == run.admitted_at == new.time
    assert run.reserved == 10
    assert new.kv_committed == kv0 + 10
    assert T1S1 not in new.waiting and T1S1 not in new.wait_stamp
    assert new.free_slots == float("inf")
    check_invariants(new)


def test_admit_with_absent_prefix_loads_it_then_prefix_ready_starts_it():
    state = build(world(), tasks={"t1", "t2"})
    new = apply(state, Decision(admit=(T1S1,)))
    assert new.phase[T1S1] == Phase.ADMITTED
    assert new.running[T1S1].started_at is None
    assert new.prefixes["a"].status == PrefixStatus.LOADING
    assert new.prefixes["a"].users == 1
    assert new.kv_committed == 10 + 10  # the prefix and the stage's reservation
    check_invariants(new)
    new.time = 3.0
    assert prefix_ready(new, "a") == [T1S1]
    assert new.phase[T1S1] == Phase.RUNNING
    assert new.running[T1S1].started_at == 3.0
    assert new.prefixes["a"].status == PrefixStatus.RESIDENT
    assert new.kv_committed == 20
    check_invariants(new)


def test_two_stages_of_an_absent_agent_load_its_prefix_once():
    inst = make(
        {"a": 10},
        [task("t1", 0, stage("s1", "a", 3, 2)), task("t2", 0, stage("s1", "a", 4, 1))],
        40,
    )
    state = build(inst)
    new = apply(state, Decision(admit=(T1S1, T2S1)))
    assert new.kv_committed == 10 + 5 + 5
    assert new.prefixes["a"].users == 2
    assert sorted(prefix_ready(new, "a")) == [T1S1, T2S1]
    check_invariants(new)


def test_admitting_a_prefetched_loading_prefix_does_not_load_it_again():
    state = build(world(), tasks={"t1"})
    apply_inplace(state, Decision(load=("a",)))
    assert state.kv_committed == 10
    apply_inplace(state, Decision(admit=(T1S1,)))
    assert state.phase[T1S1] == Phase.ADMITTED
    assert state.kv_committed == 20
    check_invariants(state)


# --------------------------------------------------------------------------- infeasible


def _running_t1s1(**kw) -> State:
    state = build(world(**kw), tasks={"t1", "t2"})
    make_resident(state, "a")
    apply_inplace(state, Decision(admit=(T1S1,)))
    return state


INFEASIBLE = {
    "deps unfinished (blocked)": (
        lambda: build(world()),
        Decision(admit=(T1S2,)),
        r"admit t1/s2: stage is blocked, not waiting",
    ),
    "not released": (
        lambda: build(world(), tasks={"t1"}),
        Decision(admit=(T2S1,)),
        r"admit t2/s1: stage is not released",
    ),
    "no such stage": (
        lambda: build(world()),
        Decision(admit=(("t1", "s9"),)),
        r"admit t1/s9: stage is not released",
    ),
    "admit twice in one decision": (
        lambda: build(world()),
        Decision(admit=(T2S1, T2S1)),
        r"admit t2/s1: stage is admitted, not waiting",
    ),
    "admit a running stage": (
        _running_t1s1,
        Decision(admit=(T1S1,)),
        r"admit t1/s1: stage is running, not waiting",
    ),
    "over KV capacity": (
        lambda: build(world(capacity=30)),
        Decision(admit=(T1S1, T2S1)),  # 10 + 10 (a) + 5 + 10 (b) = 35 > 30
        r"needs 35 KV tokens, capacity is 30",
    ),
    "over max_running": (
        lambda: build(world(max_running=1)),
        Decision(admit=(T1S1, T2S1)),
        r"runs 2 stages, max_running is 1",
    ),
    "evict a prefix in use": (
        _running_t1s1,
        Decision(evict=("a",)),
        r"evict 'a': prefix is in use by 1 stage",
    ),
    "evict an absent prefix": (
        lambda: build(world()),
        Decision(evict=("b",)),
        r"evict 'b': prefix is absent, not resident",
    ),
    "evict a loading prefix": (
        lambda: apply(build(world()), Decision(load=("b",))),
        Decision(evict=("b",)),
        r"evict 'b': prefix is loading, not resident",
    ),
    "load a resident prefix": (
        _running_t1s1,
        Decision(load=("a",)),
        r"load 'a': prefix is already resident",
    ),
    "load a loading prefix": (
        lambda: apply(build(world()), Decision(load=("b",))),
        Decision(load=("b",)),
        r"load 'b': prefix is already loading",
    ),
    "load twice in one decision": (
        lambda: build(world()),
        Decision(load=("b", "b")),
        r"load 'b': prefix is already loading",
    ),
    "evict unknown agent": (
        lambda: build(world()),
        Decision(evict=("zz",)),
        r"unknown agent 'zz'",
    ),
    "load unknown agent": (
        lambda: build(world()),
        Decision(load=("zz",)),
        r"unknown agent 'zz'",
    ),
    "preempt a waiting stage": (
        lambda: build(world()),
        Decision(preempt=(T1S1,)),
        r"preempt t1/s1: stage is not running",
    ),
    "preempt an unknown stage": (
        lambda: build(world()),
        Decision(preempt=(("t9", "s1"),)),
        r"preempt t9/s1: stage is not running",
    ),
}


@pytest.mark.parametrize("case", list(INFEASIBLE))
def test_infeasible_decisions_raise_with_a_clear_message(case):
    make_state, decision, message = INFEASIBLE[case]
    state = make_state()
    before = snap(state)
    with pytest.raises(InfeasibleDecision, match=message) as info:
        apply(state, decision)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)
    assert snap(state) == before  # apply works on a copy


def test_capacity_is_checked_after_the_whole_decision():
    # evicting c in the same decision makes room for an admission that needs it
    inst = make({"a": 10, "c": 20}, [task("t1", 0, stage("s1", "a", 12, 8))], 40)
    state = build(inst)
    make_resident(state, "c")
    with pytest.raises(InfeasibleDecision, match="needs 50 KV tokens, capacity is 40"):
        apply(state, Decision(admit=(T1S1,)))
    new = apply(state, Decision(evict=("c",), admit=(T1S1,)))
    assert new.kv_committed == 30
    assert new.phase[T1S1] == Phase.ADMITTED
    check_invariants(new)


# --------------------------------------------------------------------------- preempt


def _kv_with_generated(inst):
    def kv(ref, gen):
        s = inst.stage(ref)
        return s.input_tokens + max(s.output_tokens, gen + 1)

    return kv


def test_preempt_frees_kv_and_slot_and_requeues_at_the_end():
    inst = world(max_running=2)
    state = build(inst, tasks={"t1", "t2"}, kv_need=_kv_with_generated(inst))
    make_resident(state, "a", "b")
    state.generated[T1S1] = 7  # an earlier retraction: kept for the re-prefill
    apply_inplace(state, Decision(admit=(T1S1,)))
    assert state.running[T1S1].generated == 7
    assert state.running[T1S1].reserved == 6 + 8
    state.time = 9.0
    old_stamp = max(state.wait_stamp.values())
    new = apply(state, Decision(preempt=(T1S1,)))
    assert new.phase[T1S1] == Phase.WAITING
    assert T1S1 not in new.running
    assert new.kv_committed == 15  # prefixes a and b only
    assert new.prefixes["a"].users == 0
    assert new.prefixes["a"].status == PrefixStatus.RESIDENT
    assert new.free_slots == 2
    assert list(new.waiting) == [T2S1, T1S1]  # the end of the queue
    assert new.waiting[T1S1] == 9.0
    assert new.wait_stamp[T1S1] > old_stamp
    assert new.generated[T1S1] == 7
    assert new.need(T1S1) == 6 + 8
    assert new.task_epoch["t1"] > state.task_epoch["t1"]
    check_invariants(new)


def test_preempt_an_admitted_stage_keeps_its_prefix_loading():
    state = build(world(), tasks={"t1"})
    apply_inplace(state, Decision(admit=(T1S1,)))
    new = apply(state, Decision(preempt=(T1S1,)))
    assert new.phase[T1S1] == Phase.WAITING
    assert new.prefixes["a"].status == PrefixStatus.LOADING
    assert new.prefixes["a"].users == 0
    assert new.kv_committed == 10
    assert prefix_ready(new, "a") == []
    check_invariants(new)


def test_preempt_keeps_progress_recorded_on_the_running_stage():
    inst = world()
    state = build(inst, tasks={"t1"}, kv_need=_kv_with_generated(inst))
    make_resident(state, "a")
    apply_inplace(state, Decision(admit=(T1S1,)))
    state.running[T1S1].generated = 5  # as the calibrated engine records decode progress
    new = apply(state, Decision(preempt=(T1S1,)))
    assert new.generated.get(T1S1, 0) == 5


# --------------------------------------------------------------------------- completion


def test_complete_stage_unblocks_children_only_when_all_deps_are_done():
    state = build(world(), tasks={"t1", "t2"})
    make_resident(state, "a", "b", "c")
    apply_inplace(state, Decision(admit=(T1S1,)))
    epoch = state.task_epoch["t1"]
    assert complete_stage(state, T1S1, 2.5) == [T1S2, T1S3]
    assert state.phase[T1S1] == Phase.DONE
    assert state.done_service[T1S1] == 2.5
    assert state.unfinished["t1"] == 3
    assert state.task_epoch["t1"] > epoch
    assert state.prefixes["a"].users == 0
    assert state.kv_committed == 35
    assert state.phase[T1S4] == Phase.BLOCKED
    check_invariants(state)

    apply_inplace(state, Decision(admit=(T1S2, T1S3)))
    assert complete_stage(state, T1S2, 1.0) == []
    assert state.phase[T1S4] == Phase.BLOCKED  # s3 is still running
    check_invariants(state)
    assert complete_stage(state, T1S3, 1.0) == [T1S4]
    assert state.phase[T1S4] == Phase.WAITING
    check_invariants(state)


def test_the_last_stage_of_a_task_forgets_the_task():
    state = build(world(), tasks={"t1", "t2"})
    make_resident(state, "a", "b", "c")
    for batch in ([T1S1], [T1S2, T1S3], [T1S4]):
        apply_inplace(state, Decision(admit=tuple(batch)))
        for ref in batch:
            complete_stage(state, ref, 1.0)
    assert "t1" not in state.tasks
    assert "t1" not in state.unfinished
    assert "t1" not in state.task_epoch
    assert not any(ref[0] == "t1" for ref in state.phase)
    assert not any(ref[0] == "t1" for ref in state.done_service)
    assert "t2" in state.tasks and state.phase[T2S1] == Phase.WAITING
    assert state.kv_committed == 35 and not state.running
    check_invariants(state)


# --------------------------------------------------------------------------- copy


def test_copy_is_independent():
    state = build(world(), tasks={"t1", "t2"})
    make_resident(state, "a")
    apply_inplace(state, Decision(admit=(T1S1,)))
    before = snap(state)
    dup = state.copy()
    assert snap(dup) == before
    dup.running[T1S1].generated = 9
    dup.running[T1S1].reserved = 99
    dup.prefixes["a"].users = 7
    dup.prefixes["b"].status = PrefixStatus.RESIDENT
    dup.waiting.pop(T2S1)
    dup.wait_stamp.pop(T2S1)
    dup.phase[T2S1] = Phase.DONE
    dup.generated[T2S1] = 3
    dup.unfinished["t1"] = 0
    dup.task_epoch["t1"] = -1
    dup.done_service[T1S1] = 1.0
    dup.kv_committed = 0
    apply_inplace(dup, Decision(load=("c",)))
    assert snap(state) == before


# --------------------------------------------------------------------------- planner


def planner_world(max_running=None):
    """a (10), b (20), c (30) resident and unused in LRU order a, b, c; d (5) absent.

    Capacity 80: 60 held by prefixes, 20 free.
    """
    inst = make(
        {"a": 10, "b": 20, "c": 30, "d": 5, "e": 25},
        [
            task("small", 0, stage("s", "d", 10, 5)),  # cost 5 + 15 = 20: fits as is
            task("one", 0, stage("s", "d", 20, 5)),  # cost 30: needs one eviction
            task("two", 0, stage("s", "d", 35, 10)),  # cost 50: needs a and b
            task("own", 0, stage("s", "a", 20, 5)),  # a's own stage, cost 25
            task("huge", 0, stage("s", "d", 60, 10)),  # cost 75 <= 20 + 60
        ],
        80,
        max_running=max_running,
    )
    state = build(inst)
    make_resident(state, "a", "b", "c")
    assert state.evictable() == ["a", "b", "c"] and state.free_kv == 20
    return state


def _apply_plan(state, plan) -> State:
    new = apply(state, plan.decision())
    assert new.free_kv == plan.free_kv
    assert new.free_slots == plan.free_slots
    for agent in new.prefixes:
        assert new.prefixes[agent].status == plan.status(agent)
    check_invariants(new)
    return new


def test_try_admit_without_eviction_when_it_fits():
    state = planner_world()
    plan = state.plan()
    assert plan.fits(("small", "s"))
    assert plan.try_admit(("small", "s"))
    assert plan.evict == [] and plan.admit == [("small", "s")]
    assert plan.status("d") == PrefixStatus.LOADING
    assert plan.free_kv == 0
    _apply_plan(state, plan)


@pytest.mark.parametrize(
    ("ref", "order", "evicted"),
    [
        (("one", "s"), None, ["a"]),  # LRU: a first, and only a
        (("two", "s"), None, ["a", "b"]),
        (("one", "s"), ["c", "a", "b"], ["c"]),  # the policy's order
        (("two", "s"), ["b", "a", "c"], ["b", "a"]),
        (("own", "s"), None, ["b"]),  # never its own prefix, although a is LRU
    ],
)
def test_try_admit_evicts_on_demand_in_order_and_only_as_needed(ref, order, evicted):
    state = planner_world()
    before = snap(state)
    plan = state.plan()
    assert not plan.fits(ref)
    assert plan.try_admit(ref, order)
    assert plan.evict == evicted
    assert plan.admit == [ref]
    assert snap(state) == before  # planning never touches the state
    new = _apply_plan(state, plan)
    assert ref in new.running
    assert state.agent_of(ref) not in plan.evict


def test_try_admit_fails_without_changes_when_nothing_can_make_room():
    state = planner_world()
    plan = state.plan()
    assert plan.try_admit(("small", "s"))  # 20 used: free 0, evictable a, b, c = 60
    free, slots = plan.free_kv, plan.free_slots
    statuses = {a: plan.status(a) for a in state.prefixes}
    assert not plan.try_admit(("huge", "s"))  # 75 - 5 (d now loading) = 70 > 60
    assert plan.evict == [] and plan.admit == [("small", "s")]
    assert (plan.free_kv, plan.free_slots) == (free, slots)
    assert {a: plan.status(a) for a in state.prefixes} == statuses
    _apply_plan(state, plan)


def test_try_admit_fails_when_the_only_room_is_in_its_own_prefix():
    inst = make(
        {"a": 30, "b": 10, "c": 5},
        [task("t1", 0, stage("s1", "a", 35, 5)), task("t2", 0, stage("s1", "c", 3, 2))],
        70,
    )
    state = build(inst)
    make_resident(state, "a", "b", "c")
    apply_inplace(state, Decision(admit=(T2S1,)))  # c in use
    assert state.free_kv == 20 and state.evictable() == ["a", "b"]
    plan = state.plan()
    # needs 40 with a resident: evicting b gives 30 only, and evicting a is no use
    assert not plan.try_admit(T1S1)
    assert plan.evict == [] and plan.admit == [] and plan.free_kv == 20
    assert plan.status("a") == PrefixStatus.RESIDENT


def test_try_admit_keeps_earlier_evictions_when_a_later_stage_fails():
    state = planner_world()
    plan = state.plan()
    assert plan.try_admit(("one", "s"))
    assert plan.evict == ["a"]
    assert not plan.try_admit(("huge", "s"), ["b"])  # only b offered: not enough
    assert plan.evict == ["a"] and plan.admit == [("one", "s")]
    _apply_plan(state, plan)


def test_try_admit_evicts_only_from_the_given_order():
    state = planner_world()
    plan = state.plan()
    assert not plan.try_admit(("two", "s"), ["b"])  # b alone: 50 > 20 + 20
    assert plan.evict == [] and plan.admit == []
    assert plan.try_admit(("two", "s"), ["c", "a"])
    assert plan.evict == ["c"] and plan.admit == [("two", "s")]  # 20 + 30 = 50: c suffices
    _apply_plan(state, plan)


def test_an_evicted_prefix_costs_its_tokens_again():
    inst = make(
        {"a": 10, "d": 5},
        [task("t1", 0, stage("s1", "d", 10, 5)), task("t2", 0, stage("s1", "a", 1, 1))],
        40,
    )
    state = build(inst)
    make_resident(state, "a")
    plan = state.plan()
    assert plan.try_admit(T1S1)  # 20 of 30 free
    assert plan.cost(T2S1) == 2
    assert plan.try_admit(T2S1)
    plan = state.plan()
    plan.do_evict("a")
    assert plan.cost(T2S1) == 12
    assert plan.status("a") == PrefixStatus.ABSENT
    with pytest.raises(InfeasibleDecision, match="cannot evict 'a'"):
        plan.do_evict("a")
    _apply_plan(state, plan)


def test_try_admit_respects_free_slots():
    state = planner_world(max_running=2)
    plan = state.plan()
    assert plan.try_admit(("small", "s"))
    assert plan.try_admit(("own", "s"))
    assert plan.free_slots == 0
    before = (plan.free_kv, list(plan.evict), list(plan.admit))
    assert not plan.try_admit(("one", "s"))  # KV could be made, no slot
    assert (plan.free_kv, plan.evict, plan.admit) == before
    _apply_plan(state, plan)


def test_do_load_only_when_it_fits_without_eviction():
    state = planner_world()
    plan = state.plan()
    assert not plan.do_load("e")  # 25 > 20 free, though a, b, c could be evicted
    assert not plan.do_load("a")  # resident
    assert plan.do_load("d")
    assert not plan.do_load("d")  # already loading in the plan
    assert plan.status("d") == PrefixStatus.LOADING and plan.free_kv == 15
    assert plan.load == ["d"] and plan.evict == []
    plan.do_evict("b")
    assert not plan.do_load("b")  # evicted in this plan
    assert plan.do_load("e")  # fits now: 15 + 20 = 35 >= 25
    new = _apply_plan(state, plan)
    assert new.prefixes["e"].status == PrefixStatus.LOADING


def test_try_admit_accepts_any_iterable_as_evict_order():
    state = planner_world()
    plan = state.plan()
    assert plan.try_admit(("one", "s"), iter(["c", "a", "b"]))
    assert plan.evict == ["c"]


# --------------------------------------------------------------------------- property


def _random_plan(state: State, rnd: random.Random):
    plan = state.plan()
    order = list(state.waiting)
    rnd.shuffle(order)
    evict_order = None
    if rnd.random() < 0.5:
        evict_order = state.evictable()
        rnd.shuffle(evict_order)
        evict_order = evict_order[: rnd.randint(0, len(evict_order))]
    agents = sorted(state.prefixes)
    for ref in order:
        if rnd.random() < 0.2:
            plan.do_load(rnd.choice(agents))
        if rnd.random() < 0.1 and plan.evictable():
            plan.do_evict(rnd.choice(plan.evictable()))
        if rnd.random() < 0.8:
            plan.try_admit(ref, evict_order)
    if rnd.random() < 0.5:
        plan.do_load(rnd.choice(agents))
    return plan


OPS = ["release"] * 2 + ["plan"] * 4 + ["ready"] * 3 + ["complete"] * 3 + ["preempt", "evict"]


def _random_walk(inst, rnd: random.Random, steps: int, on_plan=None) -> State:
    def kv_need(ref, gen):  # the calibrated engine's reservation, clipped to fit alone
        s = inst.stage(ref)
        room = inst.server.kv_capacity_tokens - inst.agent_by_id[s.agent].prefix_tokens
        return min(s.input_tokens + max(s.predicted_output, gen + 1), room)

    state = State.initial(inst, kv_need)
    pending = sorted(inst.tasks, key=lambda t: t.arrival)
    for _ in range(steps):
        op = rnd.choice(OPS)
        state.time += rnd.choice([0.0, 0.5, 1.0])
        if op == "release" and pending:
            t = pending.pop(0)
            state.time = max(state.time, t.arrival)
            task_arrives(state, TaskInfo.of(t, state.time))
        elif op == "plan":
            plan = _random_plan(state, rnd)
            before = snap(state)
            new = apply(state, plan.decision())  # never raises
            assert snap(state) == before
            assert new.free_kv == plan.free_kv and new.free_slots == plan.free_slots
            if on_plan is not None:
                on_plan(state, plan, new)
            state = new
        elif op == "ready":
            loading = [a for a, p in state.prefixes.items() if p.status == PrefixStatus.LOADING]
            if loading:
                prefix_ready(state, rnd.choice(sorted(loading)))
        elif op == "complete":
            running = [r for r in state.running if state.phase[r] == Phase.RUNNING]
            if running:
                complete_stage(state, rnd.choice(running), 1.0)
        elif op == "preempt" and state.running:
            ref = rnd.choice(list(state.running))
            state.generated[ref] = rnd.randint(0, inst.stage(ref).output_tokens - 1)
            apply_inplace(state, Decision(preempt=(ref,)))
        elif op == "evict" and state.evictable():
            apply_inplace(state, Decision(evict=(rnd.choice(state.evictable()),)))
        check_invariants(state)
    return state


@given(inst=random_instances(max_tasks=3, max_stages=4), rnd=st.randoms(use_true_random=False))
def test_planner_decisions_are_always_feasible(inst, rnd):
    _random_walk(inst, rnd, rnd.randint(10, 60))


@given(inst=random_instances(max_tasks=3, max_stages=4), rnd=st.randoms(use_true_random=False))
def test_take_while_fits_is_cost_then_admit_priced_up_to_the_first_misfit(inst, rnd):
    def check(state, _plan, _new):  # type: ignore[no-untyped-def]
        order = list(state.waiting)
        rnd.shuffle(order)
        one, many = state.plan(), state.plan()
        for plan in (one, many):  # a prefetch in play: a LOADING prefix costs nothing more
            for agent in sorted(state.prefixes)[:1]:
                plan.do_load(agent)
        stop, after = None, None
        for i, ref in enumerate(order):  # the loop take_while_fits stands for
            if one.free_slots < 1:
                break
            cost = one.cost(ref)
            if cost > one.free_kv:
                stop, after = (ref, cost), order[i + 1 : i + 2]
                break
            one.admit_priced(ref, cost)
        rest = iter(order)
        assert many.take_while_fits(rest) == stop
        if stop is not None:  # the misfit is taken from the iterator, nothing after it
            assert list(itertools.islice(rest, 1)) == after
        assert many.decision() == one.decision()
        assert (many.free_kv, many.free_slots) == (one.free_kv, one.free_slots)
        assert all(many.status(a) == one.status(a) for a in state.prefixes)
        _apply_plan(state, many)

    _random_walk(inst, rnd, rnd.randint(10, 60), on_plan=check)


# --------------------------------------------------------------------------- WaitingQueue


def queue_world(n=4, max_running=None):
    """``n`` single-stage tasks of one resident agent, released one time unit apart."""
    inst = make(
        {"a": 1},
        [task(f"t{i}", i, stage("s", "a", 10 + (i * 7) % n, 1)) for i in range(n)],
        1 + n * (11 + n),
        max_running=max_running,
    )
    state = State.initial(inst, kv_of(inst))
    make_resident(state, "a")
    for t in inst.tasks:
        state.time = t.arrival
        task_arrives(state, TaskInfo.of(t, t.arrival))
    return state


def longest_input(state, ref):
    return (-state.stage(ref).input_tokens, ref)


def test_waiting_queue_admits_in_key_order():
    state = queue_world(5)
    plan = WaitingQueue(longest_input).admit(state)
    expected = sorted(state.waiting, key=lambda r: longest_input(state, r))
    assert plan.admit == expected
    assert plan.admit != list(state.waiting)
    plan = WaitingQueue(fcfs_key).admit(state)
    assert plan.admit == list(state.waiting)


def test_waiting_queue_stops_at_the_first_misfit():
    inst = make(
        {"a": 1},
        [
            task("t0", 0, stage("s", "a", 3, 1)),
            task("t1", 1, stage("s", "a", 20, 1)),
            task("t2", 2, stage("s", "a", 3, 1)),
        ],
        22,
    )
    state = build(inst)
    make_resident(state, "a")
    plan = WaitingQueue(fcfs_key).admit(state)
    assert plan.admit == [("t0", "s")]  # t1 does not fit; t2 would, but waits (PrefillAdder)


def test_waiting_queue_respects_free_slots_and_keeps_the_rest():
    state = queue_world(5, max_running=2)
    queue = WaitingQueue(fcfs_key)
    plan = queue.admit(state)
    assert plan.admit == list(state.waiting)[:2]
    state = apply(state, plan.decision())
    complete_stage(state, plan.admit[0], 1.0)
    plan2 = queue.admit(state)
    assert plan2.admit == list(state.waiting)[:1]


def test_waiting_queue_sees_a_requeued_stage_once_at_its_new_position():
    state = queue_world(4)
    queue = WaitingQueue(fcfs_key)
    first = list(state.waiting)
    assert queue.admit(state).admit == first
    state = apply(state, Decision(admit=(first[0], first[1])))
    assert queue.admit(state).admit == first[2:]
    state.time = 10.0
    state = apply(state, Decision(preempt=(first[0],)))
    plan = queue.admit(state)
    assert plan.admit == [first[2], first[3], first[0]]
    # a key that does not change with the requeue: still seen once
    state = apply(state, Decision(preempt=(first[1],)))
    plan = queue.admit(state)
    assert plan.admit == [first[2], first[3], first[0], first[1]]
    queue2 = WaitingQueue(longest_input)
    queue2.admit(state)
    state = apply(state, Decision(admit=(first[1],)))
    state = apply(state, Decision(preempt=(first[1],)))
    plan = queue2.admit(state)
    assert sorted(plan.admit) == sorted(state.waiting)
    assert len(plan.admit) == len(set(plan.admit))


def test_waiting_queue_drops_stale_entries():
    state = queue_world(80)
    queue = WaitingQueue(fcfs_key)
    plan = queue.admit(state)
    assert len(plan.admit) == 80 and len(queue.heap) == 80
    state = apply(state, plan.decision())
    queue.sync(state)  # no admission loop: the entries go by the compaction alone
    assert queue.heap == []
    assert queue.admit(state).admit == []


def test_a_decision_not_applied_leaves_the_queue_intact():
    state = queue_world(6, max_running=3)
    queue = WaitingQueue(longest_input)
    a = queue.admit(state).decision()
    heap = sorted(queue.heap)
    b = queue.admit(state).decision()
    assert a == b and len(a.admit) == 3
    assert sorted(queue.heap) == heap
    # and a stage that did not fit is still offered next time
    qstate = queue_world(3)
    qstate.capacity = qstate.kv_committed + 5  # nothing fits
    queue = WaitingQueue(fcfs_key)
    assert queue.admit(qstate).admit == []
    qstate.capacity = 10**6
    assert queue.admit(qstate).admit == list(qstate.waiting)


def test_stamps_belong_to_the_state_and_its_copies():
    # A process-global counter made a run's stamps depend on what ran before it in the
    # same process; each state now owns its counter, and a copy shares it, so stamps
    # stay unique between a state and its copies (policies compare them across both).
    inst = make({"A": 10}, [task("t0", 0, stage("s", "A", 5, 5))], capacity=100)

    def first_stamps() -> tuple[int, int]:
        state = build(inst)
        return state.wait_stamp[("t0", "s")], state.task_epoch["t0"]

    assert first_stamps() == first_stamps()
    state = build(inst)
    twin = state.copy()
    stamp_task(state, "t0")
    stamp_task(twin, "t0")
    assert state.task_epoch["t0"] != twin.task_epoch["t0"]
