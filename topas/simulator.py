"""Discrete-event engines: run a policy on an instance and record a Schedule.

Two engines share the recording and the policy protocol:

- :class:`StepEngine` implements the step model of DESIGN.md rule by rule
  (integer steps; rule numbers are cited in the code).
- :class:`CalibratedEngine` runs SGLang-style iterations: chunked prefill batches
  (prefill first when something was admitted), decode batches of one token per
  running stage, KV growing per token, admission reserving predicted output and
  retraction when decode memory runs out. Between events, decode spans advance in
  one closed-form jump.

The policy sees only :class:`~topas.state.State`; the true output lengths stay here.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time as wallclock
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from topas.errors import InputError
from topas.instance import HostLoad, Instance, StageRef
from topas.kv import (
    decode_steps_that_fit,
    overrun_need,
    reservation,
    step_estimate,
    step_need,
    step_peak_kv,
)
from topas.policies.base import Policy, PolicyContext
from topas.schedule import PrefixInterval, Schedule, StageRun
from topas.state import (
    Decision,
    Phase,
    PrefixStatus,
    RunInfo,
    State,
    TaskInfo,
    apply_inplace,
    check_invariants,
    complete_stage,
    prefix_ready,
    task_arrives,
)
from topas.timing import (
    StepTiming,
    decode_iters_within,
    decode_span_s,
    host_transfer_s,
    iteration_s,
    linear_cost,
)


class SimulationError(RuntimeError):
    """The run cannot go on: the policy stalled or broke the model's rules."""


MAX_PREEMPTIONS = 10_000
"""A stage stopped this many times is taken for a livelock (a policy, or the engine's
retraction, starting and stopping the same stages without end): the run fails with
:class:`SimulationError` instead of running for ever. The ablation's ``topas:retract=1``
runs (today's five at load 1.2, seeds 20-24) once reached 635 stops of one stage, and
10,000 with ``token_floor``, before voluntary retraction took a stage once at most; since
then none of their stages is stopped more than once."""


class PastCutoff(Exception):
    """A resumed run stopped early: its tasks' JCTs already sum to more than its
    ``cutoff`` (:meth:`_Engine.resumed`), so it cannot beat the rollout that set it."""


def simulate(
    instance: Instance,
    policy: Policy,
    timing: str = "calibrated",
    seed: int = 0,
    debug: bool = False,
    predicted: dict[StageRef, int] | None = None,
    progress: Callable[[int], None] | None = None,
    prediction_error: float = 0.0,
) -> Schedule:
    """Run ``policy`` on ``instance`` and return the Schedule.

    ``predicted`` overrides the output lengths policies are told (default: each
    stage's ``predicted_output_tokens``, else the truth). ``prediction_error`` > 0
    multiplies each told length by log-normal noise of that sigma, drawn from ``seed``
    (:func:`perturbed_predictions`); the true lengths and every feasibility check stay
    unchanged. ``debug`` re-checks every invariant in full after every event.
    ``progress(n)`` is called as stages finish.
    """
    engine_cls = ENGINES.get(timing)
    if engine_cls is None:
        raise InputError(f"timing must be one of {', '.join(ENGINES)}, got {timing!r}")
    if prediction_error:
        if predicted is not None:
            raise InputError("give predicted or prediction_error, not both")
        predicted = perturbed_predictions(instance, prediction_error, seed)
    policy.reset(PolicyContext(server=instance.server, timing=timing, seed=seed))
    engine = engine_cls(instance, policy, debug=debug, predicted=predicted, progress=progress)
    return engine.run()


PREDICTION_NOISE_STREAM = 0x5052454400  # keeps the noise apart from policies' own seeds


def perturbed_predictions(instance: Instance, sigma: float, seed: int) -> dict[StageRef, int]:
    """The output lengths policies are told, times log-normal(0, ``sigma``) noise.

    Each stage's told length (its ``predicted_output_tokens``, else the truth) is
    multiplied by an independent draw and rounded to an integer >= 1. Draws follow the
    instance's task and stage order, so one (instance, sigma, seed) always gives the same
    predictions and every policy run with that seed is told the same lengths.
    """
    if isinstance(sigma, bool) or not isinstance(sigma, int | float) or not sigma >= 0:
        raise InputError(f"prediction_error: must be a number >= 0, got {sigma!r}")
    if not math.isfinite(sigma):
        raise InputError(f"prediction_error: must be finite, got {sigma!r}")
    import numpy as np

    refs = [(t.id, s.id, s.predicted_output) for t in instance.tasks for s in t.stages]
    rng = np.random.default_rng([PREDICTION_NOISE_STREAM, seed])
    noise = rng.lognormal(0.0, float(sigma), size=len(refs))
    return {(tid, sid): max(1, round(n * f)) for (tid, sid, n), f in zip(refs, noise, strict=True)}


