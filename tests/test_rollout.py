"""``topas-rollout`` (topas/policies/rollout.py): TOPAS with a rollout."""

from __future__ import annotations

import dataclasses
import math
from unittest import mock

import pytest
from conftest import jcts_across_processes, make, random_instances, stage, task
from hypothesis import given, settings
from test_forward import at_once
from test_policies import make_resident, ready, released
from test_search import r_runs_beside_a_waiting_s

from topas.errors import InputError
from topas.params import split_outside, unwrap
from topas.policies import make_policy
from topas.policies import rollout as rollout_module
from topas.policies.rollout import DEFAULT_BASES, Rollout, distinct, variants
from topas.schedule import evaluate
from topas.simulator import simulate
from topas.state import Decision, apply
from topas.verify import verify_step

BASES = ("topas", "topas-greedy", "lpm", "parrot-fcfs")  # the default's, in its order


def test_a_rollout_waits_where_topas_drains_a_prompt_it_needs_again():
    # The state of test_search's soon test (r_runs_beside_a_waiting_s). TOPAS evicts B
    # to start s now (its one-step score prefers it, test_search). Then s runs 0..550
    # and x, ready at 110, needs B's 4,000 tokens and its own 200 beside
    # A's 4,000 and s's 1,000: 9,200 > 9,100, so it waits for s. The best continuation
    # (topas-greedy's: B prefetched from 110, resident at 510) runs x 550..660: JCTs
    # t 660 + u 550 = 1,210 steps. Waiting instead (nothing started now, B kept): r ends
    # at 110, x runs 110..220 and s 220..770 (both do not fit beside the prompts): 220 +
    # 770 = 990. The rollout sees both and waits.
    inst, state = r_runs_beside_a_waiting_s()
    topas = ready("topas", inst).decide(state)
    assert topas.evict == ("B",) and topas.admit == (("u", "s"),)
    rollout = ready("topas-rollout", inst)
    decision = rollout.decide(state)
    assert decision.evict == () and decision.admit == () and decision.load == ()
    forward, known = rollout.forward, rollout.forward.instance(state)
    costs = {
        (name, which): forward.jct_sum(state, known, d, base)
        for name, base in zip(BASES, rollout.policies, strict=True)
        for which, d in (("drain", topas), ("wait", Decision()))
    }
    assert min(v for (_, w), v in costs.items() if w == "drain") == 1210
    assert min(v for (_, w), v in costs.items() if w == "wait") == 990
    assert costs[("topas", "wait")] == 990  # x first: t's last stage (Smith's ratio)
    assert costs[("parrot-fcfs", "wait")] == 1430  # s first (ready first): x waits till 660


def test_without_rollouts_it_is_topas():
    # max_stages=0: no rollout is ever made, so every decision is its TOPAS's (its first
    # base, the TOPAS it was measured with: fill=search, stall=0, drain_load=0,
    # token_floor=0)
    from topas.workloads import small_instance

    inst = small_instance("mixed", seed=3000, num_tasks=3)
    first = unwrap(split_outside(DEFAULT_BASES, "+")[0])
    assert first == "topas:fill=search,stall=0,drain_load=0,token_floor=0"
    for timing in ("step", "calibrated"):
        a = simulate(inst, make_policy("topas-rollout:max_stages=0"), timing=timing)
        b = simulate(inst, make_policy(first), timing=timing)
        assert a.runs == b.runs and a.prefixes == b.prefixes


def test_the_gap_studys_chain_that_topas_misses_reaches_the_optimum():
    # docs/topas.md ("soon"): chain, 3 tasks, instance seed 3002 of tuning study 0. TOPAS
    # evicts agent2's prompt the step it became resident, with two next-hop stages due,
    # to start a new task's first stage that would have fit two steps later: 137 steps
    # against the optimum's 113 (CP-SAT, proven). The rollout keeps it: 113.
    from topas.workloads import small_instance

    inst = small_instance("chain", seed=3002, num_tasks=3)
    got = {}
    for spec in ("topas", "topas-rollout"):
        sched = simulate(inst, make_policy(spec), timing="step", debug=True)
        verify_step(sched)
        got[spec] = evaluate(sched).objective_steps
    assert got == {"topas": 137, "topas-rollout": 113}


