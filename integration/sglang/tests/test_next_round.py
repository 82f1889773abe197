"""The planner's prediction of the round its plan is applied in (topas_sglang.offload's
next_round): hand-solved cases and its invariants over random observations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from topas.instance import Stage, Task
from topas.observe import Request
from topas_sglang.adapter import Observation
from topas_sglang.offload import next_round


def _task(tid: str, *stages: tuple[str, int, tuple[str, ...]]) -> Task:
    return Task(tid, 0.0, tuple(Stage(s, "a", 10, n, deps) for s, n, deps in stages))


def _obs(*requests: Request) -> Observation:
    obs = Observation(requests=list(requests))
    for r in requests:
        obs.reqs[r.task.id, r.stage] = r
        obs.tasks[r.task.id] = r.task
    return obs


def test_the_request_nearest_its_length_finishes_and_its_next_stages_are_queued():
    # Task x: p (8 tokens) -> {q, r}; r also needs s, which is done; q has a request.
    # Task y: one stage of 20 tokens. p has decoded 5 (3 to go), y's 10 (10 to go): the
    # next finish is p's, 3 decode steps on. Then y has 13; q keeps its request; r, whose
    # dependencies p and s are both done, is queued at `now`.
    x = _task("x", ("s", 4, ()), ("p", 8, ()), ("q", 4, ("p",)), ("r", 4, ("p", "s")))
    y = _task("y", ("only", 20, ()))
    p = Request(x, "p", 1.0, 1.0, running=True, generated=5)
    q = Request(x, "q", 1.0, 2.0)  # sent twice by a client: it is queued already
    w = Request(y, "only", 3.0, 3.0, running=True, generated=10)
    ahead, done, ending = next_round(_obs(p, q, w), {"x": {"s"}}, now=9.0)
    assert ending == [p]
    assert done == {"x": {"s", "p"}}
    by_stage = {(r.task.id, r.stage): r for r in ahead.requests}
    assert set(by_stage) == {("x", "q"), ("x", "r"), ("y", "only")}
    assert by_stage["y", "only"].generated == 13 and by_stage["y", "only"].running
    assert by_stage["x", "q"] is q
    new = by_stage["x", "r"]
    assert not new.running and new.queued_at == 9.0 and new.release == 1.0


def test_a_task_whose_last_stage_finishes_leaves_and_nothing_running_predicts_nothing():
    x = _task("x", ("a", 2, ()), ("b", 3, ("a",)))
    last = Request(x, "b", 0.0, 1.0, running=True, generated=2)
    ahead, done, ending = next_round(_obs(last), {"x": {"a"}}, now=5.0)
    assert ending == [last] and ahead.requests == [] and "x" not in ahead.tasks
    assert done == {"x": {"a", "b"}}
    queued = Request(x, "a", 0.0, 1.0)
    obs = _obs(queued)
    ahead, done, ending = next_round(obs, {}, now=5.0)
    assert (ahead, done, ending) == (obs, {}, [])


@st.composite
def observations(draw):  # type: ignore[no-untyped-def]
    """Random tasks (random DAGs over stages s0..), each stage done, queued, running with
    some tokens decoded, or not yet sent, as a consistent engine would show them."""
    requests, finished = [], {}
    for j in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 5))
        stages = [Stage(f"s{k}", "a", 5, draw(st.integers(1, 6)),
                        tuple(f"s{d}" for d in range(k) if draw(st.booleans())))
                  for k in range(n)]  # fmt: skip
        task = Task(f"t{j}", 0.0, tuple(stages))
        done: set[str] = set()
        for x in stages:  # in topological order: a stage is sent once its deps are done
            if not done.issuperset(x.deps):
                continue
            what = draw(st.sampled_from(["done", "queued", "running", "unsent"]))
            if what == "done":
                done.add(x.id)
            elif what != "unsent":
                made = draw(st.integers(0, x.output_tokens - 1)) if what == "running" else 0
                requests.append(Request(task, x.id, 0.0, 1.0, what == "running", None, made))
        if done:
            finished[task.id] = done
    return _obs(*requests), finished


@settings(max_examples=200, deadline=None)
@given(observations(), st.floats(0, 100))
def test_next_round_invariants(case, now):
    obs, finished = case
    before = {tid: set(s) for tid, s in finished.items()}
    ahead, done, ending = next_round(obs, finished, now)
    assert finished == before  # not changed
    running = [r for r in obs.requests if r.running]
    left = {id(r): r.task.stage_by_id[r.stage].output_tokens - r.generated for r in running}
    if not running:
        assert ending == [] and ahead is obs
        return
    steps = min(left.values())
    assert {id(r) for r in ending} == {id(r) for r in running if left[id(r)] == steps}
    for r in ending:
        assert r.stage in done[r.task.id]
    for tid, stages in finished.items():
        assert stages <= done[tid]
    by_ref = {}
    for r in ahead.requests:
        ref = (r.task.id, r.stage)
        assert ref not in by_ref, "one request per stage"
        by_ref[ref] = r
        assert r.stage not in done.get(r.task.id, ())
        assert r.task.id in ahead.tasks
        old = obs.reqs.get(ref)
        if old is None:  # predicted: queued at `now`, its dependencies all finished
            assert not r.running and r.queued_at == now
            assert done[r.task.id].issuperset(r.task.stage_by_id[r.stage].deps)
        elif old.running:
            assert r.running and r.generated == old.generated + steps
        else:
            assert r is old
    assert len([r for r in ahead.requests if r.running]) == len(running) - len(ending)
    for r in ending:  # every stage that a finish makes ready is queued
        tid, gone = r.task.id, done[r.task.id]
        for x in r.task.stages:
            if x.id not in gone and (tid, x.id) not in obs.reqs and gone.issuperset(x.deps):
                assert (tid, x.id) in by_ref
    for tid in obs.tasks.keys() - ahead.tasks.keys():  # a task that left is all done
        assert len(done[tid]) == len(obs.tasks[tid].stages)
