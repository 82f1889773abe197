"""The single-pass TOPAS scorer (``topas-greedy``, topas/policies/greedy.py): each score term on
a hand-built state, its switches, and the incremental scoreboard against a from-scratch analysis.

States are built with the engine hooks (``task_arrives``, ``apply_inplace``,
``prefix_ready``, ``complete_stage``) on step-model instances with ``step_s = 1``, chunk 10:
a stage of ``i`` input and ``o`` output tokens is predicted to take ``ceil(i/10) + o``
seconds and a prefix of ``p`` tokens ``ceil(p/10)`` seconds to load.
"""

from __future__ import annotations

import math

import pytest
from conftest import jcts_across_processes, kv_of, make, random_instances, stage, task
from hypothesis import given

from topas.instance import Instance
from topas.policies import make_policy
from topas.policies.base import PolicyContext
from topas.policies.greedy import TOPASGreedy
from topas.schedule import evaluate
from topas.simulator import simulate
from topas.state import (
    Decision,
    Phase,
    PrefixStatus,
    State,
    TaskInfo,
    apply_inplace,
    prefix_ready,
    task_arrives,
)


def _state(inst: Instance, resident=(), time: float = 0.0, releases=None) -> State:
    """Every task released (at ``releases[tid]``, else its arrival), ``resident`` loaded."""
    state = State.initial(inst, kv_of(inst))
    for t in inst.tasks:
        task_arrives(state, TaskInfo.of(t, (releases or {}).get(t.id, t.arrival)))
    for a in resident:
        apply_inplace(state, Decision(load=(a,)))
        prefix_ready(state, a)
    state.time = time
    return state


def _run(state: State, refs) -> None:  # type: ignore[no-untyped-def]
    """Admit ``refs`` (their prefixes resident): they are running."""
    apply_inplace(state, Decision(admit=tuple(refs)))
    assert all(state.phase[r] == Phase.RUNNING for r in refs)


def _decide(inst: Instance, state: State, spec: str = "topas-greedy") -> Decision:
    policy = make_policy(spec)
    policy.reset(PolicyContext(server=inst.server, timing="step"))
    return policy.decide(state)


# --------------------------------------------------------------------------- reuse


def _reuse_case():
    # Capacity 110. Resident: a (20 tokens) and b (20), both unused. Task t0's stage r
    # (agent c) runs and its three children all need agent a: they become ready within
    # 2 s. Task t1's stage w needs agent d (absent, 30 tokens) plus 10 + 20 = 30 of KV.
    # Running r holds c (20) + 10; so 20 + 20 + 30 = 70 are committed and 40 free:
    # w needs 60, so one of a or b (20 each) must go. Nothing needs b; a is needed by three stages
    # (R(a) = load(a) * 3 * exp(-2/h)), so TOPAS evicts b. LRU would evict a: it was
    # loaded (last used) first.
    inst = make(
        {"a": 20, "b": 20, "c": 20, "d": 30},
        [
            task(
                "t0",
                0,
                stage("r", "c", 5, 5),
                stage("x1", "a", 5, 1, ["r"]),
                stage("x2", "a", 5, 1, ["r"]),
                stage("x3", "a", 5, 1, ["r"]),
            ),
            task("t1", 0, stage("w", "d", 10, 20)),
        ],
        capacity=110,
    )
    state = _state(inst, resident=("a", "b", "c"))
    _run(state, [("t0", "r")])
    assert state.free_kv == 40
    return inst, state


def test_reuse_keeps_the_prefix_three_upcoming_stages_need():
    inst, state = _reuse_case()
    d = _decide(inst, state)
    assert d.evict == ("b",)  # no path needs b
    assert d.admit == (("t1", "w"),)


def test_reuse_switch_falls_back_to_lru():
    inst, state = _reuse_case()
    assert state.evictable()[0] == "a"  # LRU order
    d = _decide(inst, state, "topas-greedy:reuse=0")
    assert d.evict == ("a",)
    assert d.admit == (("t1", "w"),)


def test_reuse_prefetches_an_absent_prefix_with_ready_stages_and_switch_stops_it():
    # One slot, taken by t0's running stage; agent b (absent) has two ready stages and
    # room to load: TOPAS starts loading b now so that they hit when the slot frees.
    inst = make(
        {"a": 10, "b": 10},
        [
            task("t0", 0, stage("r", "a", 5, 9)),
            task("t1", 0, stage("u", "b", 5, 1)),
            task("t2", 0, stage("v", "b", 5, 1)),
        ],
        capacity=200,
        max_running=1,
    )
    state = _state(inst, resident=("a",))
    _run(state, [("t0", "r")])
    assert _decide(inst, state).load == ("b",)
    assert _decide(inst, state, "topas-greedy:reuse=0").load == ()


# --------------------------------------------------------------------------- path


