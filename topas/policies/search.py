"""TOPAS as the paper defines it: a search over post-decision states ``(R', Q')``.

Registered as ``topas``; ``topas-base`` is the paper's TOPAS-base (no reuse, no aging) and
``topas-greedy`` the earlier single-pass scorer of :mod:`topas.policies.greedy`. docs/topas.md
has the derivation, the choices where the paper is silent, the defaults and the
measurements.

At a scheduling point the decision is the resident prefix set ``R'`` and the running set
``Q'``. Stages of agents outside ``R'`` are not admitted (they are ``Decision.held``); a
prefix outside ``R'`` is evicted as soon as no running stage uses it, so the policy may
drain a prompt on purpose to let the batch grow. Each candidate ``R'`` is packed greedily
(GREEDYPACK: waiting stages of agents in ``R'`` best first while memory, batch slots and
the per-decision change budget ``K`` last) and scored, in seconds::

    Score(R', Q') = J_admit - J_move + V_reuse - J_redo - J_revoke
    J_admit  = sum over packed r of g_i(t) * Delta(r) * (1 + visit if r's agent runs now)
    J_move   = c(a) per waiting task that must wait for a moved prefix a (in or out)
    V_reuse  = beta * sum over a in R' of n_a * c(a)
    g_i(t)   = 1 + rho * (t - tau_i) / H_age       (the paper: 1 + rho log(1 + ...))

The aging is linear in the wait by default (``age_form=linear``, ``rho = 1``), and the
pack order adds ``g - 1`` to Smith's ratio ``Delta / L_i`` instead of multiplying it
(``additive=1``): a task that has waited ``H_age`` ranks with one whose last stage, of
mean length, is left. The paper's form is ``age_form=log,additive=0,aging=3``, the
default until 2026-12-01; on the tuning seeds the new one cut p99 JCT against the best
baseline by about 5 to 6 points on average for at most 1 point of mean (docs/topas.md,
"Parameters and defaults"). ``age_form=excess`` ages a task only by its wait beyond the
mean age of the tasks in view, ``1 + rho * max(0, age - mean age) / H_age``: the younger
tasks are packed by Smith's ratio alone (an option, not the default; measured there).

The ``visit`` weight (an addition to the paper's score) favours a stage whose agent has
stages running now: admitting it continues that agent's visit, in a prompt that stays
resident anyway, while a stage of an idle agent starts a visit, and switching the served
agent keeps two prompts resident until the old one's stages drain. A myopic score does
not see that switch cost; without the weight the search serves several agents at once
and the batch stays smaller (docs/topas.md has the measurements).

``c(a)`` is the time to bring prefix ``a`` back: ``mu * l_a / B_swap`` with host swaps,
its prefill with recompute (``PolicyContext.predict.load_s``); a prefetch (no task waits for
it) costs nothing but where a load is a prefill that shares the GPU (the calibrated
model with recompute). There such a prefill also holds up the batch, which does not
decode while it runs: with ``stall=1`` (the default) ``J_move`` charges each load, and
each drain of a prompt that waiting or next-hop stages will need again, ``c(a)`` once per
running stage besides. ``Delta(r)`` is the stage's share of the cut in its task's
expected longest remaining path ``L_i`` when the task's waiting stages start now rather
than a deferral ``D`` (the mean predicted stage service) later: one of several parallel
siblings alone cuts nothing, all of them together do, so each gets an equal share.
``L_i`` is the mean over :data:`SCENARIOS` scenarios of the longest path with each
stage's service scaled by a ratio drawn from the learned distribution of
:class:`ServiceModel` at a stratified level of its own (:func:`scenario_levels`:
independent across stages, fixed per stage, so deterministic). ``n_a`` counts the
next-hop stages of agent ``a`` in the post-decision state: not yet ready, every
unfinished predecessor running or admitted by the pack.

The budget of a pack is the post-decision one: a dropped prefix whose stages still run
returns its memory, and theirs, when they finish; stages that fit only in that drained
memory count at ``max(0, 1 - T / D)`` (``T``: when the drain ends) and are admitted by a
later decision. Without this a myopic score never drains a busy prompt: keeping it admits
at least as much now. With ``drain_load=1`` (the default since 2026-12-07;
docs/topas.md, "Loading into drained memory") a prompt of ``R'`` that does not fit now
may wait for that drained memory too: the set is a candidate where its loads fit once
the drains end, nothing of it starts now (the memory free now is kept for the load: the
decision admits nothing and holds every waiting stage but the loaded agents'), and its
stages that fit in what the drains leave beside the load count at ``max(0, 1 - T / D)``,
each task of the loaded agent charged ``c(a)`` for the load it then waits for.
Without it a prompt larger than the free memory comes in only once stages of the
resident agents stop being admitted, which the pack never chooses. It does nothing with
``retract=1`` (the two together thrashed). With ``retract=1`` a dropped prefix's running
stages may instead be retracted at once, for ``J_redo`` (the service they have had) and
``J_revoke`` (their admission credit), each stage once at most (else a stage could be
retracted and re-admitted without end); off by default (docs/topas.md has the
measurements). When decode memory runs out, the victim is the running stage of least
``J_redo + J_revoke``. A drain ends ``T`` seconds from now, when its running stages'
predicted remaining time has passed; with ``token_floor`` (the default) a stage that has
begun to decode has at least the decode time of its undecoded predicted tokens left, so
one that has outrun its prediction does not end "now".

With at most ``enumerate_max`` (M) active agents every subset is scored; otherwise a
lazy greedy search from the current residency takes single moves (add or drop one agent)
while one improves the score, then pairs and swaps, within ``|A|^2`` candidates.

Starvation: a task that has waited ``reserve`` times the mean age of the released tasks
(and at least ``H_age``) and whose stage the search left out is admitted first (its
prompt kept, unused ones evicted if that makes it fit) and the search backfills around
it; if it does not fit even so, nothing else is admitted until it does (aging alone
does not bound the wait of a stage that needs memory the others keep taking). This is an
addition to the paper's description.

With ``soon=1`` (off by default: it helps the step model's gap and costs the calibrated
workloads, docs/topas.md) a pack also credits, at ``max(0, 1 - T / D)``, a stage that fits
only once running stages (each at its predicted end ``T``) and draining prompts return
their KV within ``D``. With ``jit=1`` (off by default: a little better on the step
model's gap, within a point on the calibrated workloads; docs/topas.md) an absent prompt
gets no load credit while its next-hop stages are due later than its load takes, and the
decision asks to be consulted (``wake_at``) when the load is due.

Every term is a weight; 0 switches it off. ``search=all`` keeps every active agent that
fits (no choice of residency); ``search=greedy`` / ``search=enumerate`` force a search.
``fill=greedy`` keeps the search's choice of ``R'`` but admits within it by the single
pass of :mod:`topas.policies.greedy` (its order, holding back and evictions, restricted to
the agents of ``R'``; no reservation of its own, no prefetch) instead of the winning pack;
the packs still score the candidate sets. ``fill=auto`` (the default) is ``greedy`` where
a load is a prefill that shares the GPU (the calibrated model with recompute) and
``search`` elsewhere (host swap, the step model): on the same workloads and arrivals the
pass costs only where prompts move over a host link (docs/topas.md, "Filling by the
timing mode").
The waiting queue is kept across decisions by :class:`~topas.policies.search_view.QueueView`, so
a decision re-analyses only the tasks that changed.

Deterministic: a decision depends only on the states the policy has been given (the
service model learns from their finished stages), never on the wall clock or on the
iteration order of a set, so every tensor-parallel rank of a server decides alike.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import heapq
import itertools
import math
import operator
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from topas.errors import InputError
from topas.instance import StageRef, longest_tails
from topas.policies.base import Policy, PolicyContext, Predictions
from topas.policies.greedy import TOPASGreedy
from topas.policies.search_view import QueueView, Ranking
from topas.state import Decision, Phase, Planner, PrefixStatus, State

SEARCH_MODES = ("auto", "enumerate", "greedy", "all")
FILLS = ("search", "greedy", "auto")  # who admits within the chosen R' (``fill``)
AGE_FORMS = ("log", "linear", "excess")
"""``g_i(t)``: the paper's ``1 + rho log(1 + age / H_age)``, ``1 + rho age / H_age``, or
``1 + rho max(0, age - the mean age of the tasks in view) / H_age``."""

SCENARIOS = 8
"""Scenarios of the stage services behind ``E[LP]`` (analysis/lp_error.py measures the
error against Monte Carlo)."""


@functools.lru_cache(maxsize=1 << 16)
def scenario_levels(tid: str, sid: str) -> tuple[float, ...]:
    """The quantile levels of one stage's service ratio, one per scenario: a Latin
    hypercube. Each stage takes every stratum ``[j/S, (j+1)/S)`` once, in an order and at an
    offset drawn from a generator seeded by a hash of its name (blake2b, the same in every
    process), so stages are independent of each other (a common order would make them
    comonotone) and a decision never depends on the process."""
    digest = hashlib.blake2b(f"{tid}\x00{sid}".encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "big"))
    order = list(range(SCENARIOS))
    rng.shuffle(order)
    h = rng.random()
    return tuple((j + h) / SCENARIOS for j in order)


MODEL_REFRESH = 32
"""New observations between two refreshes of the scenario ratios (cached analyses are
keyed by the refresh count, so refreshing at every completion would redo them all)."""

REFRESH_BUDGET = 8
"""Tasks re-analysed per decision because the service model changed (those whose own
stages changed always are): a refresh would otherwise re-analyse every task at once."""

MAX_SAMPLES = 256
"""Observations kept per (agent, role): the most recent ones."""

AGE_FRACTION = 0.5
"""Default ``H_age`` as a share of the mean predicted critical path of a task (chosen on
tuning seeds against 1 and 0.25: docs/topas.md)."""

CHUNK = 16
"""The active pool includes the agents that one of the first this many stages of some
agent's pack order would open (make next hops)."""

