"""``analysis/boost.py``: gamma-Boost (Yu and Scully) on tasks, a probe of the trade-off
between `spf`'s mean JCT and `parrot-fcfs`'s p99.

The boost function is pinned by hand; the order on the hand-built four-orders state is
worked out below for both ends of the family and a scale between them; ``scale=0`` is
cross-checked against `parrot-fcfs` (the same schedule, run by run, under hypothesis, in
both timing modes); and the probe runs through the simulator under every invariant and
across processes.
"""

from __future__ import annotations

import math

import pytest
from conftest import random_instances
from hypothesis import given
from hypothesis import strategies as st
from probes import probe_checks
from test_paper_baselines import A2, B2, C1, D2, four_orders_world, ready

from topas.errors import InputError
from topas.policies import make_policy
from topas.simulator import simulate

SPEC = "boost:Boost"

from boost import boost_s  # noqa: E402  (analysis/ is on sys.path once probes is imported)


def test_boost_by_hand() -> None:
    # 1 - exp(-ln 2) = 1/2, so the boost is ln(1 / (1/2)) = ln 2 at scale 1
    assert boost_s(math.log(2), 1.0) == pytest.approx(math.log(2))
    # scaling size and scale together scales the boost: 10 * ln 2 at size 10 ln 2, scale 10
    assert boost_s(10 * math.log(2), 10.0) == pytest.approx(10 * math.log(2))
    assert boost_s(5.0, 0.0) == 0.0  # scale 0: no boost, FCFS
    assert math.isfinite(boost_s(0.0, 1.0))  # an empty task gets a large, finite boost


@given(
    size=st.floats(0.01, 1e4),
    more=st.floats(0.01, 1e4),
    scale=st.floats(0.01, 1e4),
)
def test_a_smaller_task_gets_at_least_the_boost_of_a_larger_one(size, more, scale) -> None:
    assert boost_s(size, scale) >= boost_s(size + more, scale) >= 0.0


@pytest.mark.parametrize(
    ("scale", "order"),
    [
        # Sizes when first seen (remaining work at time 5, the state's doc): A 5, B 8,
        # C 12, D 2; releases 0, 1, 2, 3. Keys are release - boost.
        # scale 0: no boost, release order (parrot-fcfs's)
        (0, [A2, B2, C1, D2]),
        # scale 1: boosts 0.0068, 0.0003, 0.0000, 0.145 -> keys -0.007, 1.000, 2.000,
        # 2.855: still release order
        (1, [A2, B2, C1, D2]),
        # scale 3: boosts 0.628, 0.216, 0.056, 2.161 -> keys -0.628, 0.784, 1.944, 0.839:
        # D (the smallest) passes C but not B
        (3, [A2, B2, D2, C1]),
        # scale 100: boosts 302.1, 256.5, 218.0, 392.2 -> keys -302.1, -255.5, -216.0,
        # -389.2: size order, D 2, A 5, B 8, C 12 (spf's here)
        (100, [D2, A2, B2, C1]),
    ],
)
def test_tasks_go_by_boosted_release(scale, order) -> None:
    inst, state = four_orders_world()  # room for all four
    assert list(ready(f"{SPEC}:scale={scale}", inst).decide(state).admit) == order


def test_a_task_keeps_the_key_it_was_first_given() -> None:
    inst, state = four_orders_world()
    policy = ready(f"{SPEC}:scale=3", inst)
    policy.decide(state)
    key = dict(policy._key)
    state.time = 50.0  # later, with the same stages waiting: the same keys, the same order
    assert list(policy.decide(state).admit) == [A2, B2, D2, C1]
    assert policy._key == key


@pytest.mark.parametrize("scale", ["-1", "inf", "nan"])
def test_a_scale_that_is_not_a_finite_number_of_seconds_is_refused(scale) -> None:
    inst, _ = four_orders_world()
    with pytest.raises(InputError, match="scale"):
        ready(f"{SPEC}:scale={scale}", inst)


@pytest.mark.parametrize("timing", ["step", "calibrated"])
@given(inst=random_instances())
def test_scale_zero_is_parrot_fcfs(timing, inst) -> None:
    ours = simulate(inst, make_policy(f"{SPEC}:scale=0"), timing=timing)
    theirs = simulate(inst, make_policy("parrot-fcfs"), timing=timing)
    assert ours.runs == theirs.runs
    assert ours.prefixes == theirs.prefixes


test_step_invariants, test_calibrated_invariants, test_decisions_do_not_depend_on_the_process = (
    probe_checks([f"{SPEC}:scale=4"], f"{SPEC}:scale=2.5", f"{SPEC}:scale=20")
)
