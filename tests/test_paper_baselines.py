"""The TOPAS paper's evaluation baselines: ``spf`` (task-level SRPT), ``parrot-fcfs``
(Parrot's application-level FCFS) and ``las`` (Autellix's PLAS).

Each is pinned on hand-built States (no simulator) where their orders differ from
each other and from ``fcfs``, then run through the simulator with every invariant
checked.
"""

from __future__ import annotations

import time

import pytest
from conftest import kv_of, make, stage, task

from topas import workloads
from topas.policies import BASELINES, REGISTRY, Policy, PolicyContext, make_policy
from topas.policies.baselines import LAS, SPF, ParrotFCFS
from topas.schedule import evaluate
from topas.simulator import simulate
from topas.state import (
    Decision,
    State,
    TaskInfo,
    apply,
    apply_inplace,
    complete_stage,
    prefix_ready,
    task_arrives,
)

NEW = ("spf", "parrot-fcfs", "las")

# --------------------------------------------------------------------------- helpers


def ready(spec: str, inst, timing: str = "step") -> Policy:
    policy = make_policy(spec)
    policy.reset(PolicyContext(server=inst.server, timing=timing))
    return policy


def resident_state(inst, *agents: str) -> State:
    state = State.initial(inst, kv_of(inst))
    for agent in agents:
        apply_inplace(state, Decision(load=(agent,)))
        prefix_ready(state, agent)
    return state


def release(state: State, inst, tid: str, at: float) -> None:
    state.time = at
    t = inst.task_by_id[tid]
    task_arrives(state, TaskInfo.of(t, t.arrival))


def start(state: State, *refs) -> None:
    apply_inplace(state, Decision(admit=tuple(refs)))


def finish(state: State, ref, at: float, service: float) -> None:
    state.time = at
    complete_stage(state, ref, service)


# --------------------------------------------------------------------------- four orders

A2, B2, C1, D2 = ("A", "s2"), ("B", "s2"), ("C", "s1"), ("D", "s2")


def four_orders_world(capacity: int = 100):
    """Four tasks, one waiting stage each, at time 5 (step model, chunk 10, step_s 1).

    task  release  waiting  ready at  attained (finished s1)  remaining predicted work
    A     0        A/s2     4         4 (A/s1 ran 4 s)        ceil(10/10) +  4 =  5
    B     1        B/s2     2         1 (B/s1 ran 1 s)        ceil(10/10) +  7 =  8
    C     2        C/s1     2         0 (a root)              ceil(10/10) + 11 = 12
    D     3        D/s2     5         2 (D/s1 ran 2 s)        ceil(10/10) +  1 =  2

    KV needs (input + output): A/s2 14, B/s2 17, C/s1 21, D/s2 11; prefix a is 10.
    """
    inst = make(
        {"a": 10},
        [
            task("A", 0, stage("s1", "a", 1, 1), stage("s2", "a", 10, 4, ["s1"])),
            task("B", 1, stage("s1", "a", 1, 1), stage("s2", "a", 10, 7, ["s1"])),
            task("C", 2, stage("s1", "a", 10, 11)),
            task("D", 3, stage("s1", "a", 1, 1), stage("s2", "a", 10, 1, ["s1"])),
        ],
        capacity,
    )
    state = resident_state(inst, "a")
    release(state, inst, "A", 0)
    start(state, ("A", "s1"))
    release(state, inst, "B", 1)
    start(state, ("B", "s1"))
    finish(state, ("B", "s1"), 2, 1.0)  # B/s2 ready at 2
    release(state, inst, "C", 2)  # C/s1 ready at 2, after B/s2 (B was released first)
    release(state, inst, "D", 3)
    start(state, ("D", "s1"))
    finish(state, ("A", "s1"), 4, 4.0)  # A/s2 ready at 4
    finish(state, ("D", "s1"), 5, 2.0)  # D/s2 ready at 5
    assert set(state.waiting) == {A2, B2, C1, D2} and not state.running
    return inst, state


@pytest.mark.parametrize(
    ("spec", "order"),
    [
        # ready time: B/s2 and C/s1 at 2 (B released first), A/s2 at 4, D/s2 at 5
        ("fcfs", [B2, C1, A2, D2]),
        # task release: A 0, B 1, C 2, D 3, although A/s2 became ready after B/s2, C/s1
        ("parrot-fcfs", [A2, B2, C1, D2]),
        # remaining work: D 2, A 5, B 8, C 12; D arrived last and became ready last
        ("spf", [D2, A2, B2, C1]),
        # attained service: C 0, B 1, D 2, A 4; A arrived first and is most served
        ("las", [C1, B2, D2, A2]),
    ],
)
def test_the_orders_differ(spec, order):
    inst, state = four_orders_world()
    policy = ready(spec, inst)
    decision = policy.decide(state)
    assert list(decision.admit) == order  # 100 - 10 (prefix) = 90 free: all 63 fit
    apply(state, decision)
    assert policy.decide(state) == decision  # not applied: same answer