FIRST_READ = 2
"""Stages of one agent's pack order turned into Python objects at its first read; each
later read doubles what the queue holds (a pack rarely reads far into any one queue)."""

JIT_SLACK = 1e-6  # jit: a load due within this many mean services is due now
MAX_MISFITS = 16
"""Waiting stages a pack skips because they do not fit, before it stops."""

PAIR_POOL = 4
"""The greedy search's pairs and swaps bring in only the outside agents of the best this
many single additions (the issue's bound is O(|A|^2) candidates; this keeps O(|A|))."""

_ROLE = re.compile(r"[_\-]?\d+$")


@functools.lru_cache(maxsize=1 << 12)
def role_of(stage_id: str) -> str:
    """A stage's role: its id without a trailing index (``code_3`` -> ``code``)."""
    return _ROLE.sub("", stage_id) or stage_id


# --------------------------------------------------------------------------- service model


class ServiceModel:
    """Empirical distribution of actual / predicted service per (agent, role).

    Learned online from the finished stages a policy sees (``State.done_service``); the
    prediction is the prior (one pseudo-observation of ratio 1), so before any data every
    scenario is the prediction. :meth:`ratio` gives a key's ratio at one quantile level,
    :meth:`stage_ratios` a stage's at each of its scenario levels.
    """

    def __init__(self) -> None:
        self._samples: dict[tuple[str, str], list[float]] = {}
        self._recent: dict[tuple[str, str], list[float]] = {}
        self._seen: set[StageRef] = set()
        self._learned: State | None = None  # the state of the last call
        self._pending = 0
        self.version = 0
        self._snapshot: dict[tuple[str, str], tuple[float, ...]] = {}
        self._changed: set[tuple[str, str]] = set()  # keys observed since the last refresh
        self._stage_ratios: dict[str, dict[str, tuple[object, list[float]]]] = {}  # memo

    def observe(self, key: tuple[str, str], ratio: float) -> None:
        self._changed.add(key)
        recent = self._recent.setdefault(key, [])
        recent.append(ratio)
        samples = self._samples.setdefault(key, [1.0])
        bisect.insort(samples, ratio)
        if len(recent) > MAX_SAMPLES:
            samples.remove(recent.pop(0))
        self._pending += 1

    def learn(self, state: State, predicted: dict[StageRef, float]) -> None:
        """Observe the stages finished since the last call (in a fixed order). In the
        state of the last call (the engine's, changed in place: finished stages are
        appended to ``done_service``, and only leave it with their task) the new ones are
        read from its end; any other state is compared in full."""
        done = state.done_service
        if len(self._seen) > 4 * len(done) + 1024:
            self._seen &= done.keys()
        if state is self._learned:
            fresh = itertools.takewhile(lambda ref: ref not in self._seen, reversed(done))
        else:
            fresh = (ref for ref in done if ref not in self._seen)
        self._learned = state
        new = sorted(fresh)
        for ref in new:
            self._seen.add(ref)
            pred = predicted.get(ref)
            if pred is None or pred <= 0:
                continue
            info = state.tasks[ref[0]].stages[ref[1]]
            self.observe((info.agent, role_of(ref[1])), done[ref] / pred)
        if self._pending >= MODEL_REFRESH:
            self._refresh()

    def _refresh(self) -> None:
        """New snapshots for the keys observed since the last refresh (the others keep
        theirs, so :meth:`stage_ratios` still knows them)."""
        self._pending = 0
        self.version += 1
        for key in sorted(self._changed):
            self._snapshot[key] = tuple(self._samples[key])
        self._changed.clear()

    def stage_ratios(self, ref: StageRef, key: tuple[str, str]) -> list[float]:
        """The ratio of ``key`` at each of stage ``ref``'s scenario levels
        (:func:`scenario_levels`), memoised per stage until ``key``'s snapshot changes."""
        snap = self._snapshot.get(key)
        memo = self._stage_ratios.setdefault(ref[0], {})
        hit = memo.get(ref[1])
        if hit is not None and hit[0] is snap:
            return hit[1]
        levels = scenario_levels(*ref)
        out = [1.0] * len(levels) if snap is None else _quantiles(snap, levels)
        memo[ref[1]] = (snap, out)
        return out

    def forget(self, task_id: str) -> None:
        """Drop the memo of a finished task."""
        self._stage_ratios.pop(task_id, None)

    def ratio(self, key: tuple[str, str], level: float) -> float:
        """The learned ratio of ``key`` at quantile ``level`` (1, the prediction, before
        any refresh saw data for it)."""
        samples = self._snapshot.get(key)
        return 1.0 if samples is None else _quantile(samples, level)


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of an ascending list."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _quantiles(sorted_values: Sequence[float], levels: Iterable[float]) -> list[float]:
    """:func:`_quantile` at each of ``levels`` (in [0, 1]), the same floats, in one loop."""
    last = len(sorted_values) - 1
    if last == 0:
        return [sorted_values[0] for _ in levels]
    out = []
    for q in levels:
        pos = q * last
        lo = int(pos)  # floor: pos >= 0
        a = sorted_values[lo]
        out.append(a + (sorted_values[lo + 1 if lo < last else last] - a) * (pos - lo))
    return out


# --------------------------------------------------------------------------- task analysis


@dataclass
class _Analysis:
    """Per scenario, the longest remaining path of a task's running frontier and, per
    waiting stage, its own service plus the longest path after it."""

    running: list[float]  # per scenario: longest path through the running frontier
    tails: dict[StageRef, list[float]]  # waiting stage -> per scenario tail
    length: float  # E[LP] with every waiting stage started now
    share: float = 0.0  # Delta of each waiting stage (TOPAS._share at analysis time)
    next_hop: dict[str, int] = field(default_factory=dict)  # agent -> its next-hop stages
    opens: dict[str, tuple[str, ...]] = field(default_factory=dict)  # waiting sid -> agents


