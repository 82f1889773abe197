"""The search over post-decision states (topas/policies/search.py, registered as ``topas``):
hand-built states with known answers, the enumeration against brute force, its service
model, determinism across processes, and the model's invariants under hypothesis."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import jcts_across_processes, load_analysis, make, random_instances, stage, task
from hypothesis import given, settings
from hypothesis import strategies as st
from test_policies import make_resident, ready, released

from topas.policies import PolicyContext, make_policy
from topas.policies.search import (
    SCENARIOS,
    TOPAS,
    ServiceModel,
    _quantile,
    _quantiles,
    _task_next_hops,
    longest_path,
    role_of,
    scenario_levels,
)
from topas.schedule import evaluate
from topas.simulator import SimulationError, simulate
from topas.state import Decision, Phase, TaskInfo, apply_inplace, task_arrives
from topas.verify import verify_step

SLOW_LINK = {"kind": "host", "tokens_per_s": 10.0}  # a 4000-token prompt: 400 s to move
FAST_LINK = {"kind": "host", "tokens_per_s": 1e6}  # a 4000-token prompt: 4 ms


def two_agents(load: dict) -> tuple:
    """Capacity 10,000; agents A and B with 4,000-token prompts, both resident and idle.
    Six one-stage tasks of A and one of B wait, each stage 500 + 500 = 1,000 tokens of KV.

    Keeping both prompts leaves 2,000 tokens: two stages run. Dropping B leaves 6,000: all
    six of A's run. Each admitted stage is worth D (its task's whole remaining path starts
    now rather than D later; g = 1 at age 0), so draining B gains four stages, 4 D, and
    costs c(B) for B's one waiting task, which must wait for B to come back."""
    tasks = [task(f"a{i}", 0, stage("s", "A", 500, 500)) for i in range(6)]
    tasks.append(task("b0", 0, stage("s", "B", 500, 500)))
    inst = make({"A": 4000, "B": 4000}, tasks, capacity=10_000, load=load)
    state = released(inst)
    make_resident(state, "A", "B")
    return inst, state


def test_drains_a_prompt_when_the_batch_gains_more_than_the_move_costs():
    # Step model, chunk 10: each stage lasts 50 + 500 = 550 steps, so D = 550 s. With a
    # fast link c(B) = 0.004 s << 4 D: TOPAS evicts B and admits the six stages of A,
    # and reports B's stage as held (its agent is outside R').
    inst, state = two_agents(FAST_LINK)
    policy = ready("topas", inst)
    d = policy.decide(state)
    assert d.evict == ("B",)
    assert sorted(d.admit) == [(f"a{i}", "s") for i in range(6)]
    assert d.held == (("b0", "s"),)
    assert policy._kept == ("A",)


def test_does_not_move_a_prompt_when_the_swap_costs_more_than_it_saves():
    # The same state over a slow link: c(B) = 400 s per waiting task of B. The gain of
    # draining B is 4 D = 2,200 s against 400 s... so make the link slower still: at
    # 1 token/s c(B) = 4,000 s > 4 D and TOPAS keeps both prompts and runs two stages.
    inst, state = two_agents({"kind": "host", "tokens_per_s": 1.0})
    d = ready("topas", inst).decide(state)
    assert d.evict == () and len(d.admit) == 2 and d.held == ()


def test_move_switch_and_search_all_never_drain():
    # With the move term off draining is free; with search=all nothing is chosen: every
    # active agent that fits is kept, so B stays and only two stages run.
    inst, state = two_agents({"kind": "host", "tokens_per_s": 1.0})
    assert ready("topas:move=0", inst).decide(state).evict == ("B",)
    d = ready("topas:search=all", inst).decide(state)
    assert d.evict == () and len(d.admit) == 2


def a_runs_r(*tasks: dict) -> tuple:
    """Capacity 10,000 over the fast link; A and B (4,000-token prompts) resident; the
    tasks released and stage t/r (of A) admitted."""
    inst = make({"A": 4000, "B": 4000}, list(tasks), capacity=10_000, load=FAST_LINK)
    state = released(inst)
    make_resident(state, "A", "B")
    apply_inplace(state, Decision(admit=(("t", "r"),)))
    return inst, state


def test_reuse_term_keeps_a_prompt_with_next_hop_stages():
    # Capacity 10,000, A and B resident and idle; A's two waiting stages fit either way
    # (1,000 each), B has no waiting stage but a running stage r of agent A in task t
    # whose child x needs B: n_B = 1 (x's only unfinished predecessor runs). Dropping B
    # frees nothing anyone needs now, so only V_reuse = n_B * c(B) tells the two apart:
    # with reuse on keeping B scores c(B) more; with reuse=0 they tie (and the tie goes to
    # fewer changes, so B stays either way).
    inst, state = a_runs_r(
        task("t", 0, stage("r", "A", 100, 100), stage("x", "B", 100, 100, ["r"])),
        task("u", 0, stage("s", "A", 500, 500)),
    )
    policy = ready("topas", inst)
    d = policy.decide(state)
    assert d.evict == () and d.admit == (("u", "s"),)
    rnd = policy._round(state)
    keep = policy._pack(state, rnd, ("A", "B"))
    drop = policy._pack(state, rnd, ("A",))
    assert rnd.next_hop == {"B": 1}
    # c(B) in the step model: max(1, ceil(4000 / 1e6)) = 1 step of 1 s, counted once
    assert keep.score - drop.score == pytest.approx(1.0)
    off = ready("topas:reuse=0", inst)
    rnd0 = off._round(state)
    assert off._pack(state, rnd0, ("A", "B")).score == pytest.approx(
        off._pack(state, rnd0, ("A",)).score
    )


def test_enumeration_is_the_best_of_every_subset():
    # Three agents, a tight budget: the decision's score equals the best score over all
    # eight subsets of the active pool, evaluated one by one (brute force).
    tasks = [task(f"{a}{i}", i, stage("s", a, 300, 300)) for a in "ABC" for i in range(3)]
    inst = make({"A": 2000, "B": 1500, "C": 1000}, tasks, capacity=7000, load=FAST_LINK)
    state = released(inst)
    make_resident(state, "A", "B", "C")
    policy = ready("topas", inst)
    policy.decide(state)
    rnd = policy._round(state)
    active = sorted(rnd.queues)
    scores = []
    for n in range(len(active) + 1):
        for combo in itertools.combinations(active, n):
            p = policy._pack(state, rnd, combo)
            if p is not None:
                scores.append(p.score)
    best = policy._search(state, rnd)
    assert best.score == pytest.approx(max(scores))
    assert policy.evaluated == len(scores) + sum(
        policy._pack(state, rnd, c) is None
        for n in range(len(active) + 1)
        for c in itertools.combinations(active, n)
    )


def test_greedy_search_is_bounded_and_never_beats_enumeration():
    # the greedy search (single additions, pairs, then drops and swaps from R_t) scores at
    # most what enumerating every subset finds, within max(16, |A|^2) candidates
    tasks = [task(f"{a}{i}", i, stage("s", a, 300, 300)) for a in "ABCD" for i in range(3)]
    inst = make({"A": 2000, "B": 1500, "C": 1000, "D": 1200}, tasks, capacity=7000, load=FAST_LINK)
    state = released(inst)
    make_resident(state, "A", "B", "C")
    full = ready("topas:search=enumerate", inst)
    greedy = ready("topas:search=greedy", inst)
    best = full._search(state, full._round(state))
    found = greedy._search(state, greedy._round(state))
    assert found.score <= best.score + 1e-9
    assert greedy.evaluated <= 16 + 1 and full.evaluated == 2**4


# --------------------------------------------------------------------------- model


def test_role_strips_the_index():
    assert role_of("code_3") == "code" and role_of("tl_0") == "tl" and role_of("prd") == "prd"
    assert role_of("s12") == "s" and role_of("7") == "7"