@pytest.mark.parametrize(
    ("spec", "admitted"),
    [
        ("fcfs", [B2]),  # B/s2 17, then C/s1 21: 38 > 30, stop
        ("parrot-fcfs", [A2]),  # A/s2 14, then B/s2 17: 31 > 30, stop
        ("spf", [D2, A2]),  # D/s2 11 + A/s2 14 = 25, then B/s2 17: 42 > 30, stop
        ("las", [C1]),  # C/s1 21, then B/s2 17: 38 > 30, stop
    ],
)
def test_admission_stops_at_the_first_misfit(spec, admitted):
    inst, state = four_orders_world(capacity=40)  # 30 free after the prefix
    decision = ready(spec, inst).decide(state)
    assert list(decision.admit) == admitted
    assert apply(state, decision).kv_committed <= 40


def test_parrot_within_a_task_the_stage_ready_first():
    """T1 (released 0): T1/s3 ready at 0, T1/s2 ready at 3 (after T1/s1); T2 (released
    1): T2/s1 ready at 1. Parrot serves all of T1 first; fcfs interleaves by ready time."""
    inst = make(
        {"a": 10},
        [
            task(
                "T1",
                0,
                stage("s1", "a", 1, 1),
                stage("s2", "a", 5, 5, ["s1"]),
                stage("s3", "a", 5, 5),
            ),
            task("T2", 1, stage("s1", "a", 5, 5)),
        ],
        100,
    )
    state = resident_state(inst, "a")
    release(state, inst, "T1", 0)
    start(state, ("T1", "s1"))
    release(state, inst, "T2", 1)
    finish(state, ("T1", "s1"), 3, 3.0)
    parrot = ready("parrot-fcfs", inst).decide(state).admit
    assert list(parrot) == [("T1", "s3"), ("T1", "s2"), ("T2", "s1")]
    fcfs = ready("fcfs", inst).decide(state).admit
    assert list(fcfs) == [("T1", "s3"), ("T2", "s1"), ("T1", "s2")]


# --------------------------------------------------------------------------- spf is SRPT


def test_spf_on_chains_is_srpt():
    """X (released 0) is a chain x1 -> x2 -> x3 with x1 done: x2 (2) then x3 (10) remain,
    12 in all. Y (released 1) is a chain y1 -> y2 with y1 done: only y2 (3) remains.
    SRPT runs Y first, although X arrived and became ready first and x2 alone is
    shorter than y2 (a stage-level shortest-first would take x2)."""
    inst = make(
        {"a": 10},
        [
            task(
                "X",
                0,
                stage("x1", "a", 1, 1),
                stage("x2", "a", 10, 1, ["x1"]),  # 1 + 1 = 2
                stage("x3", "a", 10, 9, ["x2"]),  # 1 + 9 = 10
            ),
            task("Y", 1, stage("y1", "a", 1, 1), stage("y2", "a", 10, 2, ["y1"])),  # 3
        ],
        100,
    )
    state = resident_state(inst, "a")
    release(state, inst, "X", 0)
    release(state, inst, "Y", 1)
    start(state, ("X", "x1"), ("Y", "y1"))
    finish(state, ("X", "x1"), 2, 2.0)
    finish(state, ("Y", "y1"), 3, 2.0)
    assert list(ready("spf", inst).decide(state).admit) == [("Y", "y2"), ("X", "x2")]
    assert list(ready("fcfs", inst).decide(state).admit) == [("X", "x2"), ("Y", "y2")]
    state.max_running = 1
    assert ready("spf", inst).decide(state).admit == (("Y", "y2"),)


# --------------------------------------------------------------------------- fresh keys

P1, P2, Q1 = ("P", "p1"), ("P", "p2"), ("Q", "q1")


def sibling_world():
    """P (released 0): parallel roots p1 (1 + 19 = 20, running) and p2 (1 + 1 = 2,
    waiting). Q (released 1): q1 (1 + 9 = 10, waiting)."""
    inst = make(
        {"a": 10},
        [
            task("P", 0, stage("p1", "a", 10, 19), stage("p2", "a", 10, 1)),
            task("Q", 1, stage("q1", "a", 10, 9)),
        ],
        100,
    )
    state = resident_state(inst, "a")
    release(state, inst, "P", 0)
    start(state, P1)
    release(state, inst, "Q", 1)
    return inst, state


def test_spf_keys_follow_a_finishing_sibling():
    inst, state = sibling_world()
    policy = ready("spf", inst)
    # P has 20 + 2 = 22 left, Q 10
    assert list(policy.decide(state).admit) == [Q1, P2]
    finish(state, P1, 20, 20.0)
    # the same policy: P now has 2 left, Q still 10
    assert list(policy.decide(state).admit) == [P2, Q1]


