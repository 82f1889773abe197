"""``analysis/guarded_spf.py``: task-level SRPT with an age guard, a probe of the trade-off
between `spf`'s mean JCT and `parrot-fcfs`'s p99.

Pinned on the hand-built four-orders state, cross-checked against the two baselines it
spans (``guard=0`` is `parrot-fcfs`, ``guard=none`` is `spf`: the same schedule, run by run,
under hypothesis, in both timing modes), and run through the simulator under every
invariant and across processes.
"""

from __future__ import annotations

import pytest
from conftest import random_instances
from hypothesis import given
from probes import probe_checks
from test_paper_baselines import A2, B2, C1, D2, four_orders_world, ready

from topas.errors import InputError
from topas.policies import make_policy
from topas.simulator import simulate

SPEC = "guarded_spf:GuardedSPF"


@pytest.mark.parametrize(
    ("guard", "order", "wake"),
    [
        # no task has waited 10 s: spf's order (remaining work D 2, A 5, B 8, C 12); the
        # next to reach the guard is A (released at 0), at 0 + 10
        (10, [D2, A2, B2, C1], 10),
        # at time 5, A (age 5) and B (age 4) are past a 3.5 s guard: they go first, by
        # release; then C (age 3) and D (age 2) by remaining work, D 2 before C 12. C
        # reaches the guard first, at 2 + 3.5
        (3.5, [A2, B2, D2, C1], 5.5),
        # every task past the guard: release order, as parrot-fcfs; nothing left to wake for
        (0, [A2, B2, C1, D2], None),
        # no guard: spf
        (None, [D2, A2, B2, C1], None),
    ],
)
def test_tasks_past_the_guard_go_first_by_release(guard, order, wake) -> None:
    inst, state = four_orders_world()  # time 5; tasks released at 0, 1, 2, 3
    decision = ready(f"{SPEC}:guard={guard}", inst).decide(state)
    assert list(decision.admit) == order  # room for all four
    assert decision.wake_at == wake


def test_admission_stops_at_the_first_misfit() -> None:
    inst, state = four_orders_world(capacity=40)  # 30 free after the prefix
    decision = ready(f"{SPEC}:guard=3.5", inst).decide(state)
    assert list(decision.admit) == [A2]  # A/s2 14, then B/s2 17: 31 > 30, stop


def test_a_negative_guard_is_refused() -> None:
    inst, _ = four_orders_world()
    with pytest.raises(InputError, match="guard"):
        ready(f"{SPEC}:guard=-1", inst)


@pytest.mark.parametrize("timing", ["step", "calibrated"])
@pytest.mark.parametrize(("guard", "same_as"), [("0", "parrot-fcfs"), ("none", "spf")])
@given(inst=random_instances())
def test_the_two_ends_of_the_family_are_the_baselines(timing, guard, same_as, inst) -> None:
    ours = simulate(inst, make_policy(f"{SPEC}:guard={guard}"), timing=timing)
    theirs = simulate(inst, make_policy(same_as), timing=timing)
    assert ours.runs == theirs.runs
    assert ours.prefixes == theirs.prefixes


test_step_invariants, test_calibrated_invariants, test_decisions_do_not_depend_on_the_process = (
    probe_checks([f"{SPEC}:guard=4"], f"{SPEC}:guard=2.5", f"{SPEC}:guard=20")
)