def test_service_model_prior_then_learned_quantiles():
    model = ServiceModel()
    assert model.ratio(("a", "r"), 0.3) == 1.0  # the prior: the prediction
    for x in (2.0, 3.0, 4.0):
        model.observe(("a", "r"), x)
    assert model.ratio(("a", "r"), 0.5) == 1.0  # not refreshed yet: scenarios are stable
    model._refresh()
    # samples 1.0 (the prior), 2, 3, 4: the median interpolates between 2 and 3
    assert model.ratio(("a", "r"), 0.5) == 2.5
    assert model.ratio(("a", "r"), 0.0) == 1.0 and model.ratio(("a", "r"), 1.0) == 4.0
    assert model.ratio(("b", "r"), 0.5) == 1.0


@given(
    values=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=40),
    levels=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=SCENARIOS),
)
def test_quantiles_are_the_quantile_at_each_level(values, levels):
    """The one-loop form a stage's scenario ratios use gives the very floats of the
    one-level form (the learned ratios, and so every decision, stay as they were)."""
    values.sort()
    assert _quantiles(values, levels) == [_quantile(values, q) for q in levels]


def test_scenario_levels_are_stratified_and_differ_between_stages():
    a, b = scenario_levels("t0", "s1"), scenario_levels("t0", "s2")
    assert len(a) == SCENARIOS and a != b
    for levels in (a, b):  # one level in each stratum [j/S, (j+1)/S), in some order
        strata = sorted(int(u * SCENARIOS) for u in levels)
        assert strata == list(range(SCENARIOS))
    assert scenario_levels("t0", "s1") == a  # fixed per stage


def test_longest_path_defers_the_stages_not_started():
    # One task, two parallel waiting stages with tails 10 and 4, a running branch of 7:
    # started none -> max(7, 10 + D, 4 + D); with D = 5: 15. Start the long one: max(7,
    # 10, 9) = 10; both: 10. So the pair's cut is 5, each stage's share 2.5.
    from topas.policies.search import _Analysis

    an = _Analysis(running=[7.0], tails={("t", "x"): [10.0], ("t", "y"): [4.0]}, length=10.0)
    assert longest_path(an, (), 5.0) == 15.0
    assert longest_path(an, [("t", "x")], 5.0) == 10.0
    assert longest_path(an, [("t", "x"), ("t", "y")], 5.0) == 10.0
    assert TOPAS._share(an, 5.0) == 2.5


# --------------------------------------------------------------------------- invariants


@settings(max_examples=25, deadline=None)
@given(random_instances(max_tasks=3, max_stages=4))
def test_invariants_in_both_timing_modes(inst):
    # debug=True re-checks every invariant after every event: KV within capacity, every
    # running stage's prefix resident, deps before starts, each stage once
    specs = ("topas", "topas:soon=1", "topas:jit=1", "topas:age_form=excess", "topas:drain=0")
    specs += ("topas:drain_running=0", "topas:stall=1", "topas:drain_load=0")
    specs += ("topas:token_floor=0",)
    for timing, spec in itertools.product(("step", "calibrated"), specs):
        sched = simulate(inst, make_policy(spec), timing=timing, debug=True)
        assert len([r for r in sched.runs if not r.preempted]) == inst.num_stages
        if timing == "step":
            verify_step(sched)


class Twin(TOPAS):
    """TOPAS that, at every decision, also asks a twin the same question on a copy of the
    state: the twin's queue view then syncs by full comparison (a different state object)
    while this one reads the changes from the end of ``task_epoch`` (and its service model
    the finished stages from the end of ``done_service``). Both must decide alike, learn the
    same ratios in the same order, and the view must match the state: its waiting stages and
    their KV, the tasks per agent, and ``n_a`` recounted from scratch."""

    checked = 0
    incremental = 0  # syncs that read the changes (no fallback to full differences)

    def reset(self, ctx):  # type: ignore[no-untyped-def]
        super().reset(ctx)
        self.twin = TOPAS()
        self.twin.reset(ctx)

    def _changes(self, state):  # type: ignore[no-untyped-def]
        got = super()._changes(state)
        Twin.incremental += got is not None
        return got

    def decide(self, state):  # type: ignore[no-untyped-def]
        d = super().decide(state)
        assert self.twin.decide(state.copy()) == d
        assert self.model._recent == self.twin.model._recent
        assert self.model._seen == self.twin.model._seen
        view = self._view
        assert view.stages.of.keys() == state.waiting.keys()
        assert view.tasks.of.keys() == state.tasks.keys()
        for ref in state.waiting:  # what each waiting stage opens, as its task's analysis says
            opens = view.opens_table[view.stage_opens[view.stages.of[ref]]]
            assert opens == self._an[ref[0]].opens.get(ref[1], ())
        assert view.need == {r: state.estimated_need(r) for r in state.waiting}
        tasks_of: dict[str, set[str]] = {}
        for ref in state.waiting:
            tasks_of.setdefault(state.agent_of(ref), set()).add(ref[0])
        assert view.waiting_tasks() == {a: len(t) for a, t in tasks_of.items()}
        hops: dict[str, int] = {}
        for tid in state.tasks:
            for a, n in _task_next_hops(state, tid)[0].items():
                hops[a] = hops.get(a, 0) + n
        assert view.hops == hops
        Twin.checked += 1
        return d


@settings(max_examples=25, deadline=None)
@given(random_instances(max_tasks=4, max_stages=5))
def test_incremental_view_matches_a_full_sync(inst):
    for timing in ("step", "calibrated"):
        before = Twin.checked
        simulate(inst, Twin(), timing=timing)
        assert Twin.checked > before


def test_syncs_after_the_first_read_the_changes_in_the_engines_state():
    # the engine changes its own state in place and stamps every phase change, so every
    # sync after the first finds the changes without a full comparison (no fallback)
    from topas.workloads import generate

    inst = generate("fanout", num_tasks=12, seed=3, load=1.5)
    for timing in ("step", "calibrated"):
        before, fast = Twin.checked, Twin.incremental
        simulate(inst, Twin(), timing=timing)
        assert Twin.incremental - fast == Twin.checked - before - 1 > 10


def test_completes_the_paper_workloads_and_repeats():
    from topas.workloads import generate

    inst = generate("dag-10-wide", num_tasks=12, seed=1000, load=1.2)
    a = evaluate(simulate(inst, make_policy("topas"), debug=True))
    b = evaluate(simulate(inst, make_policy("topas")))
    assert a.jct == b.jct and len(a.jct) == 12


@pytest.mark.parametrize("spec", ["topas", "topas:fill=greedy"])
def test_runs_repeat_across_processes(tmp_path, spec):
    # no decision may depend on the iteration order of a set of names (PYTHONHASHSEED)
    from topas.workloads import generate

    inst = generate("dag-4", num_tasks=40, seed=1001, load=1.2)
    docs = jcts_across_processes(tmp_path, inst, spec)
    assert docs[0] == docs[1]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("topas:search=best", "search: unknown mode 'best'"),
        ("topas:fill=x", "fill: unknown filler 'x'"),
    ],
)
def test_bad_parameters_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        ready(spec, make({"A": 10}, [task("t", 0, stage("s", "A", 1, 1))], 30))


def test_lp_error_script_hand_checked():
    # analysis/lp_error.py: the vectorised longest path of a diamond a -> {b, c} -> d with
    # services 1, 5, 2, 1 is 1 + 5 + 1 = 7; with no noise the approximation equals Monte
    # Carlo, so the error is 0
    import numpy as np

    from topas.instance import Stage, Task
    from topas.workloads import generate

    mod = load_analysis("lp_error")
    t = Task(
        "t",
        0.0,
        (
            Stage("a", "x", 1, 1),
            Stage("b", "x", 1, 1, ("a",)),
            Stage("c", "x", 1, 1, ("a",)),
            Stage("d", "x", 1, 1, ("b", "c")),
        ),
    )
    assert mod.longest_paths(t, np.array([[1.0, 5.0, 2.0, 1.0]])).tolist() == [7.0]
    inst = generate("dag-4", num_tasks=2, seed=1000)
    errs = mod.task_errors(inst.tasks[0], inst.server, 1e-9, 50, np.random.default_rng(0))
    assert max(abs(e) for e in errs) < 1e-6