def _analyse(state: State, tid: str, svc: dict[StageRef, float], model: ServiceModel) -> _Analysis:
    info = state.tasks[tid]
    phase = state.phase
    order = info.topo_order
    k = SCENARIOS
    own: dict[str, list[float]] = {}
    for sid in order:
        ref = (tid, sid)
        ph = phase[ref]
        if ph is Phase.DONE:
            continue
        st = info.stages[sid]
        key = (st.agent, role_of(sid))
        base = svc[ref]
        o = [base * r for r in model.stage_ratios(ref, key)]
        if ph is Phase.RUNNING:
            run = state.running[ref]
            if run.started_at is not None:
                gone = state.time - run.started_at
                o = [max(x - gone, 0.1 * x) for x in o]
        own[sid] = o
    tail: dict[str, list[float]] = {}
    for sid in reversed(order):
        o = own.get(sid)
        if o is None:
            continue
        children = info.stages[sid].children  # those of an unfinished stage are unfinished
        if not children:
            tail[sid] = o  # o + 0.0: the same floats
            continue
        below = tail[children[0]]  # tails are >= 0: max(0.0, t) is t
        for c in children[1:]:
            below = list(map(max, below, tail[c]))
        tail[sid] = list(map(operator.add, o, below))
    running = [0.0] * k
    tails: dict[StageRef, list[float]] = {}
    for sid, t in tail.items():
        ph = phase[(tid, sid)]
        if ph is Phase.WAITING:
            tails[(tid, sid)] = t
        elif ph is Phase.RUNNING or ph is Phase.ADMITTED:
            running = list(map(max, running, t))
    best = running
    for t in tails.values():
        best = list(map(max, best, t))
    return _Analysis(running, tails, sum(best) / k)


_UNDER_WAY = (Phase.DONE, Phase.RUNNING, Phase.ADMITTED)


def _task_next_hops(state: State, tid: str) -> tuple[dict[str, int], dict[str, tuple[str, ...]]]:
    """Per agent, the task's stages not yet ready whose unfinished predecessors all run;
    and per waiting stage, the agents of the stages that admitting it would make next-hop
    ones (their only predecessor not under way), for ``n_a`` in the post-decision state."""
    hops: dict[str, int] = {}
    opens: dict[str, list[str]] = {}
    phase = state.phase
    info = state.tasks[tid]
    for sid in info.topo_order:
        if phase[(tid, sid)] is not Phase.BLOCKED:
            continue
        st = info.stages[sid]
        missing = [d for d in st.deps if phase[(tid, d)] not in _UNDER_WAY]
        if not missing:
            hops[st.agent] = hops.get(st.agent, 0) + 1
        elif len(missing) == 1 and phase[(tid, missing[0])] is Phase.WAITING:
            opens.setdefault(missing[0], []).append(st.agent)
    return hops, {sid: tuple(agents) for sid, agents in opens.items()}


def longest_path(analysis: _Analysis, started: Iterable[StageRef], deferral: float) -> float:
    """``L_i(H)``: the expected longest remaining path when the waiting stages in
    ``started`` start now and the others ``deferral`` seconds later."""
    now = set(started)
    best = list(analysis.running)
    for ref, t in analysis.tails.items():
        add = 0.0 if ref in now else deferral
        best = [max(a, b + add) for a, b in zip(best, t, strict=True)]
    return sum(best) / len(best)


# --------------------------------------------------------------------------- the policy


@dataclass(slots=True)
class _Pack:
    """One candidate post-decision state: what GREEDYPACK admitted and its score."""

    agents: frozenset[str]  # R' (sorted where order matters: the loads of _commit)
    admitted: list[StageRef]
    credit: dict[StageRef, float]
    score: float
    changes: int  # prefixes that change residency: |R' xor R_t|
    retract: tuple[StageRef, ...] = ()  # running stages of dropped prefixes, stopped now
    waits: tuple[str, ...] = ()  # drain_load: absent agents of R' whose loads wait for the
    # drained memory (then nothing starts now)

    def beats(self, other: _Pack | None) -> bool:
        """A higher score; among equal scores (1e-9 s), fewer residency changes."""
        if other is None:
            return True
        if self.score > other.score + 1e-9:
            return True
        return self.score >= other.score - 1e-9 and self.changes < other.changes


class _Returns:
    """The KV that running stages and draining prompts return within the deferral
    (``soon=1``), read soonest first only as far as a pack asks."""

    def __init__(self, returns: Iterable[tuple[float, int]]) -> None:
        self._left = iter(returns)  # (seconds from now, KV tokens), soonest first
        self._times: list[float] = []
        self._total: list[int] = []  # KV returned by the end of each of _times
        self._used = 0  # promised to stages credited before

    def when(self, need: int, free: int) -> float | None:
        """Seconds until ``need`` tokens fit beside what earlier stages were promised
        (the free memory counted for each: an approximation), or None if not within the
        deferral; the need is promised when it fits."""
        target = need + self._used - free
        while not self._total or self._total[-1] < target:
            nxt = next(self._left, None)
            if nxt is None:
                return None
            self._times.append(nxt[0])
            self._total.append((self._total[-1] if self._total else 0) + nxt[1])
        self._used += need
        return self._times[bisect.bisect_left(self._total, target)]


@dataclass
class _Round:
    """What one decision computes once and every candidate reads."""

    free: int
    slots: int
    status: dict[str, PrefixStatus]
    users: dict[str, int]
    tokens: dict[str, int]
    queues: dict[str, list[tuple]]  # agent -> waiting stages, best first
    need: dict[StageRef, int]
    waiting_tasks: dict[str, int]  # agent -> tasks with a waiting stage of it
    next_hop: dict[str, int]  # agent -> n_a(t)
    cost: dict[str, float]  # agent -> c(a), seconds to bring its prefix back
    current: frozenset[str] = frozenset()  # R_t: prefixes resident or loading
    current_reuse: float = 0.0  # sum over R_t of n_a * c(a)
    running_kv: dict[str, int] = field(default_factory=dict)  # agent -> KV of its running
    drain_s: dict[str, float] = field(default_factory=dict)  # agent -> its last to finish
    returns: list[tuple[float, int]] = field(default_factory=list)  # running stages due
    # within the deferral (soon=1): (seconds left, KV they return), soonest first
    running_refs: dict[str, list[StageRef]] = field(default_factory=dict)  # agent -> running
    revoke_loss: dict[str, float] = field(default_factory=dict)  # agent -> J_redo + J_revoke
    # (with retract=1 only)
    pinned: str | None = None  # the agent of a starving stage admitted first: always in R'
    opened: set[str] = field(default_factory=set)  # agents a waiting stage would make next hops
    rank: dict[StageRef, int] = field(default_factory=dict)  # pack order: lower goes first
    value: dict[StageRef, float] = field(default_factory=dict)  # g_i(t) * Delta per stage
    ranking: Ranking | None = None  # every waiting stage's pack order, read on demand
    heads: list[tuple[int, str]] = field(default_factory=list)  # (rank, agent) of each
    # agent's best waiting stage, best first
    head_rank: dict[str, int] = field(default_factory=dict)  # the same, by agent
    current_heads: list[tuple[int, str]] = field(default_factory=list)  # those of R_t's
    credit: np.ndarray = field(default_factory=lambda: np.zeros(0))  # task slot -> g_i(t) *
    # Delta (read for the few stages a pack reaches, so not turned into a list)
    skip: set[StageRef] = field(default_factory=set)  # kept out of the queues (reserved)
    read_out: set[str] = field(default_factory=set)  # agents whose every stage is queued
    analyses: dict[str, _Analysis] = field(default_factory=dict)
    left: dict[StageRef, float] = field(default_factory=dict)  # running -> seconds left
    wakes: list[float] = field(default_factory=list)  # jit: when deferred loads are due

    def set_heads(self, heads: list[tuple[int, str]]) -> None:
        """Each agent's best waiting stage's rank, best first (and by agent)."""
        self.heads = heads
        self.head_rank = {a: r for r, a in heads}
        self._split_heads()

    def loads_fit(self, free: int) -> bool:
        """Whether a candidate R' whose prompt moves leave ``free`` KV tokens fits. The
        engine's own accounting may already run over (stages decoding past their
        predictions), so no worse than now also fits."""
        return free >= min(0, self.free)

    def set_current(self) -> None:
        """R_t (prefixes resident or loading) and its reuse, from ``status``."""
        self.current = frozenset(
            a for a, st in self.status.items() if st is not PrefixStatus.ABSENT
        )
        self.current_reuse = sum(
            self.next_hop.get(a, 0) * self.cost[a] for a in sorted(self.current)
        )
        self._split_heads()

    def _split_heads(self) -> None:
        """The heads of R_t's agents (best first): a pack reads these and those of the
        agents it adds, not every agent's."""
        self.current_heads = [h for h in self.heads if h[1] in self.current]


