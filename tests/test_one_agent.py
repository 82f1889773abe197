"""``analysis/one_agent.py``: the one-agent-at-a-time probe of TOPAS's residency choice.

Pinned on a hand-built State (exhaustive against gated service), then run through the
simulator under every invariant (hypothesis, both timing modes) and across processes.
"""

from __future__ import annotations

import pytest
from conftest import make, stage, task
from probes import probe_checks
from test_paper_baselines import ready, release, resident_state, start

from topas.errors import InputError

SPEC = "one_agent:OneAgent"


def world():
    """Two agents, both prompts resident (10 tokens each), room for everything.

    task  arrival  stage  agent
    A     0        a1     a
    B     1        b1     b
    C     2        a2     a
    D     3        a3     a
    """
    return make(
        {"a": 10, "b": 10},
        [
            task("A", 0, stage("a1", "a", 1, 1)),
            task("B", 1, stage("b1", "b", 1, 1)),
            task("C", 2, stage("a2", "a", 1, 1)),
            task("D", 3, stage("a3", "a", 1, 1)),
        ],
        100,
    )


@pytest.mark.parametrize("gated", [False, True])
def test_a_visit_serves_one_agent_then_gated_service_moves_on(gated: bool) -> None:
    inst = world()
    policy = ready(f"{SPEC}:gated={int(gated)}", inst)
    state = resident_state(inst, "a", "b")
    for tid, at in (("A", 0), ("B", 1), ("C", 2)):
        release(state, inst, tid, at)
    # t=2: the oldest waiting stage is A/a1, so agent a is visited: its stages in FCFS
    # order, b's held (it waits although it fits)
    d = policy.decide(state)
    assert d.admit == (("A", "a1"), ("C", "a2")) and d.held == (("B", "b1"),)
    start(state, *d.admit)
    # t=3: D/a3 becomes ready during a's visit. Exhaustive service serves it too (the
    # visit lasts while a has waiting stages); gated service does not (it came after the
    # visit began), so the visit is over and b, whose stage has waited since t=1, is next
    release(state, inst, "D", 3)
    d = policy.decide(state)
    if gated:
        assert d.admit == (("B", "b1"),) and d.held == (("D", "a3"),)
    else:
        assert d.admit == (("D", "a3"),) and d.held == (("B", "b1"),)


def test_a_resident_prompt_goes_first_on_a_tie() -> None:
    """A/a1 and B/b1 ready at the same time: b's prompt is resident, a's is not."""
    inst = make(
        {"a": 10, "b": 10},
        [task("A", 0, stage("a1", "a", 1, 1)), task("B", 0, stage("b1", "b", 1, 1))],
        100,
    )
    state = resident_state(inst, "b")
    release(state, inst, "A", 0)
    release(state, inst, "B", 0)
    d = ready(SPEC, inst).decide(state)
    assert d.admit == (("B", "b1"),) and d.held == (("A", "a1"),)


def test_other_prompts_are_evicted_to_make_room() -> None:
    """Room for one prompt beside a stage: visiting b evicts a's unused prompt."""
    inst = make({"a": 10, "b": 10}, [task("B", 0, stage("b1", "b", 2, 2))], 16)
    state = resident_state(inst, "a")
    release(state, inst, "B", 0)
    d = ready(SPEC, inst).decide(state)
    assert d.evict == ("a",) and d.admit == (("B", "b1"),)  # b's prompt comes with it


test_step_invariants, test_calibrated_invariants, test_decisions_do_not_depend_on_the_process = (
    probe_checks([f"{SPEC}:gated=0", f"{SPEC}:gated=1"], SPEC, SPEC)
)


def test_next_most_visits_the_longest_queue_and_oldest_the_longest_wait() -> None:
    """Nothing resident, room for everything; when the first visit (to a) is over:

    task  arrival  stage  agent
    A     0        a1     a      (the first visit: the oldest, and a's queue is as long)
    B     1        b1     b      b: one stage, waiting since t=1
    C     2        c1     c      c: two stages, the older since t=2
    D     3        c2     c
    `oldest` visits b next (waiting since 1), `most` visits c (two stages against one).
    """
    inst = make(
        {"a": 10, "b": 10, "c": 10},
        [
            task("A", 0, stage("a1", "a", 1, 1)),
            task("B", 1, stage("b1", "b", 1, 1)),
            task("C", 2, stage("c1", "c", 1, 1)),
            task("D", 3, stage("c2", "c", 1, 1)),
        ],
        100,
    )
    for rule, first in (("oldest", ("B", "b1")), ("most", ("C", "c1"))):
        policy = ready(f"{SPEC}:next={rule}", inst)
        state = resident_state(inst)
        release(state, inst, "A", 0)
        d = policy.decide(state)
        assert d.admit == (("A", "a1"),)
        start(state, *d.admit)
        for tid, at in (("B", 1), ("C", 2), ("D", 3)):
            release(state, inst, tid, at)
        d = policy.decide(state)  # a's visit is over: nothing of a waits
        assert d.admit[0] == first, rule


def test_an_unknown_next_rule_is_refused() -> None:
    with pytest.raises(InputError, match="next: unknown rule 'newest'"):
        ready(f"{SPEC}:next=newest", world())