def test_a_starving_stage_is_not_left_behind_in_a_memory_bound_stream():
    # analysis/starvation.py's memory-bound stream: the cold stage needs its prefix and
    # the memory of six hot stages. Without the reservation, and without drain_load (its
    # prompt may wait for the hot prompt's drain), its JCT grows with the stream like
    # lpm's; with either (both are defaults) it stays within 1.5x of the shortest's.
    starvation = load_analysis("starvation")
    specs = ("topas", "topas:reserve=0", "topas:reserve=0,drain_load=0")
    rows = starvation.run_starvation((160, 640), specs, seeds=(0,), bounds=("memory",))
    flat, alone, starved = (starvation.growth(rows, s, "cold_jct_s") for s in specs)
    assert flat[640] <= 1.5 and alone[640] <= 1.5
    assert starved[640] >= 0.75 * 4  # proportional to the stream: 4x as long


# --------------------------------------------------------------------------- each term


def test_jit_loads_a_next_hops_prompt_when_its_load_is_due_not_at_once():
    # Step model, chunk 10: s0 (agent A, in 10, out 5) runs 1 + 5 = 6 steps; its child s1
    # (agent B, in 10, out 2) 1 + 2 = 3. A's load takes ceil(20 / 10) = 2 steps, B's 3.
    # At step 0 both prompts are absent: s0 is admitted, so A loads (resident at 2; the
    # admission starts it, DESIGN rule 9), and s0 runs 2..8. Without jit, admitting s0
    # makes s1 a next hop and B is loaded at once, at 0.
    # With jit, B's load is due at s0's predicted end less its load: at step 0 that is
    # 6 - 3 = 3 steps away (s0 counted from now: the wait for A's load is not), so the
    # decision loads nothing for B and asks to be woken at 3; then s0 (started at 2) has 5
    # steps left, the load is due in 2, wake at 5; at 5 B loads, resident at 8, when s1
    # becomes ready. Both: JCT 2 + 6 + 3 = 11 steps.
    tasks = [task("t", 0, stage("s0", "A", 10, 5), stage("s1", "B", 10, 2, deps=["s0"]))]
    inst = make({"A": 20, "B": 30}, tasks, capacity=100)
    loads = {}
    for spec in ("topas", "topas:jit=1"):
        sched = simulate(inst, make_policy(spec), timing="step", debug=True)
        verify_step(sched)
        assert evaluate(sched).jct == {"t": 11.0}
        loads[spec] = {p.agent: p.load_start for p in sched.prefixes}
    assert loads["topas"] == {"A": 0.0, "B": 0.0}
    assert loads["topas:jit=1"] == {"A": 0.0, "B": 5.0}
    state = released(inst)
    first = ready("topas:jit=1", inst).decide(state)
    assert first.admit == (("t", "s0"),) and first.wake_at == 3.0  # A loads for s0 (rule 9)
    assert "B" not in first.load


def r_runs_beside_a_waiting_s() -> tuple:
    """Step model, chunk 10, a host link of 10 tokens per step (a 4,000-token prompt
    loads in 400 steps), capacity 9,100; A and B resident (8,000). t/r (A, 100 in, 100
    out: 10 + 100 = 110 steps, 200 KV) runs; its child x (B, 110 steps, 200 KV) waits
    for it; u/s (A, 500 in, 500 out: 550 steps, 1,000 KV) waits with 900 free."""
    inst = make(
        {"A": 4000, "B": 4000},
        [
            task("t", 0, stage("r", "A", 100, 100), stage("x", "B", 100, 100, ["r"])),
            task("u", 0, stage("s", "A", 500, 500)),
        ],
        capacity=9100,
        load={"kind": "host", "tokens_per_s": 10.0},
    )
    state = released(inst)
    make_resident(state, "A", "B")
    apply_inplace(state, Decision(admit=(("t", "r"),)))
    return inst, state


def test_soon_credits_a_stage_that_fits_once_a_running_stage_ends():
    # r_runs_beside_a_waiting_s: c(a) = 400 s; x needs B: n_B = 1. D = (110 + 110 + 550)
    # / 3 = 256.67 s; s's value is D x 2 = 513.33 (g = 1; its agent runs r: the visit
    # weight). Without ``soon`` keeping B packs nothing (score V_reuse = 400), dropping B
    # admits s now (513.33, B's reuse lost), so B is evicted, to be reloaded for x. With
    # ``soon`` the kept set also counts s at 1 - 110 / D, since r returns the 100 tokens s
    # lacks in 110 s: 400 + 293.33 = 693.33, and nothing moves.
    scores = {}
    for spec in ("topas", "topas:soon=1"):
        inst, state = r_runs_beside_a_waiting_s()
        policy = ready(spec, inst)
        rnd = policy._round(state)
        keep, drop = policy._pack(state, rnd, ("A", "B")), policy._pack(state, rnd, ("A",))
        assert keep.admitted == [] and drop.admitted == [("u", "s")]
        scores[spec] = keep.score, drop.score, policy.decide(state)
    keep, drop, d = scores["topas"]
    assert (keep, drop) == (pytest.approx(400.0), pytest.approx(1540 / 3))
    assert d.evict == ("B",) and d.admit == (("u", "s"),)
    keep, drop, d = scores["topas:soon=1"]
    assert (keep, drop) == (pytest.approx(400.0 + 880 / 3), pytest.approx(1540 / 3))
    assert d.evict == () and d.admit == ()


def test_each_term_has_its_sign_and_switch():
    # The two-agent state of the drain tests, over the fast link: dropping B packs six of
    # A's stages instead of two (one of A's and B's). Per term:
    inst, state = two_agents(FAST_LINK)
    policy = ready("topas", inst)
    rnd = policy._round(state)
    keep, drop = policy._pack(state, rnd, ("A", "B")), policy._pack(state, rnd, ("A",))
    # J_admit (progress): more admitted progress scores more; progress=0 removes it, and
    # then only J_move (dropping B costs c(B) for its waiting task) separates them
    assert len(drop.admitted) == 6 and len(keep.admitted) == 2
    assert drop.score > keep.score
    off = ready("topas:progress=0", inst)
    r0 = off._round(state)
    c_b = r0.cost["B"]
    assert off._pack(state, r0, ("A", "B")).score == 0.0
    assert off._pack(state, r0, ("A",)).score == pytest.approx(-c_b)
    # J_move: a higher weight costs the drop more, move=0 makes it free
    heavy = ready("topas:move=1000", inst)
    rh = heavy._round(state)
    assert heavy._pack(state, rh, ("A",)).score == pytest.approx(drop.score + c_b - 1000 * c_b)
    free = ready("topas:move=0", inst)
    rf = free._round(state)
    assert free._pack(state, rf, ("A",)).score == pytest.approx(drop.score + c_b)


def test_visit_term_counts_a_stage_of_a_running_agent_more_and_switches_off():
    # A and B resident; A runs t/r. Waiting: u/s of A and v/s of B, the same size, both fit
    # (free 10,000 - 8,000 - 200 = 1,800). Admitting u continues A's visit, so J_admit
    # counts it (1 + visit) times; v starts one and counts once. Both are roots of one-stage
    # tasks released at 0: the same Delta, so with visit=0 they count the same.
    inst, state = a_runs_r(
        task("t", 0, stage("r", "A", 100, 100)),
        task("u", 0, stage("s", "A", 100, 100)),
        task("v", 0, stage("s", "B", 100, 100)),
    )
    scores = {}
    for spec in ("topas:visit=0", "topas", "topas:visit=3"):
        policy = ready(spec, inst)
        pack = policy._pack(state, policy._round(state), ("A", "B"))
        assert sorted(pack.admitted) == [("u", "s"), ("v", "s")]
        value = pack.credit[("v", "s")]  # a stage that starts a visit: its plain value
        assert value > 0
        scores[spec] = (pack.score, pack.credit[("u", "s")] / value, value)
    assert [w for _, w, _ in scores.values()] == pytest.approx([1.0, 2.0, 4.0])
    base, _, value = scores["topas:visit=0"]
    assert scores["topas"][0] == pytest.approx(base + value)
    assert scores["topas:visit=3"][0] == pytest.approx(base + 3 * value)


