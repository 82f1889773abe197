"""The policy interface and the shared admission mechanism of the baselines."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from topas.instance import ServerSpec, StageRef
from topas.state import Decision, Planner, State
from topas.timing import Predictor, predictor


@dataclass(frozen=True)
class PolicyContext:
    """What a policy knows before the run: the server and the timing mode. A policy
    estimates durations through :attr:`predict`, never by the mode's name."""

    server: ServerSpec
    timing: str  # "step" or "calibrated"
    seed: int = 0

    @cached_property
    def predict(self) -> Predictor:
        """The timing mode's predictor (:func:`topas.timing.predictor`)."""
        return predictor(self.server, self.timing)


class Policy:
    """A scheduling policy: ``decide(state) -> Decision``.

    ``event_driven``: the decision depends only on the discrete state, so the step
    engine need not consult the policy at steps where nothing happened (DESIGN rule
    12 otherwise consults it at every step where a stage waits or a load could help).
    Policies whose decisions change with time alone set it to False or use
    ``Decision.wake_at``.
    """

    name: str = "policy"
    event_driven: bool = True

    def check(self) -> None:
        """Raise :class:`~topas.errors.InputError` for a parameter out of its range.
        :func:`topas.policies.make_policy` calls it as it builds the policy, so a study
        refuses a bad spec before any run; :meth:`reset` calls it again, for a policy
        built directly."""

    def reset(self, ctx: PolicyContext) -> None:
        """Called once before a run."""
        self.check()
        self.ctx = ctx

    def decide(self, state: State) -> Decision:
        raise NotImplementedError

    def eviction_order(self, state: State) -> list[str]:
        """Unused resident prefixes, first to evict first (default LRU)."""
        return state.evictable()

    def retraction_order(self, state: State, candidates: Sequence[StageRef]) -> list[StageRef]:
        """``candidates`` (running stages), the first to retract first.

        Default is SGLang's ``retract_decode`` order: fewest decoded tokens first, then
        the longest input.
        """
        return sorted(
            candidates,
            key=lambda r: (state.running[r].generated, -state.stage(r).input_tokens, r),
        )

    def choose_victim(self, state: State, candidates: Sequence[StageRef]) -> StageRef:
        """The stage to retract when decode memory runs out."""
        return self.retraction_order(state, candidates)[0]

    def spec(self) -> str:
        """The spec string that rebuilds this policy."""
        return self.name


class Predictions:
    """A policy's predicted stage services and prefix-load times (seconds), computed once
    per stage and per agent from what a policy may see, with the running mean of the stage
    services predicted so far (``mean_service``, over stages in first-seen order)."""

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        self.service_of: dict[StageRef, float] = {}
        self._load: dict[tuple[str, bool | None], float] = {}
        self.mean_service = 0.0
        self._count = 0

    def service(self, state: State, ref: StageRef) -> float:
        s = self.service_of.get(ref)
        if s is None:
            info = state.stage(ref)
            s = self.ctx.predict.service_s(info.input_tokens, info.predicted_output)
            self.service_of[ref] = s
            self._count += 1
            self.mean_service += (s - self.mean_service) / self._count
        return s

    def remaining(self, state: State, ref: StageRef, token_floor: bool = False) -> float:
        """Predicted seconds the running stage ``ref`` has left: its predicted service less
        the time since it started, 0 at the least. With ``token_floor``, at least the
        decode time of the predicted output tokens it has not decoded yet (one at least,
        once it decodes: a stage that has outrun its prediction still has a token to go).
        Not in the step model, where a stage's service is its predicted steps from its
        start (rule 2: the time-based estimate is the model's own; its engine reports no
        decoded tokens either)."""
        run = state.running[ref]
        left = self.service(state, ref)
        if run.started_at is not None:
            left = max(0.0, left - (state.time - run.started_at))
        if token_floor and run.generated and not self.ctx.predict.discrete:
            todo = max(1, state.stage(ref).predicted_output - run.generated)
            left = max(left, self.ctx.predict.service_s(0, todo))
        return left

    def load(self, state: State, agent: str) -> float:
        p = state.prefixes[agent]
        key = (agent, p.host_copy)
        s = self._load.get(key)
        if s is None:
            s = self._load[key] = self.ctx.predict.load_s(p.tokens, p.host_copy)
        return s

    def keep_tasks(self, live: dict[str, object]) -> None:
        """Forget the stages of tasks not in ``live`` (the mean is kept)."""
        self.service_of = {r: s for r, s in self.service_of.items() if r[0] in live}


def admit_in_order(
    state: State,
    order: Iterable[StageRef],
    evict_order: Sequence[str] | None = None,
    stop_at_first_misfit: bool = True,
) -> Planner:
    """Admit stages in ``order`` while they fit, evicting unused prefixes on demand.

    With ``stop_at_first_misfit`` admission stops at the first stage that does not
    fit, as SGLang's ``PrefillAdder`` does; otherwise it skips it and goes on.
    """
    plan = state.plan()
    for ref in order:
        if plan.free_slots < 1:
            break
        if not plan.try_admit(ref, evict_order):
            if stop_at_first_misfit:
                break
    return plan


class WaitingQueue:
    """The waiting stages in the order of a fixed per-stage key, maintained incrementally.

    A key must not change while its stage waits. New arrivals are found from the end
    of ``State.waiting`` by their stamps, and stages that left the queue are dropped
    lazily, so a decision costs O((new + admitted) log n), not a sort of all n.

    A queue follows one state forward in time (the engine's): entries that are stale
    in the state it is given are dropped, so it must not be fed hypothetical states
    (a copy after ``apply``) and then the original.
    """

    def __init__(self, key: Callable[[State, StageRef], Any]) -> None:
        self.key = key
        self.heap: list[tuple[Any, int, StageRef]] = []
        self.last_stamp = 0

    def sync(self, state: State) -> None:
        stamps = state.wait_stamp
        newest = self.last_stamp
        for ref in reversed(state.waiting):
            stamp = stamps[ref]
            if stamp <= self.last_stamp:
                break
            newest = max(newest, stamp)
            heapq.heappush(self.heap, (self.key(state, ref), stamp, ref))
        self.last_stamp = newest
        if len(self.heap) > 2 * len(state.waiting) + 64:  # drop stale entries now and then
            self.heap = [e for e in self.heap if stamps.get(e[2]) == e[1]]
            heapq.heapify(self.heap)

    def admit(
        self, state: State, evict_order: Sequence[str] | None = None, plan: Planner | None = None
    ) -> Planner:
        """Admit in key order until the first stage that does not fit (PrefillAdder)."""
        self.sync(state)
        plan = state.plan() if plan is None else plan
        stamps = state.wait_stamp
        popped = []
        while self.heap and plan.free_slots >= 1:
            entry = heapq.heappop(self.heap)
            if stamps.get(entry[2]) != entry[1]:
                continue  # no longer waiting (or re-queued under a newer stamp)
            popped.append(entry)
            if not plan.try_admit(entry[2], evict_order):
                break
        for entry in popped:  # the decision may not be applied: keep every entry
            heapq.heappush(self.heap, entry)
        return plan
