"""Hand-solved step-model instances: the expected JCTs are worked out in the comments.

All use ``step_s = 1`` so seconds are steps. Durations (DESIGN rule 2):
``d = ceil(input/chunk) + output``, recompute load ``l = ceil(prefix/chunk)``.
"""

from __future__ import annotations

import pytest
from conftest import make, stage, task

from topas.policies import BASELINES, Policy, make_policy
from topas.schedule import evaluate
from topas.simulator import MAX_PREEMPTIONS, SimulationError, simulate
from topas.state import Decision
from topas.verify import verify_step


def run(inst, spec):
    sched = simulate(inst, make_policy(spec), timing="step", debug=True)
    verify_step(sched)
    return evaluate(sched)


@pytest.mark.parametrize("spec", BASELINES)
def test_single_stage(spec):
    # Prefix 20 tokens, chunk 10: load l = 2 steps (0..1). Stage input 5, output 3:
    # d = ceil(5/10) + 3 = 4, starts at 2 when the prefix is resident, ends at 6.
    inst = make({"a": 20}, [task("t0", 0, stage("s", "a", 5, 3))], capacity=100)
    m = run(inst, spec)
    assert m.jct == {"t0": 6.0}
    assert m.prefix_loads == 1 and m.prefix_hit_rate == 0.0


@pytest.mark.parametrize("spec", BASELINES)
def test_release_rounds_up(spec):
    # step_s = 2, arrival 3.0 -> release step ceil(1.5) = 2 (4.0 s). l = 1, d = 1 + 1 = 2:
    # admitted at step 2, resident at 3, ends at 5. JCT = (5 - 2) steps = 6.0 s.
    inst = make(
        {"a": 10},
        [task("t0", 3.0, stage("s", "a", 5, 1))],
        capacity=100,
        cost={"kind": "step", "step_s": 2.0},
    )
    m = run(inst, spec)
    assert m.jct == {"t0": 6.0}
    assert m.objective_steps == 3


# Memory trade-off: M = 50 holds one prefix (30) and one stage (10), never two prefixes.
# t0 (agent a, arrives 0), t1 (agent b, arrives 1), t2 (agent a, arrives 2); each stage
# input 5 output 5: d = 6; prefixes 30: l = 3.
TRADEOFF = dict(
    agents={"a": 30, "b": 30},
    tasks=[
        task("t0", 0, stage("s", "a", 5, 5)),
        task("t1", 1, stage("s", "b", 5, 5)),
        task("t2", 2, stage("s", "a", 5, 5)),
    ],
    capacity=50,
)


@pytest.mark.parametrize("spec", ["fcfs", "cpf", "atlas", "kvflow"])
def test_tradeoff_fcfs_order(spec):
    # t0: load a 0..2, runs 3..8 (ends 9). t1 needs b (30) + 10 but only 10 is free:
    # the first waiting stage does not fit, so admission stops (PrefillAdder), and t2
    # waits behind it although it would fit. At 9: evict a (LRU), load b 9..11, t1
    # runs 12..17 (ends 18). At 18: evict b, load a 18..20, t2 runs 21..26 (ends 27).
    # JCT: 9, 18-1 = 17, 27-2 = 25. (cpf/atlas: equal keys, FCFS ties; kvflow:
    # FCFS admission, no room to prefetch.)
    m = run(make(**TRADEOFF), spec)
    assert m.jct == {"t0": 9.0, "t1": 17.0, "t2": 25.0}
    assert m.objective_steps == 51
    assert m.prefix_loads == 3


def test_tradeoff_lpm():
    # LPM: at 3 prefix a becomes resident, so t2 (matched 30) sorts before t1 (0) and
    # fits in the free 10 tokens: runs 3..8 (ends 9, JCT 7). At 9 both t0 and t2 end;
    # t1 evicts a, loads b 9..11, runs 12..17, ends 18 (JCT 17). Sum 9 + 17 + 7 = 33.
    m = run(make(**TRADEOFF), "lpm")
    assert m.jct == {"t0": 9.0, "t1": 17.0, "t2": 7.0}
    assert m.objective_steps == 33
    assert m.prefix_hit_rate == pytest.approx(1 / 3)


CHAIN = dict(
    agents={"a": 20, "b": 30},
    tasks=[task("t0", 0, stage("s1", "a", 5, 3), stage("s2", "b", 5, 3, deps=["s1"]))],
    capacity=100,
)


@pytest.mark.parametrize("spec", ["fcfs", "lpm", "cpf", "atlas"])
def test_chain_loads_on_demand(spec):
    # s1: load a 0..1, runs 2..5 (ends 6). s2: admitted at 6, load b 6..8, runs 9..12,
    # ends 13. JCT 13.
    assert run(make(**CHAIN), spec).jct == {"t0": 13.0}


def test_chain_kvflow_prefetches_the_next_agent():
    # KVFlow: at 0, s2 is one step from execution, so b is prefetched 0..2 alongside
    # a's load; s2 starts at 6 with b resident and ends at 10. JCT 10.
    m = run(make(**CHAIN), "kvflow")
    assert m.jct == {"t0": 10.0}
    assert m.prefix_hit_rate == 0.5


def test_kvflow_without_prefetch_is_on_demand():
    assert run(make(**CHAIN), "kvflow:prefetch=0").jct == {"t0": 13.0}


# One slot (max_running=1), one agent a (10 tokens: l = 1). t0: a long stage x
# (in 5, out 9: d = 10). t1: y1 (d = 2) then y2 (d = 10).
SLOT = dict(
    agents={"a": 10},
    tasks=[
        task("t0", 0, stage("x", "a", 5, 9)),
        task("t1", 0, stage("y1", "a", 5, 1), stage("y2", "a", 5, 9, deps=["y1"])),
    ],
    capacity=1000,
    max_running=1,
)