def test_aging_weights_old_tasks_and_switches_off():
    # g_i(t) = 1 + rho * log(1 + age / H_age) (the paper's form): 1 at age 0, growing with
    # age; aging=0 -> 1
    inst = make({"A": 10}, [task("t", 0, stage("s", "A", 5, 5))], capacity=100)
    state = released(inst)
    policy = ready("topas:aging=2,age_scale=10,age_form=log", inst)
    assert policy._weight(state, "t") == 1.0
    state.time = 10.0
    assert policy._weight(state, "t") == pytest.approx(1 + 2 * math.log(2))
    assert ready("topas:aging=0", inst)._weight(state, "t") == 1.0


def test_linear_aging_grows_with_the_age_itself():
    # age_form=linear (the default): g = 1 + rho * age / H_age; rho = 2, H_age = 10: 1 at 0, 3 at
    # 10 s (the log form: 1 + 2 log 2 = 2.39), 21 at 100 s (log: 1 + 2 log 11 = 5.80)
    inst = make({"A": 10}, [task("t", 0, stage("s", "A", 5, 5))], capacity=100)
    state = released(inst)
    linear = ready("topas:aging=2,age_scale=10", inst)
    log = ready("topas:aging=2,age_scale=10,age_form=log", inst)
    assert linear._weight(state, "t") == 1.0
    for age, want in ((10.0, 3.0), (100.0, 21.0)):
        state.time = age
        assert linear._weight(state, "t") == pytest.approx(want)
        assert log._weight(state, "t") == pytest.approx(1 + 2 * math.log1p(age / 10))
    with pytest.raises(ValueError, match="age_form: unknown form 'cubic'"):
        ready("topas:age_form=cubic", inst)


def test_excess_aging_counts_only_the_age_beyond_the_mean_age():
    # age_form=excess: g = 1 + rho * max(0, age - mean age of the tasks in view) / H_age.
    # Tasks released at 0 and 10; rho = 2, H_age = 10. At t = 20 the ages are 20 and 10,
    # their mean 15: the old task gets 1 + 2 * 5 / 10 = 2, the young one 1 (the linear
    # form: 1 + 2 * 20 / 10 = 5 and 3). At t = 40 (ages 40 and 30, mean 35): 2 and 1 again,
    # since only the gap between them counts.
    tasks = [task("old", 0, stage("s", "A", 5, 5)), task("new", 10, stage("s", "A", 5, 5))]
    inst = make({"A": 10}, tasks, capacity=100)
    state = released(inst)
    excess = ready("topas:aging=2,age_scale=10,age_form=excess", inst)
    linear = ready("topas:aging=2,age_scale=10", inst)
    for t, want in ((20.0, (2.0, 1.0)), (40.0, (2.0, 1.0))):
        state.time = t
        excess._sync(state)
        assert (excess._weight(state, "old"), excess._weight(state, "new")) == pytest.approx(want)
    state.time = 20.0
    assert (linear._weight(state, "old"), linear._weight(state, "new")) == pytest.approx((5, 3))
    assert ready("topas:aging=0,age_form=excess", inst)._weight(state, "old") == 1.0


def test_additive_linear_aging_lets_an_old_long_task_pass_a_fresh_short_one():
    # Pack values of two task slots, by hand (H_age = 10 s, rho = 1 unless set): at t = 20
    # the long task (released at 0: g = 1 + 20/10 = 3) has Smith's ratio Delta / L = 2/8
    # = 0.25, the short one (released at 15: g = 1.5) 1/1 = 1.
    # additive (default): 0.25 + (3 - 1) = 2.25 against 1 + 0.5 = 1.5: the old task first;
    # multiplied: 3 * 0.25 = 0.75 against 1.5 * 1 = 1.5: the short one first;
    # the paper's form (log, multiplied, rho = 3): (1 + 3 log 3) / 4 = 1.07 against
    # 1 + 3 log 1.5 = 2.22: the short one first.
    inst = make({"A": 10}, [task("t", 0, stage("s", "A", 5, 5))], capacity=100)
    view = SimpleNamespace(
        release=np.array([0.0, 15.0]), share=np.array([2.0, 1.0]), length=np.array([8.0, 1.0])
    )
    expected = {
        "topas:age_scale=10": [2.25, 1.5],
        "topas:age_scale=10,additive=0": [0.75, 1.5],
        "topas:age_scale=10,age_form=log,additive=0,aging=3": [
            (1 + 3 * math.log(3)) / 4,
            1 + 3 * math.log(1.5),
        ],
    }
    for spec, values in expected.items():
        _, value = ready(spec, inst)._values(view, 20.0)
        assert value.tolist() == pytest.approx(values), spec


def busy_b(decoded: int) -> tuple:
    """``two_agents`` with B's stage running instead of waiting: a 5,000-token decode
    (5,050 steps, so its drain outlasts D and the memory it returns is worth nothing now)
    that has decoded ``decoded`` tokens and holds 5,500 tokens of KV. Free: 14,500 -
    8,000 - 5,500 = 1,000, one stage of A. D = the mean predicted stage service =
    (6 x 550 + 5,050) / 7 = 1,193 s."""
    tasks = [task(f"a{i}", 0, stage("s", "A", 500, 500)) for i in range(6)]
    tasks.append(task("b0", 0, stage("s", "B", 500, 5000)))
    inst = make({"A": 4000, "B": 4000}, tasks, capacity=14_500, load=FAST_LINK)
    state = released(inst)
    make_resident(state, "A", "B")
    apply_inplace(state, Decision(admit=(("b0", "s"),)))
    state.running[("b0", "s")].generated = decoded
    return inst, state


def test_retracts_a_dropped_prompts_stage_when_the_batch_gains_more_than_it_loses():
    # Retracting b0 frees 9,500 tokens now: five more stages of A, each worth D = 1,193 s,
    # against J_redo = 10 decoded tokens x 1 s + J_revoke 0 + J_move 0.004 s for b0's task,
    # which must wait for B again. Draining instead gains nothing now (the drain outlasts
    # D). So TOPAS with voluntary retraction on retracts b0, evicts B and admits all six of
    # A's stages; by default (retract=0) it never stops a running stage on its own.
    inst, state = busy_b(decoded=10)
    assert ready("topas", inst).decide(state).preempt == ()
    d = ready("topas:retract=1", inst).decide(state)
    assert d.preempt == (("b0", "s"),) and d.evict == ("B",)
    assert sorted(d.admit) == [(f"a{i}", "s") for i in range(6)]
    apply_inplace(state, d)  # the decision is feasible as it stands
    assert state.phase[("b0", "s")] is Phase.WAITING


def test_drain_switches_keep_a_prefix_in_use_or_credit_only_its_prompt():
    # busy_b with b0 near its end: started 5,000 s before now, so its drain ends in T =
    # 50 s and a stage that fits only in the drained memory keeps 1 - T / D of its credit
    # (D = 1,193 s, each A stage's credit). Free now: 1,000 tokens, one stage of A (a0).
    # By default dropping B drains its prompt and b0's KV, 4,000 + 5,500 = 9,500 tokens:
    # the other five stages of A fit there, D + 5 (1 - T / D) D. With drain_running=0 only
    # the prompt's 4,000 count: four stages, D + 4 (1 - T / D) D. With drain=0 B, in use,
    # stays in R': the set without it is no candidate, and B is kept.
    scores = {}
    for spec in ("topas", "topas:drain_running=0", "topas:drain=0"):
        inst, state = busy_b(decoded=10)
        state.running[("b0", "s")].started_at = state.time - 5000.0
        policy = ready(spec, inst)
        rnd = policy._round(state)
        d_s = policy._mean_svc
        assert d_s == pytest.approx(1193, abs=1) and rnd.drain_s == {"B": pytest.approx(50.0)}
        late = (1 - 50.0 / d_s) * d_s
        drop = policy._pack(state, rnd, ("A",))
        scores[spec] = None if drop is None else drop.score
        policy.decide(state)
        assert policy._kept == (("A", "B") if spec == "topas:drain=0" else ("A",)), spec
    assert scores["topas"] == pytest.approx(d_s + 5 * late)
    assert scores["topas:drain_running=0"] == pytest.approx(d_s + 4 * late)
    assert scores["topas:drain=0"] is None


