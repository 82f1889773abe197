"""The forward model (topas/forward.py): an engine resumed from what a policy sees.

The cross-check: a policy run with every task released at once and exact predictions
asks the forward model, at every decision, when each task will finish if it follows
its own decision and goes on as itself. The forward model is the simulator resumed from
the policy's State, so the answer must be the run's own completion times: exactly in the
step model, and in the calibrated model wherever the State tells everything the engine
keeps (no stage in the middle of its prefill, no prompt loading).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from conftest import make, random_instances, stage, task
from hypothesis import given, settings
from test_policies import ready, released

from topas.forward import Forward
from topas.instance import Instance
from topas.policies import make_policy
from topas.policies.base import Policy, PolicyContext
from topas.policies.rollout import CUTOFF_SLACK_S
from topas.simulator import simulate
from topas.state import Decision, Phase, PrefixStatus, State


class Forecaster(Policy):
    """Runs ``inner`` and, at every decision it may check, records the forward model's
    completion times for the decision and ``inner`` going on."""

    def __init__(self, inner: str | Policy, calibrated_exact_only: bool = True) -> None:
        self.inner = make_policy(inner) if isinstance(inner, str) else inner
        self.name = f"forecast({self.inner.spec()})"
        self.exact_only = calibrated_exact_only
        self.forecasts: list[tuple[float, dict[str, float] | None]] = []

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self.inner.reset(ctx)
        self.forward = Forward(ctx)

    def decide(self, state: State) -> Decision:
        decision = self.inner.decide(state)
        if state.tasks and (self.ctx.timing == "step" or not self.exact_only or told(state)):
            inst = self.forward.instance(state)
            done = self.forward.completions(state, inst, decision, self.inner)
            self.forecasts.append((state.time, done))
        self.forward.note(state, decision)
        return decision

    def eviction_order(self, state: State) -> list[str]:
        return self.inner.eviction_order(state)

    def retraction_order(self, state, candidates):  # type: ignore[no-untyped-def]
        return self.inner.retraction_order(state, candidates)


def told(state: State) -> bool:
    """The State tells all the calibrated engine keeps: no stage admitted or in its
    prefill (a running stage has made a token since its admission), no prompt loading."""
    for ref, run in state.running.items():
        if state.phase[ref] is not Phase.RUNNING or run.generated <= state.generated.get(ref, 0):
            return False
    return all(p.status is not PrefixStatus.LOADING for p in state.prefixes.values())


def at_once(inst: Instance) -> Instance:
    """``inst`` with every task released at time 0 (the forward model has no arrivals)."""
    return dataclasses.replace(
        inst, tasks=tuple(dataclasses.replace(t, arrival=0) for t in inst.tasks)
    )


def check_forecasts(inst: Instance, spec: str | Policy, timing: str) -> int:
    policy = Forecaster(spec)
    sched = simulate(inst, policy, timing=timing)
    done: dict[str, float] = {}
    for run in sched.runs:
        if not run.preempted:
            done[run.task] = max(done.get(run.task, 0.0), run.end)
    for at, forecast in policy.forecasts:
        assert forecast is not None, f"the forward model stalled at t={at}"
        for tid, end in forecast.items():
            assert math.isclose(end, done[tid], rel_tol=1e-9, abs_tol=1e-9), (at, tid)
    return len(policy.forecasts)


def chain_world() -> Instance:
    # two chains on two agents, a budget that holds one prompt and one stage or both
    # prompts and no stage: every decision drains, loads or waits
    return make(
        {"a": 30, "b": 20},
        [
            task("t0", 0, stage("s0", "a", 10, 4), stage("s1", "b", 10, 3, ["s0"])),
            task("t1", 0, stage("s0", "b", 10, 2), stage("s1", "a", 10, 5, ["s0"])),
        ],
        capacity=60,
    )


@pytest.mark.parametrize("timing", ["step", "calibrated"])
@pytest.mark.parametrize("spec", ["topas", "topas-greedy", "lpm", "spf"])
def test_the_forward_model_foresees_the_run_it_resumes(spec, timing):
    inst = chain_world()
    if timing == "calibrated":
        inst = dataclasses.replace(
            inst,
            server=dataclasses.replace(inst.server, cost_model=None),  # calibrated default
        )
    assert check_forecasts(inst, spec, timing) >= 1


@settings(max_examples=30, deadline=None)
@given(random_instances(max_tasks=3, max_stages=4, predictions=False))
def test_forecasts_equal_the_run_in_both_timing_modes(inst):
    inst = at_once(inst)
    for timing in ("step", "calibrated"):
        for spec in ("topas", "lpm"):
            check_forecasts(inst, spec, timing)


def test_the_forward_instance_holds_what_a_policy_may_know():
    # t0/s0 is told 2 output tokens and makes 6; every iteration takes 1 s. Its prompt
    # (10 tokens, one chunk) is prefilled in t=0..1, its own prefill (which makes the
    # first token) in 1..2, then one token per decode iteration: 2, 3, 4 by t=3, 4, 5.
    # t1 arrives at 4.5, so the engine decides at 5 with 4 made: past the prediction,
    # the forward model (which may not know the truth) gives s0 one more than it has, 5;
    # at 6 (t1's prefill went first, s0 made none) the same. Before, it is told 2.
    inst = make(
        {"a": 10},
        [task("t0", 0, stage("s0", "a", 5, 6, pred=2)), task("t1", 4.5, stage("s0", "a", 5, 1))],
        capacity=40,
        cost={"kind": "linear", "base_s": 1.0, "prefill_token_s": 0.0, "decode_seq_s": 0.0,
              "kv_token_s": 0.0},
    )  # fmt: skip
    seen: list[tuple[float, int, int]] = []

    class Peek(Forecaster):
        def decide(self, state):  # type: ignore[no-untyped-def]
            if ("t0", "s0") in state.running or ("t0", "s0") in state.waiting:
                made = state.running[("t0", "s0")].generated if ("t0", "s0") in state.running else 0
                told = self.forward.instance(state).task_by_id["t0"].stage_by_id["s0"]
                assert told.predicted_output == told.output_tokens
                seen.append((state.time, made, told.output_tokens))
            return super().decide(state)

    simulate(inst, Peek("fcfs", calibrated_exact_only=False), timing="calibrated")
    assert seen == [(0.0, 0, 2), (1.0, 0, 2), (2.0, 1, 2), (5.0, 4, 5), (6.0, 4, 5)]


def test_a_policy_that_does_not_pickle_is_deep_copied_instead():
    # forward.Frozen pickles a base once per decision; a policy holding a lambda does not
    # pickle, so each rollout deep-copies it: the forecasts are the run's all the same
    class Unpicklable(type(make_policy("lpm"))):  # type: ignore[misc]
        def reset(self, ctx: PolicyContext) -> None:
            super().reset(ctx)
            self.hook = lambda ref: ref

    policy = Unpicklable()
    inst = chain_world()
    policy.reset(PolicyContext(server=inst.server, timing="step"))
    from test_policies import released

    state = released(inst)
    frozen = Forward(policy.ctx).freeze(policy, state)
    resumed = state.copy()
    thawed = frozen.thaw(resumed)
    assert frozen._data is None and thawed is not policy and thawed.ctx is policy.ctx
    assert check_forecasts(inst, Unpicklable(), "step") >= 1


# --------------------------------------------------------------------------- cutoff


def test_a_rollout_stops_once_its_jcts_must_pass_the_cutoff():
    # One task, a chain s0 -> s1 on agent a, released at 0 (step model, 1 s steps, chunk
    # 10). The decision loads a (1 step) and admits s0, which runs 1..6 (ceil(10/10) + 4
    # steps); s1 runs 6..9 (1 + 2): JCT 9. The floor (the time the task has waited plus
    # its unadmitted stages' path) is 1 + 3 = 4 at step 1 and 6 + 3 = 9 at step 6, before
    # s1 is admitted: a cutoff of 9 lets the run finish, 8.5 stops it at step 6 and 3.9
    # at step 1.
    inst = make(
        {"a": 10}, [task("t", 0, stage("s0", "a", 10, 4), stage("s1", "a", 10, 2, ["s0"]))], 30
    )
    state = released(inst)
    lpm = ready("lpm", inst)
    decision = lpm.decide(state)
    assert decision.admit == (("t", "s0"),)
    forward = Forward(lpm.ctx)
    known = forward.instance(state)
    assert forward.jct_sum(state, known, decision, lpm) == 9
    assert forward.jct_sum(state, known, decision, lpm, cutoff=9) == 9
    assert forward.jct_sum(state, known, decision, lpm, cutoff=8.5) == math.inf
    assert forward.jct_sum(state, known, decision, lpm, cutoff=3.9) == math.inf


class Bounded(Forecaster):
    """A Forecaster that forecasts the sum of the JCTs twice: in full, and with a cutoff
    at that sum (plus the rollout's slack)."""

    def decide(self, state: State) -> Decision:
        decision = self.inner.decide(state)
        if state.tasks:
            inst = self.forward.instance(state)
            full = self.forward.jct_sum(state, inst, decision, self.inner)
            cut = self.forward.jct_sum(state, inst, decision, self.inner, full + CUTOFF_SLACK_S)
            self.forecasts.append((state.time, {"full": full, "cut": cut}))
        self.forward.note(state, decision)
        return decision


def test_the_floor_counts_only_the_tokens_a_retracted_stage_has_left():
    # Found by hypothesis (tests below, more examples): an 8-token budget, t1's s0
    # predicted at 1 token and making 4. It overruns, is retracted when decode memory runs
    # out, and keeps the tokens it made (the calibrated engine re-prefills them). A floor
    # that weighed its whole output again passed the rollout's own sum (7.415 s at
    # t=2.138) and stopped it; weighing the tokens it has left does not.
    inst = make(
        {"a0": 1},
        [
            task("t0", 0, stage("s0", "a0", 1, 4), stage("s1", "a0", 1, 1)),
            task("t1", 0, stage("s0", "a0", 1, 4, pred=1)),
        ],
        capacity=8,
        chunk=4,
        cost={
            "kind": "linear",
            "base_s": 1.0,
            "prefill_token_s": 0.01,
            "decode_seq_s": 0.05,
            "kv_token_s": 0.001,
        },
    )
    policy = Bounded("topas")
    sched = simulate(inst, policy, timing="calibrated")
    assert any(run.preempted for run in sched.runs)
    assert policy.forecasts and all(f["cut"] == f["full"] for _, f in policy.forecasts)


@settings(max_examples=60, deadline=None)
@given(random_instances(max_tasks=4, max_stages=5))
def test_the_floor_never_passes_the_jcts_it_bounds_in_both_timing_modes(inst):
    # A rollout stops only on proof: the floor it checks (finished JCTs, the time the
    # others have waited, their unadmitted paths at the least stage times) never passes
    # the sum it bounds, so a cutoff at that sum never stops it.
    for timing in ("step", "calibrated"):
        for spec in ("topas", "lpm", "parrot-fcfs"):
            policy = Bounded(spec)
            simulate(inst, policy, timing=timing)
            for at, f in policy.forecasts:
                assert f["cut"] == f["full"], (timing, spec, at)