@pytest.mark.parametrize("spec", ["fcfs", "lpm", "atlas", "kvflow"])
def test_one_slot_fcfs(spec):
    # Ties on ready time and arrival break by task id: x first, load 0..0, runs 1..10
    # (ends 11); y1 11..12 (ends 13); y2 13..22 (ends 23). JCT 11 and 23: sum 34.
    m = run(make(**SLOT), spec)
    assert m.jct == {"t0": 11.0, "t1": 23.0}


def test_one_slot_cpf_takes_the_longest_path():
    # CPF: tail(y1) = 2 + 10 = 12 > tail(x) = 10, so y1 first: runs 1..2 (ends 3);
    # at 3 x and y2 tie at 10, FCFS: x (ready 0) runs 3..12 (ends 13), y2 13..22
    # (ends 23). JCT 13 and 23: sum 36 (CPF minimises the makespan, not the sum).
    m = run(make(**SLOT), "cpf")
    assert m.jct == {"t0": 13.0, "t1": 23.0}


# ATLAS vs FCFS. One slot, agent a (10: l = 1). t0: z1 (in 5 out 3: d = 4) then z2, z3
# (d = 2 each) after z1. t1 arrives at 6: v (d = 2).
ATTAINED = dict(
    agents={"a": 10},
    tasks=[
        task(
            "t0",
            0,
            stage("z1", "a", 5, 3),
            stage("z2", "a", 5, 1, deps=["z1"]),
            stage("z3", "a", 5, 1, deps=["z1"]),
        ),
        task("t1", 6, stage("v", "a", 5, 1)),
    ],
    capacity=1000,
    max_running=1,
)


def test_attained_fcfs():
    # z1 loads 0..0, runs 1..4 (ends 5); z2 5..6 (ends 7); at 7 z3 (ready 5) goes before
    # v (ready 6): z3 ends 9, v ends 11. JCT t0 = 9, t1 = 11 - 6 = 5.
    assert run(make(**ATTAINED), "fcfs").jct == {"t0": 9.0, "t1": 5.0}


def test_attained_atlas():
    # ATLAS: at 7, z3's path has attained 4 steps (z1), v none: v ends 9, z3 ends 11.
    # JCT t0 = 11, t1 = 9 - 6 = 3.
    assert run(make(**ATTAINED), "atlas").jct == {"t0": 11.0, "t1": 3.0}


def test_host_load_steps():
    # Host load at 10 tokens/s with step_s = 1: l = max(1, ceil(25/10)) = 3 (0..2);
    # the stage (d = 1 + 2 = 3) runs 3..5, ends 6.
    inst = make(
        {"a": 25},
        [task("t0", 0, stage("s", "a", 5, 2))],
        capacity=100,
        load={"kind": "host", "tokens_per_s": 10.0},
    )
    assert run(inst, "fcfs").jct == {"t0": 6.0}


def test_recompute_load_is_separate_from_the_prefill():
    # Rule 2: l + ceil(input/chunk), never ceil((p + input)/chunk). p = 5, input 5,
    # chunk 10: l = 1 and d = 1 + 1: the stage ends at 1 + 2 = 3, not 2.
    inst = make({"a": 5}, [task("t0", 0, stage("s", "a", 5, 1))], capacity=100)
    assert run(inst, "fcfs").jct == {"t0": 3.0}


def test_evaluate_derives_prefix_hits_from_the_prefix_intervals():
    # KVFlow on CHAIN: s1 is admitted at 0 while a loads (a miss), s2 at 6 with b resident
    # since 2 (a hit). A schedule that claims every run was a hit, or none, gets the same
    # rate: evaluate reads the prefix intervals, not the runs' own flags.
    import dataclasses

    from topas.schedule import prefix_hits

    sched = simulate(make(**CHAIN), make_policy("kvflow"), timing="step")
    assert prefix_hits(sched) == [False, True]
    for claim in (True, False):
        sched.runs = [dataclasses.replace(r, prefix_hit=claim) for r in sched.runs]
        assert evaluate(sched).prefix_hit_rate == 0.5
    # a live schedule has no prefix intervals: the server's report is all there is
    live = dataclasses.replace(sched, timing="live", prefixes=[])
    live.runs = [dataclasses.replace(r, prefix_hit=True) for r in sched.runs]
    assert prefix_hits(live) == [True, True]


class StartStop(Policy):
    """Starts the waiting stage, stops it at the next consultation, starts it again...:
    a livelock. It asks to be consulted again at once (the step model's next step, the
    calibrated engine's next iteration), before the stage has made any progress."""

    name = "start-stop"

    def decide(self, state):  # type: ignore[no-untyped-def]
        wake = state.time + 1e-4
        if state.running:
            return Decision(preempt=tuple(sorted(state.running)), wake_at=wake)
        return Decision(admit=tuple(sorted(state.waiting))[:1], wake_at=wake)


@pytest.mark.parametrize("timing", ["step", "calibrated"])
def test_a_livelock_fails_the_run_instead_of_running_for_ever(timing):
    # The stage takes 1 + 50 = 51 steps (or a prefill and 50 decode iterations) and is
    # stopped before it makes progress, so it never ends. The engine gives up once one
    # stage has been stopped MAX_PREEMPTIONS times, in well under a second.
    inst = make({"a": 10}, [task("t0", 0, stage("s", "a", 5, 50))], capacity=100)
    with pytest.raises(SimulationError, match=r"'start-stop'.*t0/s stopped 10000 times"):
        simulate(inst, StartStop(), timing=timing)
    assert MAX_PREEMPTIONS == 10_000