def a0_near_its_end(agents: dict, capacity: int, e0_first: bool = False) -> tuple:
    """Over the fast link, step model: tasks a0 and a1 (agent A) and c0-c3 (agent C), every
    stage 500 + 500 = 1,000 tokens, and where ``agents`` has E, e0 (agent E, 50 + 50). All
    arrive at 0, or with ``e0_first`` e0 at 0 and the others at 1,000. The prompts of A
    (and E) are resident and a0/s runs, 10 of its 550 steps left."""
    late = 1000.0 if e0_first else 0.0
    tasks = [task(t, late, stage("s", "A", 500, 500)) for t in ("a0", "a1")]
    tasks += [task(f"c{i}", late, stage("s", "C", 500, 500)) for i in range(4)]
    if "E" in agents:
        tasks.append(task("e0", 0, stage("s", "E", 50, 50)))
    inst = make(agents, tasks, capacity=capacity, load=FAST_LINK)
    state = released(inst)
    make_resident(state, *(a for a in ("A", "E") if a in agents))
    apply_inplace(state, Decision(admit=(("a0", "s"),)))
    state.running[("a0", "s")].started_at = state.time - 540.0
    state.running[("a0", "s")].generated = 490
    return inst, state


def c_waits_for_a_drain() -> tuple:
    """Capacity 10,000: A's 4,000-token prompt is resident, a0/s runs (1,000 tokens of KV)
    and a1/s waits; C's 6,000-token prompt is absent and its four tasks wait. Free:
    10,000 - 4,000 - 1,000 = 5,000, less than C's prompt, so C can come in only once A
    drains (a0 ends, A's prompt goes)."""
    return a0_near_its_end({"A": 4000, "C": 6000}, 10_000)


def test_drain_load_waits_for_a_drain_to_bring_a_prompt_in():
    # By hand (D = 550 s, the predicted service of every stage; g = 1 at age 0):
    # - R' = {A} admits a1, whose agent runs a stage now: 2 D (visit weight) = 1,100.
    # - R' = {A, C} does not fit: 5,000 - 6,000 < 0, and nothing drains.
    # - R' = {C} drains A (a0 ends in T = 10 s: A's prompt and a0's KV, 5,000 tokens).
    #   By default it does not fit either (the load needs 6,000 now, 5,000 are free), so
    #   TOPAS keeps A. With drain_load=1 C's prompt waits for the drain: of the 10,000
    #   tokens then free, 6,000 hold C's prompt and 4,000 its four stages, each credited
    #   at 1 - T / D; less J_move: c(A) = 1 s for a1's task, which waits for A, and c(C) =
    #   1 s for each of the four tasks that wait for C's load. 4 (1 - 10/550) D - 5 = 2,155.
    # Nothing can start now: nothing is loaded, evicted (A is in use) or admitted, and a1
    # is held (A is outside R').
    inst, state = c_waits_for_a_drain()
    default = ready("topas:drain_load=0", inst)
    d = default.decide(state)
    assert d.admit == (("a1", "s"),) and default._kept == ("A",)
    policy = ready("topas", inst)  # drain_load=1, the default since 2026-12-07
    rnd = policy._round(state)
    assert policy._mean_svc == pytest.approx(550.0) and rnd.drain_s == {"A": pytest.approx(10.0)}
    assert policy._pack(state, rnd, ("A", "C")) is None
    assert policy._pack(state, rnd, ("A",)).score == pytest.approx(1100.0)
    assert policy._pack(state, rnd, ("C",)).score == pytest.approx(4 * (550.0 - 10.0) - 5.0)
    assert default._pack(state, default._round(state), ("C",)) is None
    d = policy.decide(state)
    assert (d.admit, d.load, d.evict, d.held) == ((), (), (), (("a1", "s"),))
    assert policy._kept == ("C",)
    # and the whole run, under every invariant (debug), serves C once A has drained
    sched = simulate(inst, make_policy("topas:drain_load=1"), timing="step", debug=True)
    assert len(sched.runs) == inst.num_stages


def c_waits_beside_an_idle_prompt(e0_first: bool = False) -> tuple:
    """:func:`c_waits_for_a_drain` with capacity 11,000, C's prompt 6,500 tokens, and a
    third agent E: its 1,000-token prompt resident and idle, one task e0 of 50 + 50 tokens
    waiting. Free: 11,000 - 4,000 - 1,000 - 1,000 = 5,000: e0 fits now, C's prompt only
    once A drains (with ``e0_first``, e0's task has waited 1,000 s, the others none)."""
    return a0_near_its_end({"A": 4000, "C": 6500, "E": 1000}, 11_000, e0_first)


@pytest.mark.parametrize("fill", ["search", "greedy"])
def test_while_a_load_waits_for_a_drain_nothing_starts(fill):
    # By hand: D = the mean predicted service = (6 x 550 + 55) / 7 = 479.29 s, and each
    # stage's credit is D (a one-stage task's cut when it starts now rather than D later),
    # twice for a1 (A runs a stage: visit weight). A drains in T = 10 s, returning 5,000.
    # - R' = {A, E}: a1 and e0 fit now: 2 D + D = 1,437.86.
    # - R' = {C}: E's unused prompt is dropped (6,000 free), C's load still needs 500 more:
    #   it waits; of the 5,000 drained, 500 go to the load, four c stages take 4,000, each
    #   at 1 - T / D; J_move: 1 s for a1 (A), 1 for e0 (E) and 4 for the c tasks (C):
    #   4 (D - 10) - 6 = 1,871.14.
    # - R' = {C, E}: C's load needs 1,500 of the drained memory; the 3,500 left take three
    #   c stages and e0 at 1 - T / D; J_move 1 + 3: 4 (D - 10) - 4 = 1,873.14, the best.
    # The winner's load waits for the drain, so nothing starts now: e0, which fits in the
    # memory free now, is held beside a1 (that memory is C's), by the pack (fill=search)
    # and by the single pass (fill=greedy), whose filling would otherwise admit it. C's
    # stages are not held: an engine that admits on its own (SGLang's) then starts them,
    # and loads C's prompt with them, once the memory is there.
    inst, state = c_waits_beside_an_idle_prompt()
    policy = ready(f"topas:fill={fill}", inst)
    rnd = policy._round(state)
    d_s = (6 * 550 + 55) / 7
    assert policy._mean_svc == pytest.approx(d_s)
    for agents, score in (
        (("A", "E"), 3 * d_s),
        (("C",), 4 * (d_s - 10) - 6),
        (("C", "E"), 4 * (d_s - 10) - 4),
    ):
        assert policy._pack(state, rnd, agents).score == pytest.approx(score)
    assert policy._pack(state, rnd, ("C", "E")).waits == ("C",)
    d = policy.decide(state)
    assert policy._kept == ("C", "E")
    assert (d.admit, d.load, d.evict) == ((), (), ())
    assert d.held == (("a1", "s"), ("e0", "s"))


def test_a_starving_stage_served_first_is_never_also_held():
    # The state above, but e0's task released 1,000 s before the others (t = 1,000 now):
    # it has waited 1,000 s, over twice the mean age (1,000 / 7) and a mean task's path, so
    # it starves and is admitted first (it fits), E kept. The search then still prefers
    # to wait for A's drain to load C: from the 4,900 tokens free and the 5,000 A returns,
    # C's 6,500 leave 3,400, three c stages at 1 - T / D, less J_move 1 + 3: 3 (D - 10) - 4
    # = 1,403.9 against 2 D = 958.6 for R' = {A, E}. Nothing else starts, and every other
    # waiting stage is held, but not e0, which the decision admits (a SGLang round that
    # found it both admitted and held gave up TOPAS's order).
    inst, state = c_waits_beside_an_idle_prompt(e0_first=True)
    policy = ready("topas", inst)
    d = policy.decide(state)
    assert policy.reserving and policy._kept == ("C", "E")
    assert (d.admit, d.load, d.evict) == ((("e0", "s"),), (), ())
    assert d.held == (("a1", "s"),)


RECOMPUTE_COST = {
    "kind": "linear",
    "base_s": 1.0,
    "prefill_token_s": 0.01,
    "decode_seq_s": 0.1,
    "kv_token_s": 0.001,
}