@settings(max_examples=30, deadline=None)
@given(random_instances(max_tasks=4, max_stages=5, predictions=False))
def test_never_worse_than_its_bases_when_every_task_is_known(inst):
    # Rollout's cost improvement: every task released at step 0, exact predictions, the
    # step model (the forward model is then the run itself: test_forward). At each
    # decision the rollout takes the candidate with the cheapest continuation, its bases'
    # own decisions among them, so its sum of JCTs is at most each base's.
    inst = at_once(inst)
    rollout = evaluate(simulate(inst, make_policy("topas-rollout"), timing="step"))
    for base in BASES:
        own = evaluate(simulate(inst, make_policy(base), timing="step"))
        assert rollout.objective_steps <= own.objective_steps, base


@settings(max_examples=20, deadline=None)
@given(random_instances(max_tasks=4, max_stages=5))
def test_stopping_rollouts_at_the_cutoff_changes_no_decision(inst):
    # A rollout that cannot beat the best so far is stopped (Forward.jct_sum's cutoff);
    # the floor it stops on never passes the sum it bounds (test_forward), so the runs
    # are those of rollouts all run to their end (an infinite slack), in both timing
    # modes, with arrivals and prediction errors.
    for timing in ("step", "calibrated"):
        cut = simulate(inst, make_policy("topas-rollout"), timing=timing)
        with mock.patch.object(rollout_module, "CUTOFF_SLACK_S", math.inf):
            full = simulate(inst, make_policy("topas-rollout"), timing=timing)
        assert cut.runs == full.runs and cut.prefixes == full.prefixes, timing


NARROW = "topas-rollout:max_stages=0,narrow_stages=1000"
"""A narrow rollout at every scale (the full one never: max_stages=0)."""


@settings(max_examples=15, deadline=None)
@given(random_instances(max_tasks=4, max_stages=5))
def test_a_narrow_rollout_is_a_rollout_over_its_first_bases_alone(inst):
    # Above max_stages a narrow rollout takes the first narrow_bases bases' decisions,
    # each continued by each of them, without alternatives or perturbations: the full
    # rollout of a spec that has those bases only and none of the rest, run for run, in
    # both timing modes, with arrivals and prediction errors.
    first_two = "+".join(split_outside(DEFAULT_BASES, "+")[:2])
    for timing in ("step", "calibrated"):
        alone = Rollout(bases=first_two, alternatives=0, variants=False, max_stages=1000)
        a = simulate(inst, make_policy(NARROW), timing=timing)
        b = simulate(inst, alone, timing=timing)
        assert a.runs == b.runs and a.prefixes == b.prefixes, timing


def test_a_narrow_rollout_consults_its_first_bases_only():
    # lpm and parrot-fcfs (the default's third and fourth bases) are not asked: a
    # decide that raises goes unnoticed; yet rollouts are made (TOPAS and topas-greedy
    # disagree on this instance), and the full rollout does ask them.
    from topas.workloads import small_instance

    inst = small_instance("mixed", seed=3000, num_tasks=3)
    policy = make_policy(NARROW)
    with mock.patch.object(type(make_policy("lpm")), "decide", side_effect=AssertionError):
        simulate(inst, policy, timing="step")
        assert policy.rollouts > 0
        with pytest.raises(AssertionError):
            simulate(inst, make_policy("topas-rollout"), timing="step")