@dataclass
class TOPAS(Policy):
    """TOPAS: search the resident prefix set and the running set together (module doc)."""

    progress: float = 1.0  # J_admit weight
    move: float = 1.0  # J_move weight
    reuse: float = 1.0  # beta: V_reuse weight
    redo: float = 1.0  # J_redo weight
    revoke: float = 1.0  # J_revoke weight
    aging: float = 1.0  # rho
    age_scale: float = 0.0  # H_age, seconds; 0 = AGE_FRACTION x the mean task critical path
    enumerate_max: int = 6  # M: enumerate every subset of at most this many active agents
    max_changes: int = 64  # K: admissions (and retractions) per decision
    search: str = "auto"  # auto | enumerate | greedy | all
    drain_discount: bool = True  # drained memory counts at max(0, 1 - T / D), else fully
    smith: bool = True  # pack order: progress per second of the task's remaining path
    additive: bool = True  # pack order: aging added to the Smith ratio, not multiplied
    reserve: float = 2.0  # a task this many mean ages old (and >= H_age) blocks the others
    retract: bool = False  # a dropped prefix's running stages may be retracted, not drained
    visit: float = 1.0  # J_admit counts a stage whose agent runs stages now 1 + visit times
    age_form: str = "linear"  # g_i(t): linear (1 + rho age / H_age) | log (the paper's) |
    # excess (linear in the age beyond the mean age of the tasks in view)
    soon: bool = False  # credit a stage that fits once running stages and drains end
    jit: bool = False  # load a prompt for next hops only when its load is due; wake then
    drain: bool = True  # R' may leave out a prefix in use (it drains); else it stays in R'
    drain_running: bool = True  # a drain returns its running stages' KV too (else the prompt's)
    fill: str = "auto"  # who admits within the chosen R': its pack, topas-greedy's pass,
    # or auto (the pass where a load is a prefill sharing the GPU, else the pack)
    stall: bool = True  # recompute: a load also costs its time once per running stage
    drain_load: bool = True  # a prompt may wait for drained memory (loaded once it ends)
    token_floor: bool = True  # a running stage has at least its undecoded predicted
    # tokens' decode time left (else its predicted service less its time since it started)
    name = "topas"

    def check(self) -> None:
        for name, what, valid in (
            ("search", "mode", SEARCH_MODES),
            ("age_form", "form", AGE_FORMS),
            ("fill", "filler", FILLS),
        ):
            value = getattr(self, name)
            if value not in valid:
                raise InputError(f"{name}: unknown {what} {value!r} (valid: {', '.join(valid)})")
        if self.enumerate_max < 0 or self.max_changes < 1:
            raise InputError("enumerate_max must be >= 0 and max_changes >= 1")

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self.model = ServiceModel()
        self._pred = Predictions(ctx)
        self._mean_path = 0.0  # mean predicted critical path of the tasks seen (H_age)
        self._n_paths = 0
        self._view: QueueView | None = None
        self._an: dict[str, _Analysis] = {}  # task -> its analysis
        self._stage_ids: dict[str, dict[str, int]] = {}  # task -> stage id -> its rank
        self._seen: dict[str, int] = {}  # task -> the epoch it was analysed at
        self._stale: dict[str, None] = {}  # tasks to re-analyse for a new service model
        self._version = 0
        self._synced: State | None = None  # the state last synced, and its newest stamp
        self._synced_stamp = 0
        self._may_finish: set[str] = set()  # tasks with stages running at the last sync
        self._credit: dict[StageRef, float] = {}
        self._retracted: set[StageRef] = set()  # retract=1: stages retracted voluntarily
        self._kept: tuple[str, ...] = ()
        self.evaluated = 0  # prefix sets scored by the last decision (for the bench)
        self.reserving = False  # the last decision served a starving stage first
        self._scored: tuple[_Round, list[_Pack]] | None = None  # the last search's packs
        self._per_token = ctx.predict.service_s(0, 1)
        # a prefetch delays no waiting task; it costs time only where a load is a prefill
        # that shares the GPU with the batch (the calibrated model with recompute)
        self._prefetch_charge = int(ctx.predict.loads_share_compute)
        # stall: where a load is such a prefill, the batch does not decode while it runs
        self._stalls = self.stall and ctx.predict.loads_share_compute
        self._filler: TOPASGreedy | None = None
        if self._fills_greedily(ctx):  # its weights follow this spec's; the search serves
            self._filler = TOPASGreedy(  # starving stages, so the filler reserves no memory
                path=self.progress, reuse=self.reuse, move=self.move, aging=self.aging, reserve=0.0
            )
            self._filler.reset(ctx)

    def _fills_greedily(self, ctx: PolicyContext) -> bool:
        """Whether topas-greedy's pass admits within ``R'``: ``fill=greedy``, or
        ``fill=auto`` where a prefix load is a prefill that shares the GPU."""
        return self.fill == "greedy" or (self.fill == "auto" and ctx.predict.loads_share_compute)

    # ------------------------------------------------------------------ estimates

    def _service(self, state: State, ref: StageRef) -> float:
        return self._pred.service(state, ref)

    def _cost(self, state: State, agent: str) -> float:
        """c(a): seconds to bring the prefix back (a swap, or its recompute)."""
        return self._pred.load(state, agent)

    @property
    def _mean_svc(self) -> float:
        return self._pred.mean_service

    def _register(self, state: State, tid: str) -> None:
        """Predicted services of a new task and its critical path (for ``H_age``)."""
        info = state.tasks[tid]
        tail = longest_tails(
            info.topo_order,
            lambda sid: info.stages[sid].children,
            lambda sid: self._service(state, (tid, sid)),
        )
        path = max(tail.values(), default=0.0)
        self._n_paths += 1
        self._mean_path += (path - self._mean_path) / self._n_paths

    @property
    def _h_age(self) -> float:
        """H_age: ``age_scale``, else :data:`AGE_FRACTION` of the mean predicted critical
        path of the tasks seen, so aging works on the workload's own time scale."""
        return self.age_scale or AGE_FRACTION * max(self._mean_path, 1e-9)

    def _age_weights(self, ages: np.ndarray, now: float) -> np.ndarray:
        """g_i(t) = 1 + rho * age / H_age (``age_form=log``: 1 + rho * log(1 + age /
        H_age); ``excess``: only the age beyond the mean age of the tasks in view counts),
        for an array of task ages at time ``now``."""
        if not self.aging:
            return np.ones_like(ages)
        if self.age_form == "excess" and self._view is not None and self._view.tasks.of:
            ages = ages - (now - self._view.mean_release())
        scaled = np.maximum(ages, 0.0) / self._h_age
        return 1.0 + self.aging * (np.log1p(scaled) if self.age_form == "log" else scaled)

    def _weight(self, state: State, tid: str) -> float:
        """g_i(t) of one task (the same formula as a decision's)."""
        return float(self._age_weights(np.array([state.age(tid)]), state.time)[0])

    def _sync(self, state: State) -> QueueView:
        """Bring the queue view and the per-task analyses in step with ``state``.

        Finished tasks and stages that left the queue are dropped, new ones added (in
        sorted order). A task is re-analysed when its epoch changed. In the state last
        synced (the engine's, changed in place) the changed tasks are read from the end of
        the stamp-ordered ``task_epoch`` and only their stages compared, and finished tasks
        are looked for among those that had stages running; any other state, or counts
        that do not add up, gets full set differences. When the service model refreshes,
        every task is re-analysed within :data:`REFRESH_BUDGET` tasks per decision, in a
        round robin."""
        view = self._view
        if view is None:
            view = self._view = QueueView(sorted(state.prefixes))
        tasks, epoch = state.tasks, state.task_epoch
        diff = self._changes(state) if state is self._synced else None
        if diff is None:
            diff = self._full_changes(state)
        drop_stages, gone, new, add_stages, changed = diff
        for ref in drop_stages:
            view.drop_stage(ref)
        for tid in gone:
            view.drop_task(tid)
            for d in (self._an, self._seen, self._stale, self._stage_ids):
                d.pop(tid, None)
            self.model.forget(tid)
        for tid in new:
            self._register(state, tid)
            view.add_task(tid, tasks[tid].release)
        for ref in add_stages:
            ids = self._stage_ids.get(ref[0])
            if ids is None:
                ids = self._stage_ids[ref[0]] = {
                    sid: i for i, sid in enumerate(sorted(tasks[ref[0]].stages))
                }
            an = self._an.get(ref[0])
            opens = an.opens.get(ref[1], ()) if an is not None else ()
            view.add_stage(ref, state.agent_of(ref), state.estimated_need(ref), ids[ref[1]], opens)
        dirty = dict.fromkeys(sorted({*changed, *new}))
        self.model.learn(state, self._pred.service_of)
        if self.model.version != self._version:
            self._version = self.model.version
            for tid in sorted(tasks):  # a round robin: those still stale keep their place
                self._stale.setdefault(tid, None)
        budget = REFRESH_BUDGET
        while self._stale and budget:
            tid = next(iter(self._stale))
            del self._stale[tid]
            if tid not in dirty:
                dirty[tid] = None
                budget -= 1
        deferral = max(self._mean_svc, 1e-9)
        for tid in dirty:
            an = _analyse(state, tid, self._pred.service_of, self.model)
            an.share = self._share(an, deferral)
            an.next_hop, an.opens = _task_next_hops(state, tid)
            self._an[tid] = an
            self._seen[tid] = epoch[tid]
            view.set_task(tid, an.share, an.length)
            view.set_hops(tid, an.next_hop)
            for ref in an.tails:  # its waiting stages
                view.set_opens(ref, an.opens.get(ref[1], ()))
        self._synced = state
        self._synced_stamp = next(reversed(epoch.values()), 0)
        self._may_finish = {ref[0] for ref in state.running}
        if len(self._pred.service_of) > 64 * max(16, len(tasks)):
            self._pred.keep_tasks(tasks)
            self._credit = {r: c for r, c in self._credit.items() if r in state.running}
            self._retracted = {r for r in self._retracted if r[0] in tasks}
        return view

    def _full_changes(self, state: State) -> tuple[list, list, list, list, list]:
        """What :meth:`_sync` applies, by set differences of the whole queue: stages to
        drop, finished tasks, new tasks, stages to add (each sorted) and the tasks whose
        epoch changed since their analysis."""
        view, tasks, epoch = self._view, state.tasks, state.task_epoch
        assert view is not None
        return (
            sorted(view.stages.of.keys() - state.waiting.keys()),
            sorted(view.tasks.of.keys() - tasks.keys()),
            sorted(tasks.keys() - view.tasks.of.keys()),
            sorted(state.waiting.keys() - view.stages.of.keys()),
            [tid for tid in tasks if self._seen.get(tid) != epoch[tid]],
        )

    def _changes(self, state: State) -> tuple[list, list, list, list, list] | None:
        """:meth:`_full_changes` from what changed since the last sync of this state: the
        tasks stamped since (newest first); finished tasks among those that had stages
        running then. None when the counts do not add up (a change made without a stamp,
        or a task admitted and finished between two syncs)."""
        view, tasks, waiting = self._view, state.tasks, state.waiting
        assert view is not None
        changed = []
        for tid, e in reversed(state.task_epoch.items()):  # newest first
            if e <= self._synced_stamp:
                break
            changed.append(tid)
        gone = sorted(tid for tid in self._may_finish if tid not in tasks)
        new = sorted(tid for tid in changed if tid not in view.tasks.of)
        if len(view.tasks.of) - len(gone) + len(new) != len(tasks):
            return None
        staged = view.stages.of
        drop = [(t, sid) for t in gone for sid in self._stage_ids.get(t, ()) if (t, sid) in staged]
        add = []
        for tid in changed:
            for sid in tasks[tid].stages:
                ref = (tid, sid)
                if ref in waiting:
                    if ref not in staged:
                        add.append(ref)
                elif ref in staged:
                    drop.append(ref)
        if len(staged) - len(drop) + len(add) != len(waiting):
            return None
        return sorted(drop), gone, new, sorted(add), changed

    def _values(self, view: QueueView, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Per task slot: ``g_i(t)`` and the pack order's value (best first)."""
        w = self._age_weights(now - view.release, now)
        if self.smith and self.additive:  # the wait on its own: at g = 2 a task ranks with
            value = view.share / view.length + (w - 1.0)  # one that a mean stage finishes
        elif self.smith:
            value = w * view.share / view.length
        else:
            value = w * view.share
        return w, value

    # ------------------------------------------------------------------ one round

    def _round(self, state: State) -> _Round:
        view = self._sync(state)
        prefixes = state.prefixes
        rnd = _Round(
            free=state.free_kv,
            slots=state.free_slots,
            status={a: p.status for a, p in prefixes.items()},
            users={a: p.users for a, p in prefixes.items()},
            tokens={a: p.tokens for a, p in prefixes.items()},
            queues={},
            need=view.need,
            waiting_tasks=view.waiting_tasks(),
            next_hop=dict(view.hops),
            cost={a: self._cost(state, a) for a in prefixes},
        )
        w, value = self._values(view, state.time)
        rnd.ranking = view.ranked(value)
        rnd.credit = w * view.share
        rnd.analyses = self._an
        rnd.queues = {agent: [] for agent in sorted(rnd.ranking.spans)}  # read by _more
        rnd.opened = rnd.ranking.opened(CHUNK)
        rnd.set_heads(rnd.ranking.heads())
        rnd.set_current()
        tasks, remaining, floor = state.tasks, self._pred.remaining, self.token_floor
        kv, refs, drain_s, lefts = rnd.running_kv, rnd.running_refs, rnd.drain_s, rnd.left
        for ref, run in sorted(state.running.items()):
            agent = tasks[ref[0]].stages[ref[1]].agent
            kv[agent] = kv.get(agent, 0) + run.reserved
            refs.setdefault(agent, []).append(ref)
            if self.retract:  # read only by a pack that retracts (_pack's ``revoke``)
                rnd.revoke_loss[agent] = rnd.revoke_loss.get(agent, 0.0) + self._loss(state, ref)
            left = remaining(state, ref, floor)
            drain_s[agent] = max(drain_s.get(agent, 0.0), left)
            if self.soon and left < self._mean_svc:
                rnd.returns.append((left, run.reserved))
            lefts[ref] = left
        rnd.returns.sort()
        if self.jit:
            self._defer_loads(state, rnd)
        return rnd

    def _defer_loads(self, state: State, rnd: _Round) -> None:
        """``jit``: an absent prompt whose next-hop stages are due later than it takes to
        load it gets no load credit now (``n_a = 0`` for loading it): its load is due at
        ``T - c(a)`` (``T``: when the next hop's last running predecessor ends), and the
        decision asks to be consulted again then (``wake_at``)."""
        due: dict[str, float] = {}
        for a, ready in self._hops_ready(state, rnd, sorted(rnd.left), rnd.left):
            due[a] = min(due.get(a, math.inf), ready)
        for a, t in sorted(due.items()):
            if self._early(rnd, t, a):
                rnd.next_hop[a] = 0
                rnd.wakes.append(state.time + t - rnd.cost[a])

    @staticmethod
    def _hops_ready(
        state: State, rnd: _Round, sources: Iterable[StageRef], ends: dict[StageRef, float]
    ) -> Iterator[tuple[str, float]]:
        """``(agent, T)`` for each child of the stages ``sources`` whose agent's prompt is
        absent and whose every predecessor is done or ends within ``ends`` (seconds from
        now): ``T``, when the last of them ends."""
        for tid, sid in sources:
            info = state.tasks[tid]
            for c in info.stages[sid].children:
                a = info.stages[c].agent
                if rnd.status[a] is not PrefixStatus.ABSENT:
                    continue
                ready = 0.0
                for d in info.stages[c].deps:
                    ref = (tid, d)
                    if ref in ends:
                        ready = max(ready, ends[ref])
                    elif state.phase[ref] is not Phase.DONE:
                        break
                else:
                    yield a, ready

    def _more(self, rnd: _Round, agent: str, position: int) -> bool:
        """Whether ``agent``'s queue has a stage at ``position``, reading more of its pack
        order into it (ranks and credits; twice as many stages as it holds, at least
        :data:`FIRST_READ`) as needed."""
        q = rnd.queues[agent]
        assert rnd.ranking is not None
        while position >= len(q):
            got = rnd.ranking.take(agent, max(FIRST_READ, len(q)))
            if not got:
                rnd.read_out.add(agent)
                return False
            ranks, values, credit, skip = rnd.rank, rnd.value, rnd.credit, rnd.skip
            for ref, rank, slot in got:
                if ref in skip:
                    continue
                ranks[ref] = rank
                values[ref] = credit.item(slot)
                q.append(ref)
        return True

    # ------------------------------------------------------------------ GREEDYPACK

    def _pack(
        self, state: State, rnd: _Round, agents: Iterable[str], revoke: bool = False
    ) -> _Pack | None:
        """GREEDYPACK(R'): admit waiting stages of ``agents`` best first while they fit;
        score the post-decision state. With ``revoke`` the running stages of dropped
        prefixes are retracted now (their memory and slots free at once, for
        ``J_redo + J_revoke``) instead of draining.

        The budget is the post-decision one, ``B - sum_{a in R'} l_a - sum_{r in Q'} d_r``:
        a dropped prefix whose stages still run (it drains) returns its memory, and theirs,
        when they finish. Stages that fit now are admitted; those that fit only in the
        drained memory are credited at ``drain_credit`` (they start once the drain ends,
        ``T`` seconds from now: ``max(0, 1 - T / D)``) and admitted by a later decision.
        With ``drain_load`` a set whose loads fit only in that drained memory is scored
        too: the loads take it first, and nothing starts now."""
        keep = agents if isinstance(agents, frozenset) else frozenset(agents)
        if rnd.pinned is not None and rnd.pinned not in keep:
            return None
        free = rnd.free
        drained = 0  # memory that draining prefixes and their running stages will return
        drain_s = 0.0
        j_move = 0.0
        v_reuse = rnd.current_reuse
        slots = rnd.slots
        retract: list[StageRef] = []
        j_retract = 0.0
        prompts_out: list[tuple[float, int]] = []  # with soon: (drain ends, prompt KV)
        tokens, cost, hops = rnd.tokens, rnd.cost, rnd.next_hop
        changed = sorted(keep ^ rnd.current)  # only what changes against R_t costs or frees
        loaded = []
        stalled = len(rnd.left) if self._stalls else 0  # running stages a recompute holds up
        for a in changed:
            if a in keep:  # absent now: loaded (l_in is charged below, per waiting task)
                j_move += cost[a] * stalled
                free -= tokens[a]
                v_reuse += hops.get(a, 0) * cost[a]
                loaded.append(a)
                continue
            v_reuse -= hops.get(a, 0) * cost[a]
            if rnd.status[a] is not PrefixStatus.RESIDENT:
                pass  # loading: nothing to return
            elif rnd.users[a] == 0:
                free += tokens[a]
            elif revoke:
                refs = rnd.running_refs.get(a, ())
                if not self._retracted.isdisjoint(refs):
                    return None  # a stage is retracted voluntarily once at most
                free += tokens[a] + rnd.running_kv.get(a, 0)
                slots += len(refs)
                retract += refs
                j_retract += rnd.revoke_loss.get(a, 0.0)
                j_move += cost[a] * len({r[0] for r in refs})
            elif not self.drain:
                return None  # a prefix in use stays in R' until its stages end
            elif self.soon:  # its stages: returns
                prompts_out.append((rnd.drain_s.get(a, 0.0), tokens[a]))
            else:
                drained += tokens[a] + (rnd.running_kv.get(a, 0) if self.drain_running else 0)
                drain_s = max(drain_s, rnd.drain_s.get(a, 0.0))
            j_move += cost[a] * rnd.waiting_tasks.get(a, 0)  # l_out: they wait for it
            if stalled and (rnd.waiting_tasks.get(a, 0) or hops.get(a, 0)):
                j_move += cost[a] * stalled  # and the batch, when it is brought back
        deferred = False  # drain_load: the loads wait for the drain (no stage starts now)
        if free < 0 and not rnd.loads_fit(free):  # with retract, memory comes back by retraction
            if self.retract or not (self.drain_load and loaded and rnd.loads_fit(free + drained)):
                return None
            deficit = min(0, rnd.free) - free
            free, drained, deferred = free + deficit, drained - deficit, True
        if revoke and not retract or len(retract) >= self.max_changes:
            return None  # nothing to retract, or more retractions than K allows
        later = self._later(drain_s) if drained else 0.0
        # the stages of R' best first: a merge of the agents' queues by rank (ranks are
        # unique), read lazily: the best stage of each agent of R_t from ``current_heads``
        # (in rank order, skipping those dropped), those of the added agents and the next
        # ones of each agent from a heap
        heads, n_heads, h = rnd.current_heads, len(rnd.current_heads), 0
        queue: list[tuple[int, str]] = []
        if loaded:
            head_rank = rnd.head_rank
            queue = [(head_rank[a], a) for a in loaded if a in head_rank]
            heapq.heapify(queue)
        position: dict[str, int] = {}
        admitted: list[StageRef] = []
        credit: dict[StageRef, float] = {}
        moved: dict[str, set[str]] = {}
        misfits, j_admit = 0, 0.0
        changes = self.max_changes - len(retract)  # admissions (now or later) K leaves
        soon = None
        if self.soon:  # every stage due within D returns its KV, a drained prompt its own
            soon = _Returns(heapq.merge(rnd.returns, sorted(prompts_out)))
        queues, ranks, needs, values, users = rnd.queues, rnd.rank, rnd.need, rnd.value, rnd.users
        while slots > 0 and changes > 0:
            while h < n_heads and heads[h][1] not in keep:
                h += 1
            if queue and (h == n_heads or queue[0][0] < heads[h][0]):
                _, a = heapq.heappop(queue)
            elif h < n_heads:
                a = heads[h][1]
                h += 1
            else:
                break  # every stage of R' read
            q, i = queues[a], position.get(a, 0)
            if i == len(q):  # its rank was in the heap: the stage exists
                self._more(rnd, a, i)
            ref = q[i]
            position[a] = i + 1
            if i + 1 < len(q) or (a not in rnd.read_out and self._more(rnd, a, i + 1)):
                heapq.heappush(queue, (ranks[q[i + 1]], a))
            need = needs[ref]
            now = need <= free
            wait = None  # with ``soon``: seconds until running stages and drains free it
            if not now and (need > drained or not later):
                if soon is None or (wait := soon.when(need, free)) is None:
                    misfits += 1
                    if misfits >= MAX_MISFITS:
                        break
                    continue
            value = values[ref]
            if users[a]:  # its agent runs stages now: this continues its visit
                value *= 1.0 + self.visit
            slots -= 1
            changes -= 1
            if wait is not None:
                j_admit += self._deferred(wait) * value
            elif now:
                credit[ref] = value
                j_admit += value
                free -= need
                admitted.append(ref)
                for b in rnd.analyses[ref[0]].opens.get(ref[1], ()):  # n_b grows post-decision
                    if b in keep and not (self.jit and self._early_open(state, rnd, ref, b)):
                        v_reuse += rnd.cost[b]
                if rnd.status[a] is PrefixStatus.ABSENT:
                    moved.setdefault(a, set()).add(ref[0])
            else:
                j_admit += later * value
                drained -= need
                if deferred and rnd.status[a] is PrefixStatus.ABSENT:  # it waits for the load
                    moved.setdefault(a, set()).add(ref[0])
        for a in loaded:  # l_in: the tasks that wait for it (prefetch: none)
            j_move += cost[a] * max(self._prefetch_charge, len(moved.get(a, ())))
        score = self.progress * j_admit - self.move * j_move + self.reuse * v_reuse - j_retract
        waits = tuple(loaded) if deferred else ()
        return _Pack(keep, admitted, credit, score, len(changed), tuple(retract), waits)

    def _early(self, rnd: _Round, due_s: float, agent: str) -> bool:
        """``jit``: loading ``agent`` now for a next hop due in ``due_s`` would be early:
        the load takes less than that."""
        return due_s - rnd.cost[agent] > JIT_SLACK * self._mean_svc

    def _early_open(self, state: State, rnd: _Round, ref: StageRef, agent: str) -> bool:
        """``jit``: loading absent ``agent`` now, for the next hop that admitting ``ref``
        opens, would be early: ``ref``'s service outlasts the load."""
        return agent not in rnd.current and self._early(rnd, self._service(state, ref), agent)

    def _later(self, drain_s: float) -> float:
        """The credit of a stage that fits only once the drain ends, ``drain_s`` from now."""
        return self._deferred(drain_s) if self.drain_discount else 1.0

    def _deferred(self, wait_s: float) -> float:
        """``max(0, 1 - T / D)``: the share of its credit a stage keeps when it can start
        only ``T = wait_s`` seconds from now."""
        return max(0.0, 1.0 - wait_s / max(self._mean_svc, 1e-9))

    @staticmethod
    def _share(an: _Analysis, deferral: float) -> float:
        """A waiting stage's share of its task's progress: the cut in ``L_i`` when every
        waiting stage starts now rather than later, split evenly among them (one of
        several parallel siblings alone cuts nothing; all of them together do)."""
        if not an.tails:
            return 0.0
        return (longest_path(an, (), deferral) - an.length) / len(an.tails)

    # ------------------------------------------------------------------ the search

    def _candidates_agents(self, state: State, rnd: _Round) -> tuple[list[str], tuple[str, ...]]:
        """The active pool A_t (sorted) and the current residency R_t within it."""
        pool = set(rnd.queues) | {a for a, n in rnd.next_hop.items() if n} | rnd.opened
        pool |= {a for a, st in rnd.status.items() if st is not PrefixStatus.ABSENT}
        active = sorted(pool)
        return active, tuple(a for a in active if a in rnd.current)

    def _search(self, state: State, rnd: _Round) -> _Pack:
        active, current = self._candidates_agents(state, rnd)
        scored: dict[frozenset[str], _Pack | None] = {}

        def score(agents: Iterable[str]) -> _Pack | None:
            key = agents if isinstance(agents, frozenset) else frozenset(agents)
            if key not in scored:
                best = self._pack(state, rnd, key)
                if (
                    self.retract
                    and best is not None
                    and any(a not in key for a in rnd.running_refs)
                ):  # a dropped prefix still in use: drain it, or retract its stages now
                    now = self._pack(state, rnd, key, revoke=True)
                    if now is not None and now.score > best.score + 1e-9:
                        best = now
                scored[key] = best
            return scored[key]

        mode = self.search
        if mode == "all":  # no choice of residency: every active agent that fits, best first
            keep = list(current)
            for _, a in rnd.heads:
                if a not in keep and score([*keep, a]) is not None:
                    keep.append(a)
            best = score(keep)
        elif mode == "enumerate" or (mode == "auto" and len(active) <= self.enumerate_max):
            best = None
            for n in range(len(active) + 1):
                for combo in itertools.combinations(active, n):
                    p = score(combo)
                    if p is not None and p.beats(best):
                        best = p
        else:

            def unfit(a: str) -> bool:
                """R_t plus the absent agent ``a`` does not fit: its prompt alone takes more
                than the free memory (what :meth:`_pack` finds first, scored as its None)."""
                if rnd.loads_fit(rnd.free - rnd.tokens[a]):
                    return False
                scored.setdefault(rnd.current | {a}, None)
                return True

            best = self._greedy(active, current, score, unfit)
        assert best is not None  # the current residency always fits: nothing changes
        if not best.admitted and not state.running and rnd.heads:
            # never idle the server: the best single stage's agent alone
            alone = score((rnd.heads[0][1],))
            if alone is not None and alone.admitted:
                best = alone
        self.evaluated = len(scored)
        self._scored = (rnd, [p for p in scored.values() if p is not None and p is not best])
        return best

    def _greedy(self, active: list[str], current: tuple[str, ...], score, unfit=None) -> _Pack:  # type: ignore[no-untyped-def]
        """From R_t: single moves (add an agent, drop one) while one improves the score,
        then pairs of additions and swaps when single moves stall; at most ``|A|^2``
        candidates.

        Lazy (CELF): every single move is scored once against R_t; afterwards a move is
        re-scored only when it reaches the top of the queue with a gain measured against an
        earlier R', and taken if its fresh gain still leads. Pairs and swaps use only the
        :data:`PAIR_POOL` additions and drops with the best last gains. A decision thus
        scores about ``|A|`` sets plus a few per step, not ``|A|`` per step. ``unfit(a)``
        (optional) tells, and scores, the additions to R_t that cannot fit, without
        packing them."""
        budget = max(16, len(active) ** 2)
        evals = 0
        best = score(current)
        assert best is not None
        cur = frozenset(current)
        step = 0  # R' changes taken; a gain measured at an earlier step is stale
        heap: list[tuple[float, str, int, str]] = []  # (-gain, agent, step measured, kind)
        last: dict[tuple[str, str], float] = {}  # (kind, agent) -> its last gain

        def measure(kind: str, a: str) -> None:
            nonlocal evals
            evals += 1
            p = score(cur | {a} if kind == "add" else cur - {a})
            if p is not None:
                last[kind, a] = gain = p.score - best.score
                heapq.heappush(heap, (-gain, a, step, kind))

        for a in active:
            if a in cur:
                measure("drop", a)
            elif unfit is not None and unfit(a):
                evals += 1  # scored: it does not fit
            else:
                measure("add", a)
        while evals < budget:
            took = None
            while heap and evals < budget:
                neg, a, at, kind = heapq.heappop(heap)
                if (kind == "add") == (a in cur):
                    continue  # no longer a move from R'
                if at != step:
                    measure(kind, a)  # stale: back in the queue at its fresh gain
                    continue
                if -neg > 1e-9:
                    took = score(cur | {a} if kind == "add" else cur - {a})
                heapq.heappush(heap, (neg, a, at, kind))  # kept for the next round
                break
            if took is None:  # single moves stall: pairs of additions, then swaps
                # best last gain first, ties by name (never by the order of a set)
                adds = sorted(
                    (a for a in active if a not in cur),
                    key=lambda a: (-last.get(("add", a), -math.inf), a),
                )
                drops = sorted(cur, key=lambda a: (-last.get(("drop", a), -math.inf), a))
                adds, drops = adds[:PAIR_POOL], drops[:PAIR_POOL]
                cands = [cur | set(pair) for pair in itertools.combinations(sorted(adds), 2)]
                cands += [(cur - {x}) | {y} for x in sorted(drops) for y in sorted(adds)]
                for agents in cands:
                    if evals >= budget:
                        break
                    evals += 1
                    p = score(agents)
                    if p is not None and p.score > best.score + 1e-9 and p.beats(took):
                        took = p
            if took is None:
                break
            changed = cur ^ took.agents
            best, cur = took, took.agents
            step += 1
            for a in sorted(changed):  # the reverse move is new; measured when it surfaces
                kind = "drop" if a in cur else "add"
                heapq.heappush(heap, (-last.get((kind, a), 0.0), a, -1, kind))
        return best

    # ------------------------------------------------------------------ decide

    def decide(self, state: State) -> Decision:
        rnd = self._round(state)
        best = self._search(state, rnd)
        starving = self._starving(state)
        self.reserving = starving is not None and starving not in best.admitted
        if self.reserving:
            self._scored = None
            decision = self._reserve_for(state, rnd, starving)
        else:
            decision = self._commit(state, rnd, best, state.plan())
            if self.jit:
                decision = self._with_wake(state, rnd, best, decision)
        if self._filler is not None:  # what its next sync drops from the queue
            self._filler.admitted(decision.admit)
        return decision

    def alternatives(self, state: State, k: int) -> list[Decision]:
        """The decisions of the ``k`` best-scored post-decision states after the one the
        last :meth:`decide` took on ``state`` (each a different ``R'``; best first), for a
        lookahead to judge (``topas-rollout``). None after a decision that served a
        starving stage (:attr:`reserving`). What TOPAS remembers of its decisions (the
        credits of ``J_revoke``, the kept set) is left as the decision set it."""
        if self._scored is None:
            return []
        rnd, packs = self._scored
        packs = sorted(packs, key=lambda p: (-p.score, p.changes, sorted(p.agents)))[:k]
        return [self._commit(state, rnd, p, state.plan(), record=False) for p in packs]

    def _with_wake(self, state: State, rnd: _Round, best: _Pack, decision: Decision) -> Decision:
        """``jit``: the decision asks to be consulted when a deferred load is due: one for
        the running stages' next hops (:meth:`_defer_loads`), or for a stage that the
        admitted ones make ready (a join too: every unfinished predecessor admitted now or
        running), at its predicted ready time less its prompt's load."""
        wakes = list(rnd.wakes)
        ends = {**rnd.left, **{ref: self._service(state, ref) for ref in decision.admit}}
        for a, ready in self._hops_ready(state, rnd, decision.admit, ends):
            if a not in best.agents:
                wakes.append(state.time + ready - rnd.cost[a])
        later = [t for t in wakes if t > state.time + 1e-9]
        return dataclasses.replace(decision, wake_at=min(later)) if later else decision

    def _commit(
        self,
        state: State,
        rnd: _Round,
        best: _Pack,
        plan: Planner,
        pinned: str | None = None,
        record: bool = True,
    ) -> Decision:
        """The decision for ``best`` on top of ``plan`` (which may already admit a starving
        stage of agent ``pinned``): unused prefixes outside ``R'`` evicted, the pack
        admitted, absent prefixes of ``R'`` loaded, the other agents' stages held. Where the
        pack's loads wait for drained memory (``drain_load``) nothing starts now: nothing
        is admitted, by the pack or the filler, and every waiting stage but those of the
        agents to load is held, so that an engine that admits on its own (SGLang's) keeps
        that memory for the loads too. With ``record`` (a decision taken, not an
        alternative) the admissions' credits and the kept set are remembered."""
        credit = self._credit if record else {}
        keep = best.agents | ({pinned} if pinned else set())
        for ref in best.retract:
            plan.do_preempt(ref)
        if record:
            self._retracted.update(best.retract)
        for a in plan.evictable(sorted(rnd.status)):
            if a not in keep:
                plan.do_evict(a)
        filled: tuple[StageRef, ...] = ()
        if best.waits:
            pass  # drain_load: what is free now is kept for the loads; nothing starts
        elif self._filler is None:
            self._admit_pack(state, rnd, best, plan, credit)
        else:
            before = len(plan.admit)
            filled = self._filler.admit_within(state, plan, frozenset(keep))
            for ref in plan.admit[before:]:  # the search's credit where it read the stage
                credit[ref] = rnd.value.get(ref, 0.0)
        for a in sorted(best.agents):  # kept for the reuse it promises (unless just evicted)
            if plan.status(a) is PrefixStatus.ABSENT and a not in plan.evict:
                plan.do_load(a)
        if record:
            self._kept = tuple(sorted(keep))
        view = self._view
        assert view is not None
        out = keep.difference(best.waits) if best.waits else frozenset()
        held = filled + tuple(view.held(a for a in view.agents if a not in keep or a in out))
        if out and plan.admit:  # a starving stage admitted first (pinned) is not held
            admitted = set(plan.admit)
            held = tuple(r for r in held if r not in admitted)
        return dataclasses.replace(plan.decision(), held=held)

    @staticmethod
    def _admit_pack(
        state: State, rnd: _Round, best: _Pack, plan: Planner, credit: dict[StageRef, float]
    ) -> None:
        """Admit the pack of ``best`` on top of ``plan`` (``fill=search``)."""
        for ref in best.admitted:  # packed by predicted lengths: the engine has the last word
            if plan.try_admit(ref, ()):
                credit[ref] = best.credit[ref]
        if best.admitted and not plan.admit and not state.running:
            # every packed stage is truly longer than told and none fits: never idle the
            # server, the first one goes in with unused prompts evicted (it fits alone)
            ref = best.admitted[0]
            if plan.try_admit(ref, plan.evictable(sorted(rnd.status))):
                credit[ref] = best.credit[ref]

    def _starving(self, state: State) -> StageRef | None:
        """The oldest task's first waiting stage, if the task has waited ``reserve`` times
        the mean age of the released tasks and at least a mean task's predicted critical
        path (``age_scale`` when set): an outlier the flow keeps leaving behind (a stage
        that needs memory the others keep taking)."""
        view = self._view
        if not self.reserve or view is None or not state.waiting:
            return None
        first = view.first_release()
        if first is None:
            return None
        age = state.time - first
        scale = self.age_scale or max(self._mean_path, 1e-9)  # a whole task's path at least
        mean_age = state.time - view.mean_release()
        return view.oldest() if age >= scale and age >= self.reserve * mean_age else None

    def _reserve_for(self, state: State, rnd: _Round, ref: StageRef) -> Decision:
        """The starving stage first: its agent kept, other unused prompts evicted if that
        makes it fit, and the search backfills what fits beside it. If it does not fit
        even so, nothing else is admitted until it does (running stages free the memory,
        so it cannot wait for ever): EASY backfilling, with memory as the resource."""
        plan = state.plan()
        agent = state.agent_of(ref)
        if not plan.try_admit(ref, [a for a in state.evictable() if a != agent]):
            self._kept = (agent,)  # it does not fit yet: evict nothing, admit nothing
            assert self._view is not None
            return Decision(held=tuple(r for r in self._view.held(self._view.agents) if r != ref))
        for a in plan.evict:  # the round now starts from the plan's state
            rnd.status[a] = PrefixStatus.ABSENT
        if rnd.status[agent] is PrefixStatus.ABSENT:
            rnd.status[agent] = PrefixStatus.LOADING
        rnd.users[agent] += 1
        rnd.pinned = agent
        rnd.free, rnd.slots = plan.free_kv, plan.free_slots
        rnd.set_current()
        rnd.skip.add(ref)
        queue = rnd.queues.get(agent)
        if queue is not None:
            if ref in queue:
                queue.remove(ref)
            heads = [h for h in rnd.heads if h[1] != agent]
            if self._more(rnd, agent, 0):
                heads.append((rnd.rank[queue[0]], agent))
            else:
                del rnd.queues[agent]
            rnd.set_heads(sorted(heads))
        return self._commit(state, rnd, self._search(state, rnd), plan, agent)

    # ------------------------------------------------------------------ retention, retraction

    def eviction_order(self, state: State) -> list[str]:
        """Unused prefixes: those outside the last kept set first, then the least reuse."""
        cands = state.evictable()  # LRU order, kept among ties by the stable sort
        kept = set(self._kept)
        hops = self._view.hops if self.reuse and self._view is not None else {}
        cands.sort(key=lambda a: (a in kept, hops.get(a, 0) * self._cost(state, a)))
        return cands

    def _loss(self, state: State, ref: StageRef) -> float:
        """What retracting a running stage costs, in seconds: ``J_redo``, the service it has
        had (its decoded tokens x the time of one decode step, or the time since it
        started if longer: the step model restarts a retracted stage from scratch and does
        not count decoded tokens), plus ``J_revoke``, its admission credit."""
        run = state.running[ref]
        redo = run.generated * self._per_token
        if run.started_at is not None:
            redo = max(redo, state.time - run.started_at)
        return self.redo * redo + self.revoke * self._credit.get(ref, 0.0)

    def retraction_order(self, state: State, candidates: Sequence[StageRef]) -> list[StageRef]:
        """Least loss (``J_redo + J_revoke``) first."""
        return sorted(candidates, key=lambda ref: (self._loss(state, ref), ref[0], ref[1]))


@dataclass
class TOPASBase(TOPAS):
    """The paper's TOPAS-base: the search without downstream reuse and without aging."""

    reuse: float = 0.0
    aging: float = 0.0
    name = "topas-base"