def b_waits_beside_a_batch(b_resident: bool, load: dict | None = None) -> tuple:
    """A linear cost model (recompute unless ``load``), capacity 20,000, room for all:
    A's prompt resident and its two stages a0/s and a1/s running; b0/s of B waits, B's
    4,000-token prompt absent (or resident and idle). Each stage is 100 tokens in, 10 out."""
    tasks = [task(f"a{i}", 0, stage("s", "A", 100, 10)) for i in range(2)]
    tasks.append(task("b0", 0, stage("s", "B", 100, 10)))
    inst = make({"A": 4000, "B": 4000}, tasks, capacity=20_000, cost=RECOMPUTE_COST, load=load)
    state = released(inst)
    make_resident(state, "A", *(["B"] if b_resident else []))
    apply_inplace(state, Decision(admit=(("a0", "s"), ("a1", "s"))))
    return inst, state


def test_stall_charges_a_recompute_once_per_running_stage():
    # Calibrated timing, recompute: c(B) = 4,000 x 0.01 = 40 s, and D = the mean predicted
    # service = 1 s of prefill + 10 tokens x 4.2 s = 43 s. Loading B for b0 scores
    # J_admit - J_move = 43 - 40 = +3 against R' = {A}: TOPAS loads it. But the load is a
    # prefill, and a0 and a1 do not decode while it runs: with stall=1 it also costs
    # 2 x 40 s, so 43 - 120 = -77, and b0 is held until the batch has drained.
    inst, state = b_waits_beside_a_batch(b_resident=False)
    plain, stalled = (ready(s, inst, timing="calibrated") for s in ("topas:stall=0", "topas"))
    assert plain.decide(state).admit == (("b0", "s"),)
    d = stalled.decide(state)
    assert d.admit == () and d.held == (("b0", "s"),)
    for policy, gain in ((plain, 3.0), (stalled, -77.0)):
        rnd = policy._round(state)
        assert rnd.cost["B"] == pytest.approx(40.0)
        keep = policy._pack(state, rnd, ("A", "B")).score - policy._pack(state, rnd, ("A",)).score
        assert keep == pytest.approx(gain)
    # dropping a resident B with b0 waiting: l_out (40 s for b0's task), and with stall=1
    # the reload it makes due holds up the batch too (another 2 x 40 s)
    inst, state = b_waits_beside_a_batch(b_resident=True)
    for spec, cost in (("topas:stall=0", -40.0), ("topas", -120.0)):
        policy = ready(spec, inst, timing="calibrated")
        rnd = policy._round(state)
        assert policy._pack(state, rnd, ("A",)).score == pytest.approx(cost)


def test_stall_changes_nothing_where_a_load_is_not_a_prefill():
    # In the step model, and over a host link in calibrated timing, a load runs beside
    # the batch: stall=1 scores every candidate as the default does
    for timing, load in (("step", None), ("calibrated", FAST_LINK)):
        for b_resident in (False, True):
            inst, state = b_waits_beside_a_batch(b_resident, load)
            plain, stalled = (ready(s, inst, timing=timing) for s in ("topas:stall=0", "topas"))
            for keep in (("A", "B"), ("A",)):
                r0, r1 = plain._round(state), stalled._round(state)
                assert plain._pack(state, r0, keep).score == stalled._pack(state, r1, keep).score
            assert plain.decide(state) == stalled.decide(state)


@settings(max_examples=25, deadline=None)
@given(random_instances(max_tasks=4, max_stages=5, host=True))
def test_stall_runs_as_the_default_over_a_host_link(inst):
    # the calibrated model with host swap, and the step model: the same schedule
    for timing in ("step", "calibrated"):
        assert_same_runs(inst, timing, "topas:stall=0", "topas")


def test_token_floor_leaves_a_stage_that_outran_its_prediction_time_to_decode():
    # a0/s (500 in, 500 predicted out) started 540 s ago and has decoded 490 tokens; in
    # calibrated timing its predicted service S = service_s(500, 500) is a few seconds, so
    # by the time since it started it ends now (left = max(0, S - 540) = 0). With the
    # floor it still has 500 - 490 = 10 tokens to decode: 10 x one iteration at the
    # reference batch, service_s(0, 1). Once it has decoded all 500 (or more) one token
    # is left; before it decodes, and where the time since it started leaves more, the
    # floor takes nothing.
    inst, state = c_waits_for_a_drain()
    plain, floored = (ready(s, inst, timing="calibrated") for s in ("topas:token_floor=0", "topas"))
    a0, run = ("a0", "s"), state.running[("a0", "s")]
    per_token, svc = (floored.ctx.predict.service_s(*io) for io in ((0, 1), (500, 500)))
    assert svc < 540.0
    assert plain._round(state).drain_s["A"] == 0.0
    assert floored._round(state).drain_s["A"] == pytest.approx(10 * per_token)
    for generated, left in ((500, per_token), (700, per_token), (0, 0.0)):
        run.generated = generated
        assert floored._pred.remaining(state, a0, token_floor=True) == pytest.approx(left)
    run.started_at, run.generated = state.time - 0.001, 10
    assert floored._pred.remaining(state, a0, token_floor=True) == pytest.approx(svc - 0.001)
    assert svc - 0.001 > 490 * per_token


@settings(max_examples=25, deadline=None)
@given(random_instances(max_tasks=4, max_stages=5))
def test_token_floor_changes_nothing_in_the_step_model(inst):
    # in the step model a stage's service is its steps from its start (and the engine
    # reports no decoded tokens): the floor is never taken, the same schedule
    assert_same_runs(inst, "step", "topas:token_floor=0", "topas")


def assert_same_runs(inst, timing: str, spec: str, other: str) -> None:  # type: ignore[no-untyped-def]
    """``spec`` and ``other`` run ``inst`` alike: the same runs, stage by stage, or the
    same :class:`SimulationError` (``retract=1`` can livelock on a tiny budget, which the
    engine stops: the two decide alike there too)."""
    a, b = (runs_or_error(inst, s, timing) for s in (spec, other))
    assert a == b, (timing, spec, other)


def runs_or_error(inst, spec: str, timing: str):  # type: ignore[no-untyped-def]
    """The runs of ``spec`` on ``inst``, or its engine's error without the spec's name."""
    try:
        return simulate(inst, make_policy(spec), timing=timing).runs
    except SimulationError as e:
        return str(e).replace(repr(spec), "SPEC")


@given(random_instances(max_tasks=4, max_stages=5))
def test_drain_load_is_off_with_voluntary_retraction(inst):
    # With retract=1 a set's memory comes back by retraction, at once; the two together
    # thrashed (chain, 200 tasks at load 1.2, seed 22: the same stages retracted and
    # re-admitted without end), so drain_load does nothing there: the same runs as
    # retract=1,drain_load=0, in both timing modes.
    for timing in ("step", "calibrated"):
        assert_same_runs(inst, timing, "topas:retract=1", "topas:retract=1,drain_load=0")


def test_voluntary_retraction_takes_a_stage_once_at_most():
    # Found by hypothesis (a 36-token budget, recompute, calibrated timing): with retract=1
    # t1/s2 was retracted voluntarily and re-admitted without end, the engine's guard
    # stopping the run at its 10,000th stop (t = 41,735 s). Each retraction frees room for
    # the other agent's stages, whose admission makes a0's set the better one again. A
    # stage retracted once is now retracted voluntarily no more (only by decode memory
    # running out): the run ends, every stage done, no stage stopped more than twice.
    tasks = [
        task("t0", 0.5, stage("s0", "a0", 20, 8), stage("s1", "a0", 8, 1),
             stage("s2", "a1", 10, 1, ("s1",), pred=8), stage("s3", "a0", 10, 2, ("s0",)),
             stage("s4", "a0", 6, 8, ("s0", "s1", "s2"))),
        task("t1", 0.0, stage("s0", "a0", 18, 1), stage("s1", "a0", 13, 3),
             stage("s2", "a0", 11, 4, pred=7), stage("s3", "a0", 19, 6, ("s1",)),
             stage("s4", "a1", 15, 3, ("s1", "s2"))),
        task("t2", 0.0, stage("s0", "a1", 1, 1, pred=1)),
        task("t3", 0.0, stage("s0", "a0", 1, 1)),
    ]  # fmt: skip
    cost = {"kind": "linear", "base_s": 1.0, "prefill_token_s": 0.01, "decode_seq_s": 0.05,
            "kv_token_s": 0.001}  # fmt: skip
    inst = make({"a0": 8, "a1": 5}, tasks, capacity=36, chunk=4, cost=cost,
                load={"kind": "recompute"})  # fmt: skip
    sched = simulate(inst, make_policy("topas:retract=1"), timing="calibrated", debug=True)
    assert len([r for r in sched.runs if not r.preempted]) == inst.num_stages
    stops = Counter(r.ref for r in sched.runs if r.preempted)
    assert max(stops.values(), default=0) <= 2