class _Engine:
    """Recording and policy plumbing shared by both engines."""

    timing = "calibrated"

    def __init__(
        self,
        instance: Instance,
        policy: Policy,
        debug: bool,
        predicted: dict[StageRef, int] | None,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.inst = instance
        self.policy = policy
        self.debug = debug
        self.progress = progress
        self.predicted_by_task: dict[str, dict[str, int]] = {}
        for (tid, sid), n in (predicted or {}).items():
            self.predicted_by_task.setdefault(tid, {})[sid] = n
        self.state = State.initial(instance, self.kv_need, self.kv_estimate)
        self.schedule = Schedule(instance=instance, timing=self.timing)
        self.admitted_at: dict[StageRef, tuple[float, bool]] = {}  # admit time, prefix hit
        self.started_at: dict[StageRef, float] = {}
        self.stops: dict[StageRef, int] = {}  # preemptions per stage (MAX_PREEMPTIONS)
        self.load_started: dict[str, float] = {}
        self.resident_from: dict[str, float] = {}
        self.stages_left = instance.num_stages
        self.cutoff = math.inf  # a resumed run's bound on its sum of JCTs (resumed's doc)
        self.jct_done = 0.0  # with a cutoff: the sum of the finished tasks' JCTs
        self.open_release = 0.0  # ... and of the unfinished tasks' release times
        self.path_floor: dict[str, float] = {}  # task -> its unadmitted stages' least path (s)
        self.path_floor_sum = 0.0
        # releases in order of (release time, task order)
        self.pending = deque(sorted(range(len(instance.tasks)), key=self.release_key))

    @classmethod
    def resumed(
        cls,
        instance: Instance,
        policy: Policy,
        state: State,
        loads_done: dict[str, float],
        cutoff: float = math.inf,
    ) -> _Engine:
        """An engine that goes on from ``state``, a policy's view of a run at a scheduling
        point, with ``policy`` (already reset): the forward model of a lookahead
        (:mod:`topas.forward`). ``instance`` holds the state's released, unfinished tasks
        with their *predicted* lengths as the truth; no task arrives later.
        ``loads_done`` says when each prompt now loading will be resident (for one it
        does not name: its whole load from now, after the others on the host channel).
        Continue it with :meth:`run_from`.

        What the state does not tell is taken as the worst case: a stage admitted or
        still in its prefill has all of its prefill ahead, and so has a prompt loading by
        recompute in the calibrated model.

        ``cutoff`` bounds the sum of the tasks' JCTs: once a floor under that sum
        (:meth:`check_cutoff`) passes it, the run raises :class:`PastCutoff` (a rollout
        that cannot beat the best one so far stops there)."""
        engine = cls(instance, policy, debug=False, predicted=None, progress=None)
        engine._restore(state, loads_done)
        engine.cutoff = cutoff
        if cutoff < math.inf:
            engine.open_release = math.fsum(t.release for t in engine.state.tasks.values())
            for tid in engine.state.tasks:
                engine.refloor(tid)
        return engine

    def _restore(self, state: State, loads_done: dict[str, float]) -> None:
        """The part of :meth:`resumed` both engines share: a copy of ``state`` whose KV
        rules are this engine's, with a stamp source of its own (so that the original's
        stamps are left as they were), and the run's records of what holds KV."""
        st = state.copy()
        st.kv_need, st.kv_estimate = self.kv_need, self.kv_estimate
        newest = max(itertools.chain(st.task_epoch.values(), st.wait_stamp.values(), (0,)))
        st.stamps = itertools.count(newest + 1)
        self.state = st
        self.pending = deque()
        self.stages_left = sum(st.unfinished.values())
        for ref, run in st.running.items():
            self.admitted_at[ref] = (run.admitted_at, False)
            if run.started_at is not None:
                self.started_at[ref] = run.started_at
        for agent, p in st.prefixes.items():
            if p.status is not PrefixStatus.ABSENT:
                self.load_started[agent] = st.time
                if p.status is PrefixStatus.RESIDENT:
                    self.resident_from[agent] = st.time

    def loading_order(self, loads_done: dict[str, float]) -> list[str]:
        """The prompts loading in ``self.state``, soonest resident first (those
        ``loads_done`` does not name last)."""
        st = self.state
        loading = [a for a, p in st.prefixes.items() if p.status is PrefixStatus.LOADING]
        return sorted(loading, key=lambda a: (loads_done.get(a, math.inf), a))

    # engine-specific
    def kv_need(self, ref: StageRef, generated: int) -> int:
        raise NotImplementedError

    kv_estimate: Callable[[StageRef, int], int] | None = None  # kv_need from predictions

    def release_key(self, i: int) -> tuple[float, int]:
        return (self.inst.tasks[i].arrival, i)

    # ------------------------------------------------------------------ common steps

    def task_info(self, i: int, release: float) -> TaskInfo:
        task = self.inst.tasks[i]
        return TaskInfo.of(task, release, self.predicted_by_task.get(task.id))

    def consult(self) -> Decision:
        t0 = wallclock.perf_counter()
        decision = self.policy.decide(self.state)
        self.schedule.decision_times_s.append(wallclock.perf_counter() - t0)
        if not isinstance(decision, Decision):
            raise SimulationError(
                f"policy {self.policy.spec()!r} returned {type(decision).__name__}, not Decision"
            )
        return decision

    def apply(self, decision: Decision) -> list[StageRef]:
        """Apply a policy decision to the State and record what it changed."""
        st = self.state
        before_loading = {a for a, p in st.prefixes.items() if p.status == PrefixStatus.LOADING}
        hits = {r: st.is_resident(st.agent_of(r)) for r in decision.admit if r in st.waiting}
        for ref in decision.preempt:
            if ref in st.running:
                self.on_preempt(ref)
        try:
            started = apply_inplace(st, decision)
        except ValueError as e:
            raise SimulationError(
                f"policy {self.policy.spec()!r} at t={st.time:g}: infeasible decision: {e}"
            ) from None
        for agent in decision.evict:
            self.close_prefix(agent, st.time)
        # Loads start before the stages that wait for them (rule 7): first those that
        # admitted stages need, in admission order, then the prefetches, in decision order
        # (demand before prefetch, which matters on the serial host channel).
        new_loads = [
            a
            for a, p in st.prefixes.items()
            if p.status == PrefixStatus.LOADING and a not in before_loading
        ]
        order = [st.agent_of(r) for r in decision.admit] + list(decision.load)
        for agent in sorted(new_loads, key=order.index):
            self.load_started[agent] = st.time
            self.on_load(agent)
        for ref in decision.admit:
            self.admitted_at[ref] = (st.time, hits.get(ref, False))
            self.on_admit(ref)
        if self.cutoff < math.inf:
            for tid in {ref[0] for ref in decision.admit}:
                self.refloor(tid)
        for ref in started:
            self.on_start(ref)
        return started

    def on_preempt(self, ref: StageRef) -> None:
        """Record a preempted run; engine subclasses free their own bookkeeping."""
        stops = self.stops[ref] = self.stops.get(ref, 0) + 1
        if stops >= MAX_PREEMPTIONS:
            raise SimulationError(
                f"policy {self.policy.spec()!r} at t={self.state.time:g}: stage "
                f"{ref[0]}/{ref[1]} stopped {stops} times, a livelock (the same stages "
                "started and stopped without end)"
            )
        admit, hit = self.admitted_at.pop(ref)
        start = self.started_at.pop(ref, self.state.time)
        self.schedule.runs.append(
            StageRun(
                ref[0],
                ref[1],
                self.state.agent_of(ref),
                admit,
                start,
                self.state.time,
                preempted=True,
                prefix_hit=hit,
            )
        )

    def on_admit(self, ref: StageRef) -> None:
        pass

    def on_load(self, agent: str) -> None:
        pass

    def on_start(self, ref: StageRef) -> None:
        self.started_at[ref] = self.state.time

    def finish(self, ref: StageRef, now: float) -> list[StageRef]:
        """A stage completes at ``now``: record it, free it, unblock its children."""
        st = self.state
        admit, hit = self.admitted_at.pop(ref)
        start = self.started_at.pop(ref)
        agent = st.agent_of(ref)
        self.schedule.runs.append(
            StageRun(ref[0], ref[1], agent, admit, start, now, preempted=False, prefix_hit=hit)
        )
        if self.cutoff < math.inf and st.unfinished[ref[0]] == 1:  # the task's last stage
            release = st.tasks[ref[0]].release
            self.jct_done += now - release
            self.open_release -= release
            self.path_floor_sum -= self.path_floor.pop(ref[0], 0.0)
        ready = complete_stage(st, ref, now - start)
        self.stages_left -= 1
        if self.progress is not None:
            self.progress(1)
        return ready

    def prefix_done(self, agent: str) -> list[StageRef]:
        self.resident_from[agent] = self.state.time
        started = prefix_ready(self.state, agent)
        for ref in started:
            self.on_start(ref)
        return started

    def close_prefix(self, agent: str, end: float) -> None:
        start = self.load_started.pop(agent)
        resident = self.resident_from.pop(agent, end)
        self.schedule.prefixes.append(PrefixInterval(agent, start, resident, max(end, resident)))

    def close_all(self, end: float) -> None:
        for agent in list(self.load_started):
            self.close_prefix(agent, end)
        self.schedule.prefixes.sort(key=lambda p: (p.load_start, p.agent))

    def check_cutoff(self, now: float) -> None:
        """Raise :class:`PastCutoff` where the JCTs are sure to sum past ``cutoff``: every
        unfinished task ends no sooner than ``now`` plus its :meth:`refloor` path."""
        open_tasks = len(self.state.tasks)  # a resumed run has no arrivals
        floor = self.jct_done + open_tasks * now - self.open_release + self.path_floor_sum
        if floor > self.cutoff:
            raise PastCutoff

    def refloor(self, tid: str) -> None:
        """Task ``tid``'s least time left after now: its longest dependency path through
        the stages not yet admitted, each weighted by :meth:`stage_floor_s` (an admitted
        stage weighs nothing, so the path only shrinks as the run goes on)."""
        st = self.state
        info = st.tasks[tid]
        done_by: dict[str, float] = {}
        for sid in info.topo_order:
            ref = (tid, sid)
            own = self.stage_floor_s(ref) if st.phase[ref] <= Phase.WAITING else 0.0
            deps = info.stages[sid].deps
            done_by[sid] = own + max((done_by[d] for d in deps), default=0.0)
        path = max(done_by.values(), default=0.0)
        self.path_floor_sum += path - self.path_floor.get(tid, 0.0)
        self.path_floor[tid] = path

    def stage_floor_s(self, ref: StageRef) -> float:
        """The least time a stage takes from its admission (engine-specific)."""
        raise NotImplementedError

    def stalled(self) -> SimulationError:
        st = self.state
        return SimulationError(
            f"policy {self.policy.spec()!r} stalled at t={st.time:g}: {len(st.waiting)} stage(s) "
            f"wait, nothing runs and no event is pending"
        )

    def check_invariants(self) -> None:
        """Full check (debug mode): :func:`topas.state.check_invariants`."""
        check_invariants(self.state)


# =========================================================================== step model


class StepEngine(_Engine):
    """The exact step model (DESIGN rules 1-12; in host mode one transfer at a time)."""

    timing = "step"

    def __init__(self, instance: Instance, policy: Policy, **kw) -> None:  # type: ignore[no-untyped-def]
        self.st_timing = StepTiming.of(instance)
        super().__init__(instance, policy, **kw)
        self.schedule.step_s = self.st_timing.step_s
        self.t = 0
        self.ends: list[tuple[int, int, StageRef]] = []  # (end step, seq, ref)
        self.end_of: dict[StageRef, int] = {}
        self.loads: dict[str, int] = {}  # agent -> step its load completes
        # Host mode: one transfer at a time (a serial host channel, as CalibratedEngine's
        # host_queue/host_busy). The step the channel frees; loads queue FIFO behind it.
        self.host = isinstance(instance.server.prefix_load, HostLoad)
        self.channel_free = 0
        self.seq = 0

    def kv_need(self, ref: StageRef, generated: int) -> int:
        # Rule 3: a stage holds input + output tokens (the truth: feasibility is the engine's).
        s = self.inst.stage(ref)
        return step_need(s.input_tokens, s.output_tokens)

    def kv_estimate(self, ref: StageRef, generated: int) -> int:  # type: ignore[override]
        # rule 3 with the predicted output: what a policy may know (State.estimated_need)
        info = self.state.stage(ref)
        room = self.state.capacity - self.state.prefixes[info.agent].tokens
        return step_estimate(info.input_tokens, info.predicted_output, room)

    def release_key(self, i: int) -> tuple[float, int]:
        return (self.st_timing.release(self.inst.tasks[i].arrival), i)

    def stage_floor_s(self, ref: StageRef) -> float:
        s = self.inst.stage(ref)  # rule 2: d_v steps from its start
        return self.st_timing.stage_steps(s.input_tokens, s.output_tokens) * self.st_timing.step_s

    def on_start(self, ref: StageRef) -> None:
        super().on_start(ref)
        s = self.inst.stage(ref)
        end = self.t + self.st_timing.stage_steps(s.input_tokens, s.output_tokens)  # rule 2
        self.end_of[ref] = end
        self.seq += 1
        heapq.heappush(self.ends, (end, self.seq, ref))

    def on_load(self, agent: str) -> None:
        la = self.st_timing.load_steps[agent]
        if not self.host:
            self.loads[agent] = self.t + la  # rule 3
            return
        # Host mode (rule 5, extended): transfers run one at a time in request order. A
        # queued load is LOADING and holds its KV from the request (as rule 9 holds a stage's
        # KV from admission); its transfer starts when the channel frees. Transfers cannot be
        # cancelled (a loading prefix is never evicted), so its end is known now. The
        # Schedule records load_start = request and resident_from = transfer end, so the
        # transfer is [resident_from - l_a, resident_from).
        start = max(self.t, self.channel_free)
        self.channel_free = start + la
        self.loads[agent] = start + la

    def on_preempt(self, ref: StageRef) -> None:
        super().on_preempt(ref)  # rule 10: frees KV and slot, restarts from scratch later
        self.end_of.pop(ref, None)

    def _restore(self, state: State, loads_done: dict[str, float]) -> None:
        super()._restore(state, loads_done)
        st, timing = self.state, self.st_timing
        self.t = round(st.time / timing.step_s)
        for ref, run in sorted(st.running.items()):
            if run.started_at is None:
                continue  # admitted: it starts when its prompt is resident
            s = self.inst.stage(ref)
            start = round(run.started_at / timing.step_s)
            end = max(start + timing.stage_steps(s.input_tokens, s.output_tokens), self.t + 1)
            self.end_of[ref] = end
            self.seq += 1
            heapq.heappush(self.ends, (end, self.seq, ref))
        for agent in self.loading_order(loads_done):  # one transfer at a time (host)
            done = loads_done.get(agent)
            if done is None:  # its whole load from now (host: after the others)
                start = max(self.t, self.channel_free) if self.host else self.t
                end = start + timing.load_steps[agent]
            else:
                end = max(round(done / timing.step_s), self.t + 1)
            self.loads[agent] = end
            if self.host:
                self.channel_free = max(self.channel_free, end)

    def run(self) -> Schedule:
        # step 0 is always a scheduling point (a load may start before arrivals)
        return self._loop(None, first=True)

    def run_from(self, decision: Decision) -> Schedule:
        """Go on from a resumed state (:meth:`resumed`): ``decision`` is applied now,
        then the policy is consulted as in :meth:`run`."""
        self.apply(decision)
        wake = None
        if decision.wake_at is not None:
            wake = max(self._to_step(decision.wake_at), self.t + 1)
        self.t = self._next_step(wake)
        return self._loop(wake, first=False)

    def _loop(self, wake: int | None, first: bool) -> Schedule:
        st = self.state
        step_s = self.st_timing.step_s
        while True:
            t = self.t
            st.time = t * step_s
            event, first = first, False
            # Rule 7: completions, then releases ...
            while self.ends and self.ends[0][0] <= t:
                end, _, ref = heapq.heappop(self.ends)
                if self.end_of.get(ref) != end:
                    continue  # preempted
                del self.end_of[ref]
                self.finish(ref, st.time)
                event = True
            while self.pending and self.release_key(self.pending[0])[0] <= t:
                i = self.pending.popleft()
                task_arrives(st, self.task_info(i, st.time))
                event = True
            # ... a load started at L makes the prefix resident from L + l_a (rule 3);
            # stages admitted while it loaded start now (rule 9).
            for agent in [a for a, done in self.loads.items() if done <= t]:
                del self.loads[agent]
                self.prefix_done(agent)
                event = True
            if self.stages_left == 0:
                break
            if self.cutoff < math.inf:
                self.check_cutoff(st.time)
            # Rule 12: consult the policy where a stage waits or a load could help.
            woke = wake is not None and wake <= t
            if event or woke or (not self.policy.event_driven and self._may_act()):
                decision = self.consult()
                # ... evictions, loads started, stages started; then the capacity check.
                self.apply(decision)
                wake = None if decision.wake_at is None else self._to_step(decision.wake_at)
                if wake is not None and wake <= t:
                    wake = t + 1
            if self.debug:
                self.check_invariants()
            self.t = self._next_step(wake)
        self.close_all(self.t * step_s)
        self.schedule.peak_kv_tokens = step_peak_kv(self.schedule)
        return self.schedule

    def close_all(self, end: float) -> None:
        # A load still in flight when the last stage ends (e.g. a prefetch nobody used) is
        # recorded with its true transfer, so verify_step sees it on the host channel.
        for agent, done in self.loads.items():
            self.resident_from[agent] = done * self.st_timing.step_s
        super().close_all(end)

    def _to_step(self, seconds: float) -> int:
        return self.st_timing.release(seconds)

    def _may_act(self) -> bool:
        st = self.state
        if st.waiting:
            return True
        if not st.tasks:
            return False
        absent = {a for a, p in st.prefixes.items() if p.status == PrefixStatus.ABSENT}
        return bool(absent) and any(
            st.phase[(tid, sid)] != Phase.DONE and s.agent in absent
            for tid, info in st.tasks.items()
            for sid, s in info.stages.items()
        )

    def _next_step(self, wake: int | None) -> int:
        t = self.t
        if not self.policy.event_driven and self._may_act():
            return t + 1
        cands = []
        if self.ends:
            cands.append(self.ends[0][0])
        if self.pending:
            cands.append(self.release_key(self.pending[0])[0])
        if self.loads:
            cands.append(min(self.loads.values()))
        if wake is not None:
            cands.append(wake)
        cands = [c for c in cands if c > t]
        if not cands:
            raise self.stalled()
        return min(cands)


# =========================================================================== calibrated


@dataclass
class _Live:
    """Engine-side progress of an admitted stage (calibrated model)."""

    base_held: int  # KV tokens held when admitted (input + re-prefilled generated tokens)
    gen0: int  # output tokens generated by then
    join_iter: int = -1  # decode-iteration counter when it joined decoding (-1: not decoding)
    ctx0: int = 0  # attended context (prefix + held) when it joined decoding

    def held(self, decode_iter: int) -> int:
        return self.base_held + (decode_iter - self.join_iter if self.join_iter >= 0 else 0)

    def generated(self, decode_iter: int) -> int:
        return self.gen0 + (decode_iter - self.join_iter if self.join_iter >= 0 else 0)


class CalibratedEngine(_Engine):
    """SGLang-style iterations with the linear iteration-time model."""

    timing = "calibrated"

    def __init__(self, instance: Instance, policy: Policy, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(instance, policy, **kw)
        server = instance.server
        self.cost = linear_cost(server)
        self.chunk = server.chunk_tokens
        self.mixed = server.mixed_chunk
        self.host = server.prefix_load if isinstance(server.prefix_load, HostLoad) else None
        self.now = 0.0
        self.kv_actual = 0
        self.live: dict[StageRef, _Live] = {}
        self.prefill: deque[list] = deque()  # [kind, key, tokens left, context done]
        self.host_queue: deque[str] = deque()
        self.host_busy: tuple[float, str] | None = None  # (done time, agent)
        self.decode_iter = 0
        self.decoding: list[tuple[int, int, StageRef]] = []  # (finish iter, seq, ref)
        self.n_decoding = 0
        self.ctx_sum = 0
        self.seq = 0
        self.dirty = True
        self.wake: float | None = None
        self.overrun_at: list[tuple[int, StageRef]] = []  # (iter it passes its prediction, ref)
        self.overrunning: set[StageRef] = set()  # decoding past the predicted length

    # ------------------------------------------------------------------ accounting

    def kv_need(self, ref: StageRef, generated: int) -> int:
        # SGLang's reservation (topas.kv.reservation), with the policy's predictions
        info = self.state.stage(ref)
        room = self.state.capacity - self.state.prefixes[info.agent].tokens
        return reservation(info.input_tokens, info.predicted_output, generated, room)

    def on_admit(self, ref: StageRef) -> None:
        gen = self.state.generated.get(ref, 0)
        s = self.inst.stage(ref)
        held = s.input_tokens + gen  # after a retraction the generated tokens are re-prefilled
        self.live[ref] = _Live(base_held=held, gen0=gen)
        self.kv_actual += held
        self.prefill.append(["stage", ref, held, 0])

    def on_load(self, agent: str) -> None:
        self.kv_actual += self.state.prefixes[agent].tokens
        if self.host is not None:
            self.host_queue.append(agent)
            self._start_transfer()
        else:
            self.prefill.append(["prefix", agent, self.state.prefixes[agent].tokens, 0])

    def close_prefix(self, agent: str, end: float) -> None:
        super().close_prefix(agent, end)
        self.kv_actual -= self.state.prefixes[agent].tokens

    def on_preempt(self, ref: StageRef) -> None:
        super().on_preempt(ref)
        live = self.live.pop(ref)
        self.kv_actual -= live.held(self.decode_iter)
        if live.join_iter >= 0:
            self.n_decoding -= 1
            self.ctx_sum -= self._ctx(live)
        else:
            self.prefill = deque(seg for seg in self.prefill if seg[1] != ref)
        self.state.generated[ref] = live.generated(self.decode_iter)
        self.overrunning.discard(ref)
        self.dirty = True

    def stage_floor_s(self, ref: StageRef) -> float:
        # each output token still to make takes an iteration of its own (a retracted stage
        # keeps the tokens it made: _restore_stage), and no iteration is shorter than
        # base_s (iteration_s)
        left = self.inst.stage(ref).output_tokens - self.state.generated.get(ref, 0)
        return max(left, 0) * self.cost.base_s

    def _ctx(self, live: _Live) -> int:
        return live.ctx0 + (self.decode_iter - live.join_iter)

    # ------------------------------------------------------------------ main loop

    def _restore(self, state: State, loads_done: dict[str, float]) -> None:
        super()._restore(state, loads_done)
        st = self.state
        self.now = st.time
        self.kv_actual = sum(
            p.tokens for p in st.prefixes.values() if p.status is not PrefixStatus.ABSENT
        )
        for agent in self.loading_order(loads_done):
            if self.host is None:  # its whole prefill ahead, before the stages that wait
                self.prefill.append(["prefix", agent, st.prefixes[agent].tokens, 0])
            elif self.host_busy is None:  # the one transfer under way
                transfer = host_transfer_s(st.prefixes[agent].tokens, self.host)
                done = loads_done.get(agent, st.time + transfer)
                self.host_busy = (max(done, st.time), agent)
            else:  # queued behind it
                self.host_queue.append(agent)
        for ref, run in st.running.items():  # in admission order, as the prefill queue
            self._restore_stage(ref, run)

    def _restore_stage(self, ref: StageRef, run: RunInfo) -> None:
        """The engine's record of an admitted or running stage: decoding if it has made
        a token since its admission, else with its whole prefill ahead."""
        st = self.state
        s = self.inst.stage(ref)
        at_admission = st.generated.get(ref, 0)
        if run.generated <= at_admission or st.phase[ref] is not Phase.RUNNING:
            self.live[ref] = _Live(base_held=s.input_tokens + at_admission, gen0=at_admission)
            self.prefill.append(["stage", ref, self.live[ref].base_held, 0])
            self.kv_actual += self.live[ref].base_held
            return
        held = s.input_tokens + run.generated - 1  # the last token's KV is written next
        live = self.live[ref] = _Live(base_held=held, gen0=run.generated, join_iter=0)
        live.ctx0 = st.prefixes[s.agent].tokens + held + 1
        self.kv_actual += held
        self.n_decoding += 1
        self.ctx_sum += live.ctx0
        self.seq += 1
        heapq.heappush(self.decoding, (s.output_tokens - live.gen0, self.seq, ref))
        pred = st.stage(ref).predicted_output
        if live.gen0 >= pred:
            self.overrunning.add(ref)
        else:
            heapq.heappush(self.overrun_at, (pred - live.gen0, ref))

    def run(self) -> Schedule:
        return self._loop()

    def run_from(self, decision: Decision) -> Schedule:
        """Go on from a resumed state (:meth:`resumed`): ``decision`` is applied now,
        then the policy is consulted as in :meth:`run`."""
        self.wake = decision.wake_at
        self.apply(decision)
        self.dirty = False
        return self._loop()

    def _loop(self) -> Schedule:
        st = self.state
        while self.stages_left > 0:
            if self.cutoff < math.inf:
                self.check_cutoff(self.now)
            self._handle_time_events()
            if self.dirty or (self.wake is not None and self.wake <= self.now):
                self.dirty = False
                self._sync_reservations()
                decision = self.consult()
                self.wake = decision.wake_at
                self.apply(decision)
                if self.debug:
                    self.check_invariants()
                    self._check_kv()
            if self._prefill_runnable():
                self._prefill_iteration()
            elif self.n_decoding:
                self._decode_span()
            else:
                nxt = self._next_time_event()
                if nxt is None:
                    if self.dirty:
                        continue
                    raise self.stalled()
                self.now = max(self.now, nxt)
                st.time = self.now
        self.close_all(self.now)
        return self.schedule

    def _handle_time_events(self) -> None:
        st = self.state
        st.time = self.now
        while self.pending and self.inst.tasks[self.pending[0]].arrival <= self.now + 1e-12:
            i = self.pending.popleft()
            task_arrives(st, self.task_info(i, self.inst.tasks[i].arrival))
            self.dirty = True
        if self.host_busy is not None and self.host_busy[0] <= self.now + 1e-12:
            agent = self.host_busy[1]
            self.host_busy = None
            self.prefix_done(agent)
            self._start_transfer()
            self.dirty = True

    def _next_time_event(self) -> float | None:
        cands = []
        if self.pending:
            cands.append(self.inst.tasks[self.pending[0]].arrival)
        if self.host_busy is not None:
            cands.append(self.host_busy[0])
        if self.wake is not None and self.wake > self.now:
            cands.append(self.wake)
        return min(cands) if cands else None

    def _start_transfer(self) -> None:
        if self.host_busy is None and self.host_queue and self.host is not None:
            agent = self.host_queue.popleft()
            done = self.now + host_transfer_s(self.state.prefixes[agent].tokens, self.host)
            self.host_busy = (done, agent)

    def _sync_reservations(self) -> None:
        """Stages decoding past their predicted length commit what they hold plus the
        KV of their next token (their reservation of predicted output is used up), so
        that memory the accounting shows as free is never needed by a decode step."""
        st = self.state
        while self.overrun_at and self.overrun_at[0][0] <= self.decode_iter:
            _, ref = heapq.heappop(self.overrun_at)
            if ref in self.live and self.live[ref].join_iter >= 0:
                self.overrunning.add(ref)
        for ref in self.overrunning:
            live, run = self.live[ref], st.running[ref]
            need = overrun_need(live.held(self.decode_iter))
            if need > run.reserved:
                st.kv_committed += need - run.reserved
                run.reserved = need
        for ref, live in self.live.items():
            st.running[ref].generated = live.generated(self.decode_iter)

    # ------------------------------------------------------------------ prefill

    def _runnable(self, seg: list) -> bool:
        if seg[0] == "prefix":
            return True
        return self.state.phase[seg[1]] == Phase.RUNNING

    def _prefill_runnable(self) -> bool:
        return any(self._runnable(seg) for seg in self.prefill)

    def _prefill_iteration(self) -> None:
        """One prefill (extend) batch of up to ``chunk_tokens`` tokens, in queue order.

        With ``mixed_chunk`` the running stages also decode one token in it.
        """
        if (
            self.mixed
            and self.n_decoding
            and not decode_steps_that_fit(self.state.capacity, self.kv_actual, self.n_decoding)
        ):
            self._make_room(self.n_decoding)
            return
        budget = self.chunk
        tokens = 0
        kv_read = 0
        finished: list[list] = []
        loaded: set[str] = set()  # prefixes completed earlier in this chunk
        for seg in self.prefill:
            if budget == 0:
                break
            if not (self._runnable(seg) or self.state.agent_of(seg[1]) in loaded):
                continue
            take = min(budget, seg[2])
            kv_read += seg[3] + self._base_context(seg)
            seg[2] -= take
            seg[3] += take
            budget -= take
            tokens += take
            if seg[2] == 0:
                finished.append(seg)
                if seg[0] == "prefix":
                    loaded.add(seg[1])
        decode_n = self.n_decoding if self.mixed else 0
        if decode_n:
            kv_read += self.ctx_sum
        self.now += iteration_s(self.cost, tokens, decode_n, kv_read)
        self.schedule.iterations += 1
        self.state.time = self.now
        if decode_n:
            self._advance_decode(1)
        done = {id(seg) for seg in finished}
        self.prefill = deque(seg for seg in self.prefill if id(seg) not in done)
        for seg in finished:
            if seg[0] == "prefix":
                self.prefix_done(seg[1])
            else:
                self._prefilled(seg[1])
            self.dirty = True
        if decode_n:
            self._pop_finished()

    def _base_context(self, seg: list) -> int:
        if seg[0] == "prefix":
            return 0
        return self.state.prefixes[self.state.agent_of(seg[1])].tokens

    def _prefilled(self, ref: StageRef) -> None:
        """The last prefill chunk of a stage produced its next output token.

        A token's KV is written when it is fed back in the next decode iteration, so
        each decode iteration adds one token of KV per sequence and attends its whole
        context including that token; the last output token never gets KV.
        """
        live = self.live[ref]
        s = self.inst.stage(ref)
        live.gen0 += 1
        if live.gen0 >= s.output_tokens:
            self._complete(ref)
            return
        live.join_iter = self.decode_iter
        live.ctx0 = self.state.prefixes[s.agent].tokens + live.base_held + 1
        self.n_decoding += 1
        self.ctx_sum += live.ctx0
        self.seq += 1
        heapq.heappush(
            self.decoding, (self.decode_iter + s.output_tokens - live.gen0, self.seq, ref)
        )
        pred = self.state.stage(ref).predicted_output
        if live.gen0 >= pred:
            self.overrunning.add(ref)
        else:
            heapq.heappush(self.overrun_at, (self.decode_iter + pred - live.gen0, ref))

    # ------------------------------------------------------------------ decode

    def _decode_span(self) -> None:
        """Advance ``k`` decode iterations in one jump, up to the next event."""
        n = self.n_decoding
        fit = decode_steps_that_fit(self.state.capacity, self.kv_actual, n)
        if not fit:
            self._make_room(n)
            return
        k = self.decoding[0][0] - self.decode_iter if self.decoding else 1
        k = min(k, fit)
        nxt = self._next_time_event()
        if nxt is not None:
            k = min(k, decode_iters_within(self.cost, n, self.ctx_sum, nxt - self.now))
        k = max(1, k)
        self.now += decode_span_s(self.cost, n, self.ctx_sum, k)
        self.state.time = self.now
        self.schedule.iterations += k
        self._advance_decode(k)
        self._pop_finished()

    def _advance_decode(self, k: int) -> None:
        n = self.n_decoding
        self.decode_iter += k
        self.ctx_sum += n * k
        self.kv_actual += n * k
        self.schedule.peak_kv_tokens = max(self.schedule.peak_kv_tokens, self.kv_actual)
        if self.kv_actual > self.state.capacity:
            raise SimulationError(f"KV {self.kv_actual} exceeds capacity at t={self.now:g}")

    def _pop_finished(self) -> None:
        while self.decoding and self.decoding[0][0] <= self.decode_iter:
            _, _, ref = heapq.heappop(self.decoding)
            live = self.live.get(ref)
            if live is None or live.join_iter < 0:
                continue  # retracted; a fresh entry exists if it came back
            if live.generated(self.decode_iter) < self.inst.stage(ref).output_tokens:
                continue  # stale entry from before a retraction
            self.n_decoding -= 1
            self.ctx_sum -= self._ctx(live)
            self._complete(ref)

    def _complete(self, ref: StageRef) -> None:
        live = self.live.pop(ref)
        self.kv_actual -= live.held(self.decode_iter)
        self.overrunning.discard(ref)
        self.finish(ref, self.now)
        self.dirty = True

    def _make_room(self, n: int) -> None:
        """Decode memory ran out: evict unused prefixes, then retract stages (SGLang)."""
        st = self.state
        for agent in self.policy.eviction_order(st):
            if self.kv_actual + n <= st.capacity:
                return
            if st.prefixes[agent].evictable:
                apply_inplace(st, Decision(evict=(agent,)))
                self.close_prefix(agent, self.now)
                self.dirty = True
        while self.kv_actual + self.n_decoding > st.capacity and self.n_decoding:
            cands = [r for r, lv in self.live.items() if lv.join_iter >= 0]
            self._sync_reservations()
            victim = self.policy.choose_victim(st, cands)
            if victim not in cands:
                raise SimulationError(
                    f"policy {self.policy.spec()!r} chose victim {victim}, which is not decoding"
                )
            self.on_preempt(victim)
            apply_inplace(st, Decision(preempt=(victim,)))
            self.schedule.retractions += 1
            self.dirty = True

    def _check_kv(self) -> None:
        held = sum(lv.held(self.decode_iter) for lv in self.live.values()) + sum(
            p.tokens for p in self.state.prefixes.values() if p.status != PrefixStatus.ABSENT
        )
        assert held == self.kv_actual, (held, self.kv_actual)
        assert self.kv_actual <= self.state.capacity


ENGINES: dict[str, type[_Engine]] = {"step": StepEngine, "calibrated": CalibratedEngine}
"""The engine of each timing mode (``topas.timing.TIMING_MODES``)."""