def test_spf_subtracts_what_a_running_stage_has_decoded():
    inst, state = sibling_world()
    policy = ready("spf", inst)
    assert list(policy.decide(state).admit) == [Q1, P2]
    state.running[P1].generated = 17  # no phase change: p1 has 19 - 17 = 2 tokens left
    # P: 2 + 2 = 4 left (the prefill of p1 is over), Q 10
    assert list(policy.decide(state).admit) == [P2, Q1]
    state.running[P1].generated = 5  # P: 14 + 2 = 16 > 10
    assert list(policy.decide(state).admit) == [Q1, P2]


def test_las_keys_follow_a_finishing_sibling():
    inst, state = sibling_world()
    policy = ready("las", inst)
    # neither task has attained service (p1 still runs): FCFS, p2 ready at 0, q1 at 1
    assert list(policy.decide(state).admit) == [P2, Q1]
    finish(state, P1, 20, 20.0)
    # the same policy: P has attained 20, Q 0
    assert list(policy.decide(state).admit) == [Q1, P2]


def test_las_sums_the_task_where_atlas_takes_the_path():
    """R: roots r1 (ran 5) and r2 (ran 6), r3 after r1 waits. S: s1 (ran 8), s2 after
    s1 waits. Along r3's path R attained 5 < 8 (atlas: r3 first); in all R attained
    11 > 8 (las: s2 first)."""
    inst = make(
        {"a": 10},
        [
            task(
                "R",
                0,
                stage("r1", "a", 1, 1),
                stage("r2", "a", 1, 1),
                stage("r3", "a", 5, 5, ["r1"]),
            ),
            task("S", 1, stage("s1", "a", 1, 1), stage("s2", "a", 5, 5, ["s1"])),
        ],
        100,
    )
    state = resident_state(inst, "a")
    release(state, inst, "R", 0)
    release(state, inst, "S", 1)
    start(state, ("R", "r1"), ("R", "r2"), ("S", "s1"))
    finish(state, ("R", "r1"), 5, 5.0)
    finish(state, ("R", "r2"), 6, 6.0)
    finish(state, ("S", "s1"), 8, 8.0)
    assert list(ready("las", inst).decide(state).admit) == [("S", "s2"), ("R", "r3")]
    assert list(ready("atlas", inst).decide(state).admit) == [("R", "r3"), ("S", "s2")]


# --------------------------------------------------------------------------- simulator


def _run(spec: str, inst, timing: str):
    sched = simulate(inst, make_policy(spec), timing=timing, debug=True)
    evaluate(sched)  # raises unless every stage finished exactly once
    n_stages = sum(len(t.stages) for t in inst.tasks)
    assert len(sched.completed()) == n_stages
    return sched


@pytest.mark.parametrize("spec", NEW)
@pytest.mark.parametrize(
    ("family", "timing"),
    [("fanout", "step"), ("metagpt-sop", "calibrated")],
)
def test_simulated_runs_finish_and_are_deterministic(spec, family, timing):
    if family == "fanout":
        inst = workloads.small_instance("fanout", seed=1)
    else:
        inst = workloads.generate("metagpt-sop", num_tasks=10, seed=1)
    a = _run(spec, inst, timing)
    b = _run(spec, inst, timing)
    assert a.to_dict() == b.to_dict()


# --------------------------------------------------------------------------- registry


@pytest.mark.parametrize(("spec", "cls"), [("spf", SPF), ("parrot-fcfs", ParrotFCFS), ("las", LAS)])
def test_registered_as_baselines(spec, cls):
    policy = make_policy(spec)
    assert type(policy) is cls and REGISTRY[spec] is cls
    assert policy.name == spec and policy.spec() == spec
    assert policy.event_driven
    assert spec in BASELINES


def test_a_decision_at_a_thousand_waiting_stages_is_fast():
    """1,000 waiting stages in 250 four-stage fan-out tasks (one stage of each done)."""
    tasks = [
        task(
            f"t{j}",
            j,
            stage("s0", "a", 1, 1),
            *(stage(f"s{k}", "a", 10 + k, 5 + j % 7, ["s0"]) for k in range(1, 5)),
        )
        for j in range(250)
    ]
    inst = make({"a": 10}, tasks, 200, max_running=4)
    state = resident_state(inst, "a")
    for j in range(250):
        release(state, inst, f"t{j}", j)
    for j in range(250):
        state.time = 250 + j
        ref = (f"t{j}", "s0")
        apply_inplace(state, Decision(admit=(ref,)))
        complete_stage(state, ref, 1.0 + j % 5)
    assert len(state.waiting) == 1000
    for spec in NEW:
        policy = ready(spec, inst)
        policy.decide(state)
        t0 = time.perf_counter()
        for _ in range(5):
            policy.decide(state)
        per_call = (time.perf_counter() - t0) / 5
        assert per_call < 0.05, f"{spec}: {per_call * 1e3:.1f} ms per decision"