class KeepsInUse(TOPAS):
    """TOPAS that checks, after each decision, that every prefix with running stages is
    in the kept set (``drain=0``: R' never leaves one out)."""

    def decide(self, state):  # type: ignore[no-untyped-def]
        d = super().decide(state)
        in_use = {a for a, p in state.prefixes.items() if p.users}
        assert self.reserving or in_use <= set(self._kept)
        return d


@settings(max_examples=25, deadline=None)
@given(random_instances(max_tasks=4, max_stages=5))
def test_without_drains_a_prefix_in_use_is_always_kept(inst):
    for timing in ("step", "calibrated"):
        policy = KeepsInUse(drain=False)
        sched = simulate(inst, policy, timing=timing, debug=True)
        assert len([r for r in sched.runs if not r.preempted]) == inst.num_stages


def test_fill_greedy_keeps_the_searchs_prefix_set():
    # two_agents over the fast link: the search drops B (draining it gains 4 D for c(B)),
    # and topas-greedy's pass, filling R' = {A}, admits A's six stages, as the pack does:
    # they all fit. B's stage is held, its unused prompt evicted.
    inst, state = two_agents(FAST_LINK)
    policy = ready("topas:fill=greedy", inst)
    d = policy.decide(state)
    assert d.evict == ("B",) and d.held == (("b0", "s"),) and policy._kept == ("A",)
    assert sorted(d.admit) == [(f"a{i}", "s") for i in range(6)]


def test_fill_greedy_admits_the_critical_sibling_the_pack_reads_later():
    # One task, two parallel stages of resident agent A: a (500 in, 10 out: 510 tokens of
    # KV) and z (500 in, 1,000 out: 1,500), with 1,600 tokens free, so one of them fits.
    # The pack reads a task's waiting stages in stage-id order: it admits a, and z no
    # longer fits. topas-greedy's pass ranks z first: z is on the task's longest path
    # (crit 1), a has a slack of z's service less its own (crit < 1). Starting z is what
    # cuts the task's completion, and fill=greedy admits it.
    t = task("t", 0, stage("a", "A", 500, 10), stage("z", "A", 500, 1000))
    inst = make({"A": 4000}, [t], capacity=5_600, load=FAST_LINK)
    got = {}
    for spec in ("topas", "topas:fill=greedy"):
        state = released(inst)
        make_resident(state, "A")
        assert state.free_kv == 1600
        got[spec] = ready(spec, inst).decide(state).admit
    assert got == {"topas": (("t", "a"),), "topas:fill=greedy": (("t", "z"),)}


@settings(max_examples=25, deadline=None)
@given(random_instances(max_tasks=4, max_stages=5, host=False))
def test_fill_auto_is_the_pass_where_a_load_is_a_prefill(inst):
    # recompute in calibrated timing: fill=auto runs as fill=greedy; in the step model (a
    # load runs beside the batch there) as fill=search
    for timing, same in (("calibrated", "topas:fill=greedy"), ("step", "topas:fill=search")):
        assert_same_runs(inst, timing, "topas:fill=auto", same)


@settings(max_examples=25, deadline=None)
@given(random_instances(max_tasks=4, max_stages=5, host=True))
def test_fill_auto_is_the_pack_over_a_host_link(inst):
    for timing in ("step", "calibrated"):
        assert_same_runs(inst, timing, "topas:fill=auto", "topas:fill=search")


def test_fill_auto_follows_the_timing_mode_on_a_hand_built_state():
    # the sibling state above in calibrated timing: over the fast host link fill=auto
    # admits what the pack does (a, read first); with recompute, what the pass does (z,
    # on the longest path)
    t = task("t", 0, stage("a", "A", 500, 10), stage("z", "A", 500, 1000))
    for load, want in ((FAST_LINK, ("t", "a")), (None, ("t", "z"))):
        inst = make({"A": 4000}, [t], capacity=5_600, cost=RECOMPUTE_COST, load=load)
        state = released(inst)
        make_resident(state, "A")
        assert ready("topas:fill=auto", inst, timing="calibrated").decide(state).admit == (want,)


class InsideKept(TOPAS):
    """TOPAS that checks each decision against its kept set ``R'``: it admits only stages
    of agents in ``R'``, holds every waiting stage of the others, and never both admits
    and holds a stage. Where the winning pack's loads wait for a drain (``drain_load``),
    no stage starts (but a starving stage served first), only those agents' prompts may
    load (one that fits in the memory free now starts at once), and every waiting stage
    is held but those of the agents to load."""

    waits: tuple[str, ...] = ()

    def _commit(self, state, rnd, best, plan, pinned=None, record=True):  # type: ignore[no-untyped-def]
        if record:
            self.waits = best.waits
        return super()._commit(state, rnd, best, plan, pinned, record)

    def decide(self, state):  # type: ignore[no-untyped-def]
        self.waits = ()
        d = super().decide(state)
        kept = set(self._kept)
        assert {state.agent_of(ref) for ref in d.admit} <= kept
        assert not set(d.admit) & set(d.held) and len(set(d.held)) == len(d.held)
        outside = {ref for ref in state.waiting if state.agent_of(ref) not in kept}
        assert outside <= set(d.held)
        if self.waits:
            assert (self.reserving or not d.admit) and set(d.load) <= set(self.waits)
            rest = {r for r in state.waiting if state.agent_of(r) not in self.waits}
            assert rest - set(d.admit) <= set(d.held)
        return d


@settings(max_examples=25, deadline=None)
@given(random_instances(max_tasks=4, max_stages=5))
def test_either_fill_admits_inside_the_kept_set_only(inst):
    # and every run is feasible (debug=True re-checks the engine's invariants after each
    # event) and finishes every stage, in both timing modes
    for timing, fill in itertools.product(("step", "calibrated"), ("search", "greedy")):
        sched = simulate(inst, InsideKept(fill=fill), timing=timing, debug=True)
        assert len([r for r in sched.runs if not r.preempted]) == inst.num_stages
        if timing == "step":
            verify_step(sched)


class SometimesFilled(TOPAS):
    """``fill=greedy`` with the filler asked at one decision in 50 (the pack admits at the
    others) but told what every decision admitted: it then hears of tasks that arrive,
    run and finish between two of its syncs, and must keep its queue right all the same
    (before the fix its sync dropped such a task from a board that never held it)."""

    def decide(self, state):  # type: ignore[no-untyped-def]
        self.calls = getattr(self, "calls", 0) + 1
        filler = self._filler
        assert filler is not None
        self._filler = None if self.calls % 50 else filler
        d = super().decide(state)
        self._filler = filler
        filler.admitted(d.admit)
        return d


@pytest.mark.parametrize("workload", ["chain", "mixed"])
def test_a_filler_asked_rarely_keeps_its_queue(workload):
    from topas.workloads import generate

    inst = generate(workload, num_tasks=60, seed=1000, load=1.2)
    for timing in ("step", "calibrated"):
        sched = simulate(inst, SometimesFilled(fill="greedy"), timing=timing, debug=True)
        assert len([r for r in sched.runs if not r.preempted]) == inst.num_stages


def test_does_not_retract_when_the_redo_costs_more():
    # J_redo = 10 tokens x 1 s x 1,000 = 10,000 s > 5 D = 5,965 s: b0 keeps running (B is
    # drained or kept, but nothing is stopped); the same without the retract switch.
    for spec in ("topas:retract=1,redo=1000", "topas"):
        inst, state = busy_b(decoded=10)
        d = ready(spec, inst).decide(state)
        assert d.preempt == () and len(d.admit) == 1, spec