def _path_case():
    # One slot. Task t0 has two ready roots: s (10 in, 1 out: 2 s, then done) and z
    # (2 s, then a chain of two 6 s stages): z is on the longest path (14 s vs 2 s) and
    # must go first; s came first in the queue.
    inst = make(
        {"a": 10},
        [
            task(
                "t0",
                0,
                stage("s", "a", 10, 1),
                stage("z", "a", 10, 1),
                stage("m1", "a", 10, 5, ["z"]),
                stage("m2", "a", 10, 5, ["m1"]),
            )
        ],
        capacity=500,
        max_running=1,
    )
    return inst, _state(inst, resident=("a",))


def test_path_admits_the_stage_on_the_longest_path_first():
    inst, state = _path_case()
    assert list(state.waiting) == [("t0", "s"), ("t0", "z")]
    assert _decide(inst, state).admit == (("t0", "z"),)


def test_path_switch_falls_back_to_arrival_order():
    inst, state = _path_case()
    assert _decide(inst, state, "topas-greedy:path=0").admit == (("t0", "s"),)


def test_path_prefers_the_task_nearer_its_end():
    # Smith's rule for the sum of JCTs: with one slot, the one-stage task (2 s left)
    # goes before the first stage of a 3-stage chain (2 + 6 + 6 s), though it came later.
    inst = make(
        {"a": 10},
        [
            task(
                "long",
                0,
                stage("x", "a", 10, 1),
                stage("y", "a", 10, 5, ["x"]),
                stage("z", "a", 10, 5, ["y"]),
            ),
            task("short", 0, stage("x", "a", 10, 1)),
        ],
        capacity=500,
        max_running=1,
    )
    state = _state(inst, resident=("a",))
    assert _decide(inst, state).admit == (("short", "x"),)


# --------------------------------------------------------------------------- move


def _move_case():
    # One slot, two one-stage tasks of equal length; t0 (first in the queue) needs agent
    # b loaded (5 s), t1's agent a is resident. The load makes t0's path 2 + 5 = 7 s
    # against t1's 2 s, and the movement term charges it the load as well.
    inst = make(
        {"a": 10, "b": 50},
        [task("t0", 0, stage("s", "b", 10, 1)), task("t1", 0, stage("s", "a", 10, 1))],
        capacity=500,
        max_running=1,
    )
    return inst, _state(inst, resident=("a",))


def test_move_prefers_the_stage_whose_prefix_is_resident():
    inst, state = _move_case()
    assert _decide(inst, state).admit == (("t1", "s"),)
    assert _decide(inst, state, "topas-greedy:move=0").admit == (("t1", "s"),)  # path alone


def test_move_switch_changes_when_a_prefetch_pays():
    # Agent b (50 tokens: a 5 s load) is absent; its only stage waits behind a chain of
    # three 61 s stages of agent a, so it is ready in r = 183 s (the running one counts
    # in full). Mean predicted service q = (3 * 61 + 2) / 4 = 46.25 s, horizon
    # h = 4q = 185 s: R(b) = 5 * exp(-183/185) = 1.86 s of reloads saved, under half the
    # load it costs (2.5 s), so TOPAS does not move it yet; without the movement term any
    # positive reuse pays for a load.
    inst = make(
        {"a": 10, "b": 50},
        [
            task(
                "t0",
                0,
                stage("x", "a", 10, 60),
                stage("y", "a", 10, 60, ["x"]),
                stage("z", "a", 10, 60, ["y"]),
                stage("w", "b", 10, 1, ["z"]),
            )
        ],
        capacity=500,
    )
    state = _state(inst, resident=("a",))
    _run(state, [("t0", "x")])
    assert _decide(inst, state).load == ()
    assert _decide(inst, state, "topas-greedy:move=0").load == ("b",)


# --------------------------------------------------------------------------- aging


def _aging_case(now: float):
    # One slot. "old" (released at 0) has a 3 s stage, "young" (released at `now`) a 2 s
    # one: by path alone young goes first (1/2 > 1/3). Aging weights old by
    # 1 + now / age_scale (age_scale 10): at now = 10, 2/3 > 1/2, so old goes first.
    inst = make(
        {"a": 10},
        [task("old", 0, stage("s", "a", 10, 2)), task("young", 0, stage("s", "a", 10, 1))],
        capacity=500,
        max_running=1,
    )
    return inst, _state(inst, resident=("a",), time=now, releases={"young": now})


def test_aging_lets_an_old_task_overtake():
    inst, state = _aging_case(now=0.5)
    assert _decide(inst, state, "topas-greedy:age_scale=10").admit == (("young", "s"),)
    inst, state = _aging_case(now=10.0)
    assert _decide(inst, state, "topas-greedy:age_scale=10").admit == (("old", "s"),)
    assert _decide(inst, state, "topas-greedy:age_scale=10,aging=0").admit == (("young", "s"),)