def test_variants_are_applicable_and_distinct_drops_repeats():
    inst, state = r_runs_beside_a_waiting_s()
    topas = ready("topas", inst).decide(state)
    out = variants(state, topas)
    # no prefetch (x's B is resident), so: s's admission left out (B still evicted), and
    # nothing at all until the next event
    assert out == [Decision(evict=("B",)), Decision(held=topas.held)]
    for d in out:
        apply(state, d)  # raises if it breaks the model's rules
    assert distinct([topas, *out, topas, Decision()]) == [0, 1, 2]


def test_a_variant_prefetches_with_an_eviction_where_the_prompt_does_not_fit():
    # A and B resident, nothing runs; C's prompt (40) fits only once an unused prompt goes.
    inst = make(
        {"A": 30, "B": 30, "C": 40},
        [task("t", 0, stage("s0", "A", 5, 5), stage("s1", "C", 5, 5, ["s0"]))],
        capacity=100,
    )
    state = released(inst)
    make_resident(state, "B", "A")  # B least recently used
    d = Decision(admit=(("t", "s0"),))
    prefetch = [v for v in variants(state, d) if v.load]
    assert prefetch == [Decision(evict=("B",), load=("C",), admit=(("t", "s0"),))]
    apply(state, prefetch[0])


def test_bad_parameters_are_refused():
    inst, _ = r_runs_beside_a_waiting_s()
    for spec, what in (
        ("topas-rollout:bases=", "bases"),
        ("topas-rollout:bases=lpm+topas", "first base must be a TOPAS"),
        ("topas-rollout:bases=topas+topas-rollout", "cannot be a base"),
        ("topas-rollout:bases=(topas:drain=0+lpm", "unmatched '\\('"),
        ("topas-rollout:bases=topas:drain=0)+lpm", "unmatched '\\)'"),
        ("topas-rollout:bases=topas:drain=0,stall=0+lpm", "unknown parameter 'stall'"),
        ("topas-rollout:max_stages=-1", "max_stages"),
        ("topas-rollout:narrow_stages=-1", "narrow_stages"),
        ("topas-rollout:narrow_bases=0", "narrow_bases"),
        ("topas-rollout:narrow_bases=5", "narrow_bases"),
    ):
        with pytest.raises(InputError, match=what):
            ready(spec, inst)


def test_a_base_with_parameters_of_its_own_goes_in_parentheses():
    # The default bases, written out in a spec, build the same bases as the default; the
    # parentheses keep a base's commas from splitting the rollout's own parameters
    spec = f"topas-rollout:cross=0,bases={DEFAULT_BASES},max_stages=8"
    written, default = make_policy(spec), Rollout(cross=False, max_stages=8)
    default.check()
    first = "topas:fill=search,stall=0,drain_load=0,token_floor=0"
    names = [first, "topas-greedy", "lpm", "parrot-fcfs"]
    assert [p.name for p in written.policies] == [p.name for p in default.policies] == names
    assert written.policies[0] == default.policies[0] == make_policy(names[0])
    assert (written.cross, written.max_stages) == (False, 8)
    nested = make_policy("topas-rollout:bases=(topas:drain=0,stall=0)+(lpm)")
    assert [p.name for p in nested.policies] == ["topas:drain=0,stall=0", "lpm"]


def test_it_serves_a_starving_stage_as_topas_does():
    # analysis/starvation.py's memory-bound stream (test_starvation): TOPAS's reservation
    # is taken as it is, so the cold task's JCT stays flat as the stream doubles, as
    # TOPAS's does (measured, seed 0: 6.8 s at both lengths, TOPAS's 6.8 and 6.5 s)
    from test_starvation import starvation

    rows = starvation.run_starvation((160, 320), ("topas-rollout",), seeds=(0,), bounds=("memory",))
    assert starvation.growth(rows, "topas-rollout", "cold_jct_s")[320] <= 1.5


def test_runs_repeat_across_processes(tmp_path):
    from topas.workloads import small_instance

    inst = dataclasses.replace(small_instance("fanout", seed=3003, num_tasks=3))
    a, b = jcts_across_processes(tmp_path, inst, "topas-rollout")
    assert a == b