def test_retraction_takes_the_least_redo_plus_revoked_credit():
    # J_redo = decoded tokens x one decode step; J_revoke = the credit stored at admission.
    # Step model: one decode step = 1 s. r1 decoded 3 tokens (3 s to redo), r2 decoded 1
    # but was admitted with a credit of 5 s: r1 loses 3, r2 loses 1 + 5 = 6, so r1 goes
    # first; with revoke=0, r2 (1 s) goes first; with redo=0, r1 (credit 0) goes first.
    inst = make(
        {"A": 10},
        [task("t1", 0, stage("r", "A", 5, 9)), task("t2", 0, stage("r", "A", 5, 9))],
        capacity=100,
    )
    state = released(inst)
    make_resident(state, "A")
    apply_inplace(state, Decision(admit=(("t1", "r"), ("t2", "r"))))
    state.running[("t1", "r")].generated = 3
    state.running[("t2", "r")].generated = 1
    cands = [("t1", "r"), ("t2", "r")]
    for spec, first in (
        ("topas", ("t1", "r")),
        ("topas:revoke=0", ("t2", "r")),
        ("topas:redo=0", ("t1", "r")),
    ):
        policy = ready(spec, inst)
        policy._credit[("t2", "r")] = 5.0
        assert policy.retraction_order(state, cands)[0] == first, spec


def test_queue_view_ranks_by_value_then_length_release_task_and_stage():
    # Three tasks; per task slot: value (higher first), length, release. t1 and t2 tie on
    # value and length; t1 was released first. Task t0's two waiting stages tie on every
    # task key and go by stage id. Agent A holds t0/b, t0/a and t2/x; agent B holds t1/y.
    from topas.policies.search_view import QueueView

    view = QueueView(["A", "B"])
    for tid, release in (("t0", 0.0), ("t1", 1.0), ("t2", 2.0)):
        view.add_task(tid, release)
    view.set_task("t0", share=1.0, length=1.0)
    view.set_task("t1", share=1.0, length=2.0)
    view.set_task("t2", share=1.0, length=2.0)
    value = view.share / view.length  # t0: 1, t1: 0.5, t2: 0.5
    view.add_stage(("t0", "b"), "A", 10, order=1)
    view.add_stage(("t0", "a"), "A", 10, order=0)
    view.add_stage(("t2", "x"), "A", 10, order=0, opens=("C",))
    view.add_stage(("t1", "y"), "B", 10, order=0, opens=("B", "D"))
    ranking = view.ranked(value)
    assert ranking.heads() == [(0, "A"), (2, "B")]  # each agent's best stage, best first
    # A's stages in pack order: t0/a, t0/b, t2/x (opens C, third); B's: t1/y (opens B, D)
    assert ranking.opened(2) == {"B", "D"} and ranking.opened(3) == {"B", "C", "D"}
    view.set_opens(("t1", "y"), ())
    assert view.ranked(value).opened(3) == {"C"}
    got = ranking.take("A", 2) + ranking.take("A", 2)
    assert [r for r, _, _ in got] == [("t0", "a"), ("t0", "b"), ("t2", "x")]
    assert [rank for _, rank, _ in got] == [0, 1, 3]  # t1/y (rank 2) sits between them
    assert ranking.take("B", 5)[0][:2] == (("t1", "y"), 2)
    assert ranking.take("A", 1) == []
    view.drop_stage(("t0", "a"))
    assert view.waiting_tasks() == {"A": 2, "B": 1} and view.oldest() == ("t0", "b")


@given(
    tasks=st.lists(
        st.tuples(
            st.sampled_from([0.0, 1.0, 2.0]),
            st.sampled_from([0.5, 1.0]),
            st.sampled_from([0.0, 1.0]),
            st.integers(1, 4),
            st.integers(0, 3),
            st.sampled_from([(), ("A",), ("B", "X"), ("X", "Y", "A")]),
        ),
        min_size=1,
        max_size=12,
    ),
    dropped=st.sets(st.integers(0, 40), max_size=8),
)
def test_queue_view_ranking_is_the_sort_by_its_keys(tasks, dropped):
    """Every waiting stage's rank against a plain sort by (-value, length, release, task
    slot, stage id rank), under many ties and with freed slots reused (dropped stages);
    and the agents opened by each agent's first stages against a plain union (some opened
    agents, X and Y, are not the view's)."""
    from topas.policies.search_view import QueueView

    agents = ["A", "B", "C"]
    view = QueueView(agents)
    k = 0
    opens_of = {}
    for i, (share, length, release, n, first_agent, opens) in enumerate(tasks):
        tid = f"t{i}"
        view.add_task(tid, release)
        view.set_task(tid, share=share, length=length)
        for j in range(n):
            opens_of[(tid, f"s{j}")] = opens[j:]
            view.add_stage((tid, f"s{j}"), agents[(first_agent + j) % 3], 1, n - 1 - j, opens[j:])
            if k in dropped:
                view.drop_stage((tid, f"s{j}"))
            k += 1
    value = view.share / view.length
    ranking = view.ranked(value)
    got = {}
    for a in ranking.spans:
        for ref, rank, _ in ranking.take(a, 10**6):
            got[rank] = ref
    slot = view.tasks.of

    def key(ref):
        t = slot[ref[0]]
        order = int(view.stage_order[view.stages.of[ref]])
        return (-value[t], view.length[t], view.release[t], t, order)

    assert [got[r] for r in sorted(got)] == sorted(view.need, key=key)
    for first in (1, 2, 5):
        by_agent: dict[str, list] = {}
        for ref in sorted(view.need, key=key):
            by_agent.setdefault(agents[int(view.stage_agent[view.stages.of[ref]])], []).append(ref)
        want = {b for refs in by_agent.values() for ref in refs[:first] for b in opens_of[ref]}
        assert ranking.opened(first) == want


def test_an_addition_the_greedy_search_does_not_pack_is_one_pack_refuses():
    """The greedy search scores an addition to R_t whose prompt cannot fit without packing
    it; in a serving loop with many agents, every such addition is one _pack refuses, and
    some additions are of that kind (so the shortcut is exercised)."""
    bench = load_analysis("bench_decision")
    inst = bench.make_instance(16, 0)
    loop = bench.ServingLoop(inst, 100, 0)
    policy = make_policy("topas")
    policy.reset(PolicyContext(server=inst.server, timing="calibrated"))
    skipped = 0
    for _ in range(15):
        state = loop.state
        rnd = policy._round(state)
        for a in sorted(set(rnd.tokens) - rnd.current):
            if not rnd.loads_fit(rnd.free - rnd.tokens[a]):
                skipped += 1
                assert policy._pack(state, rnd, rnd.current | {a}) is None, a
        loop.step(policy.decide(state))
    assert skipped > 0


def test_greedy_search_repeats_across_processes(tmp_path):
    # the greedy search ranks its drops and additions by their last gains; ties must not
    # fall back on the iteration order of a set of agent names
    from topas.workloads import generate

    inst = generate("mixed", num_tasks=60, seed=1001, load=1.2)
    docs = jcts_across_processes(tmp_path, inst, "topas:search=greedy", ("1", "2", "3", "4"))
    assert all(d == docs[0] for d in docs)


def test_step_mode_packs_by_predicted_lengths_not_the_truth():
    # Rule 11: in the step model the engine commits input + the TRUE output (rule 3), but a
    # policy may only know the predicted one. A stage of 20 input tokens told 5 output
    # tokens (truly 50): TOPAS's queue must hold 25, not 70 (it used to read 70), and the
    # engine's own answer stays the truth
    from topas.simulator import StepEngine

    inst = make(
        {"a": 10},
        [task("t", 0, stage("x", "a", 20, 50, pred=5)), task("u", 0, stage("y", "a", 20, 50))],
        capacity=400,
    )
    engine = StepEngine(inst, make_policy("topas"), debug=False, predicted=None, progress=None)
    st = engine.state
    for t in inst.tasks:
        task_arrives(st, TaskInfo.of(t, 0.0))
    assert st.need(("t", "x")) == 70 and st.estimated_need(("t", "x")) == 25
    assert st.estimated_need(("u", "y")) == 70  # told the truth: the same
    policy = make_policy("topas")
    policy.reset(PolicyContext(server=inst.server, timing="step"))
    policy.decide(st)
    assert policy._view.need == {("t", "x"): 25, ("u", "y"): 70}