# --------------------------------------------------------------------------- redo


def _victim_case():
    # Two running stages of 60 predicted output tokens. "near" has decoded 50 (5/6 of its
    # work would be redone) but its task then has 3 more 61 s stages; "fresh" has decoded
    # 1 and its task ends with it. Work lost: near 61*5/6 = 50.8 s, fresh 1 s. Path
    # value w*q*q/L: near's task is long (L about 61+183), fresh's short (L about 61).
    inst = make(
        {"a": 10},
        [
            task(
                "t0",
                0,
                stage("near", "a", 10, 60),
                *(stage(f"n{k}", "a", 10, 60, ["near"]) for k in range(3)),
            ),
            task("t1", 0, stage("fresh", "a", 10, 60)),
        ],
        capacity=5000,
    )
    state = _state(inst, resident=("a",))
    _run(state, [("t0", "near"), ("t1", "fresh")])
    state.running[("t0", "near")].generated = 50
    state.running[("t1", "fresh")].generated = 1
    return inst, state


def _victim(inst, state, spec):  # type: ignore[no-untyped-def]
    policy = make_policy(spec)
    policy.reset(PolicyContext(server=inst.server, timing="step"))
    policy.decide(state)
    return policy.choose_victim(state, list(state.running))


def test_redo_weight_retracts_the_stage_that_loses_least_work():
    inst, state = _victim_case()
    assert _victim(inst, state, "topas-greedy") == ("t1", "fresh")
    # without the work term only the path value counts: the long task's stage goes
    assert _victim(inst, state, "topas-greedy:redo=0") == ("t0", "near")


def test_no_preemption_when_memory_suffices():
    # Ample memory: TOPAS never preempts in a decision and no stage is ever retracted.
    inst = make(
        {"a": 10, "b": 10},
        [task(f"t{i}", i, stage("s", "ab"[i % 2], 10, 5 + i)) for i in range(6)],
        capacity=5000,
        max_running=3,
        cost={
            "kind": "linear",
            "base_s": 0.01,
            "prefill_token_s": 1e-3,
            "decode_seq_s": 1e-3,
            "kv_token_s": 1e-6,
        },
    )
    seen = []

    class Spy(TOPASGreedy):
        def decide(self, state):  # type: ignore[no-untyped-def]
            d = super().decide(state)
            seen.append(d.preempt)
            return d

    sched = simulate(inst, Spy(), timing="calibrated", debug=True)
    assert sched.retractions == 0
    assert not any(seen)


# --------------------------------------------------------------------------- switches


@pytest.mark.parametrize("term", ["path", "reuse", "move", "redo", "aging"])
def test_a_switch_leaves_a_neutral_decision_alone(term):
    # All prefixes resident, one task per agent, equal lengths, no ages, memory to
    # spare: every term is equal or zero across the candidates, so switching one off
    # keeps the decision (FCFS among equals).
    inst = make(
        {"a": 10, "b": 10},
        [task("t0", 0, stage("s", "a", 10, 2)), task("t1", 0, stage("s", "b", 10, 2))],
        capacity=500,
        max_running=1,
    )
    state = _state(inst, resident=("a", "b"))
    assert _decide(inst, state, f"topas-greedy:{term}=0") == _decide(inst, state)


def test_spec_round_trip_and_bad_parameters():
    p = make_policy("topas-greedy:reuse=0,horizon=3.5")
    assert (p.reuse, p.horizon, p.path) == (0.0, 3.5, 1.0)
    with pytest.raises(Exception, match="nope"):
        make_policy("topas-greedy:nope=1")


# --------------------------------------------------------------------------- scoreboard


class CheckedTOPAS(TOPASGreedy):
    """TOPAS that checks its incremental state against a fresh analysis at every call."""

    def decide(self, state):  # type: ignore[no-untyped-def]
        board = self._sync(state)
        assert set(board.stages.of) == set(state.waiting)
        assert set(board.tasks.of) == set(state.tasks)
        now = state.time
        for tid in state.tasks:
            if tid in self._stale:  # waits for the refresh budget (REFRESH_BUDGET)
                continue
            view = self._views[tid]
            state.time = view.at  # running stages count what was left of them then
            fresh = self._analyse(state, tid)
            state.time = now
            assert math.isclose(view.length, fresh.length, rel_tol=1e-12, abs_tol=1e-12)
            assert view.tails == pytest.approx(fresh.tails)
            assert view.slack_ref == pytest.approx(fresh.slack_ref)
            assert set(view.upcoming) == set(fresh.upcoming)
        for ref, slot in board.stages.of.items():
            view = self._views[ref[0]]
            assert board.s_ref[slot] == ref and board.s_valid[slot]
            assert board.s_stamp[slot] == state.wait_stamp[ref]
            if ref[0] not in self._stale:
                assert board.s_inv_len[slot] == pytest.approx(1.0 / max(view.length, 1e-9))
            absent = state.prefixes[state.agent_of(ref)].status == PrefixStatus.ABSENT
            assert (board.s_load[slot] > 0) == absent
        assert int(board.s_valid.sum()) == len(state.waiting)
        return super().decide(state)


@given(inst=random_instances(max_tasks=5, max_stages=5))
def test_scoreboard_matches_a_fresh_analysis_step(inst):
    sched = simulate(inst, CheckedTOPAS(), timing="step", debug=True)
    assert (
        evaluate(sched).objective_steps
        == evaluate(simulate(inst, TOPASGreedy(), timing="step")).objective_steps
    )


@given(inst=random_instances(max_tasks=5, max_stages=5))
def test_scoreboard_matches_a_fresh_analysis_calibrated(inst):
    simulate(inst, CheckedTOPAS(), timing="calibrated", debug=True)


def test_order_is_lazy_but_exact():
    # More waiting stages than the sorted head (128): the order must still be the full
    # sort by (value desc, wait stamp), ties included.
    from topas.policies.scoreboard import Scoreboard

    board = Scoreboard(["a"])
    board.add_task("t", 0.0)
    n = 1000
    for i in range(n):
        board.put_stage(("t", f"s{i}"), "a", 1.0, 0.0, 0.0, float(i))
    values = board.s_inv_len.copy()
    values[:n] = [(i * 7919) % 13 for i in range(n)]  # many ties
    got = list(board.order(values))
    want = sorted(range(n), key=lambda i: (-values[i], i))
    assert got == [("t", f"s{i}") for i in want]
    board.drop_stage(("t", "s5"))
    assert ("t", "s5") not in list(board.order(values))


def test_order_within_agents_is_the_full_order_filtered():
    # the filler's order (fill=greedy): only the named agents' stages, in the order of
    # the full sort, ties included, past the sorted head too; an agent without stages
    # there is no error
    from topas.policies.scoreboard import Scoreboard

    board = Scoreboard(["a", "b", "c"])
    board.add_task("t", 0.0)
    n = 900
    agents = {i: "abc"[(i * 31) % 3] for i in range(n)}
    for i in range(n):
        board.put_stage(("t", f"s{i}"), agents[i], 1.0, 0.0, 0.0, float(i))
    values = board.s_inv_len.copy()
    values[:n] = [(i * 7919) % 13 for i in range(n)]
    full = list(board.order(values))
    for within in ({"a"}, {"a", "c"}, {"b", "z"}, set()):
        got = list(board.order(values, agents=within))
        assert got == [ref for ref in full if agents[int(ref[1][1:])] in within]


def test_runs_repeat_across_processes(tmp_path):
    # string hashing differs between processes (PYTHONHASHSEED): no decision may depend on
    # the iteration order of a set of names, or results would not repeat
    from topas.workloads import generate

    inst = generate("mixed", num_tasks=300, seed=1, load=1.2)
    docs = jcts_across_processes(tmp_path, inst, "topas-greedy", ("1", "2", "3"))
    assert docs[0] == docs[1] == docs[2]


def test_hold_back_is_reported_and_the_reuse_switch_undoes_it():
    # Capacity 150. Resident: a (100 tokens: a 10 s load) and c (20), with t0's stage r
    # (agent c, 5 + 5 tokens) running; r's three children need a. Committed: 100 + 20 +
    # 10 = 130, so 20 are free. t1's only stage w (agent d, 10 tokens, absent) needs
    # 10 + 10 + 15 = 35: only evicting a (c is in use) makes room.
    # Predicted services: r 6 s, x_i 2 s, w 16 s, so q = 28/5 = 5.6 s and h = 4q = 22.4 s.
    # Keeping a is worth R(a) = 10 s * exp(-6/22.4) = 7.6 s (t0's next use of a, once);
    # starting w now gains at most q = 5.6 s. So TOPAS keeps a, holds w back and says so
    # in Decision.held; without the reuse term it evicts a and admits w.
    inst = make(
        {"a": 100, "c": 20, "d": 10},
        [
            task(
                "t0",
                0,
                stage("r", "c", 5, 5),
                *(stage(f"x{i}", "a", 5, 1, ["r"]) for i in range(3)),
            ),
            task("t1", 0, stage("w", "d", 10, 15)),
        ],
        capacity=150,
    )
    state = _state(inst, resident=("a", "c"))
    _run(state, [("t0", "r")])
    assert state.free_kv == 20
    on = _decide(inst, state)
    off = _decide(inst, state, "topas-greedy:reuse=0")
    assert (on.admit, on.evict) == ((), ()) and on.held == (("t1", "w"),)
    assert (off.admit, off.evict, off.held) == ((("t1", "w"),), ("a",), ())
