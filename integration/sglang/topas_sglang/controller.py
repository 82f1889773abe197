"""The per-scheduler TOPAS controller: SGLang's queues and radix tree in, decisions out.

One :class:`Controller` lives with each scheduler's radix cache: the ``topas`` eviction
strategy creates it (:mod:`topas_sglang.retention`). At each ``calc_priority`` call,
:meth:`Controller.plan_round`

1. reads the tagged requests (:func:`topas_sglang.adapter.observe`), remembering each
   task's release (when the scheduler first saw it); the stages that finished are those
   SGLang signalled finished (:meth:`Controller.stage_finished`, called from a hook on the
   cache's ``on_release``), never inferred from a request's absence: a request being
   prefilled in chunks, or aborted, is in neither the queue nor the batch;
2. finds which agents' system prompts are cached on the device: a read-only match of each
   agent's prompt tokens in the tree (no LRU touch, no split); the node it ends in is
   *the agent's prompt node*;
3. builds the :class:`~topas.state.State` (:class:`topas.observe.Observer`, which keeps
   an unchanged task's epoch, so the policy's per-task analyses carry over) and runs
   the policy (``topas`` unless configured otherwise) on it: the very code the simulator
   runs, no second copy;
4. turns the :class:`~topas.state.Decision` into SGLang terms: a waiting-queue order, the
   rids held out of this round's admission, and eviction ranks for the agents' prompt
   nodes.

With tensor parallelism only rank 0 plans; the other ranks take its plan
(:meth:`Controller.agree`, :mod:`topas_sglang.ranks`).

Untagged requests keep their places in SGLang's order; only the tagged ones are permuted
among their own positions, and the held ones go to the tail. Membership never changes.
The tree is reached through the cache object handed in; SGLang itself is imported only
to read the chunked-prefill size from its server args and (in :mod:`topas_sglang.ranks`)
to find its TP group and broadcast over it.
"""

from __future__ import annotations

import itertools
import logging
import math
import operator
import re
import time
from array import array
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from topas.instance import RecomputeLoad, ServerSpec
from topas.kv import sglang_kv_need
from topas.observe import Observer
from topas.policies import make_policy
from topas.policies.base import Policy, PolicyContext
from topas.profiles import DEFAULT_PROFILE, get_profile
from topas.state import Decision, KvNeed, State
from topas.workflow_metadata import MetadataError
from topas_sglang.adapter import Memo, Observation, metadata, observe
from topas_sglang.metrics import Exporter, metrics_enabled
from topas_sglang.ranks import RankLink, apply_order, check_retraction, sglang_link, word

logger = logging.getLogger("topas_sglang")

DEFAULT_CHUNK = 8192  # SGLang's chunked-prefill size when the server args give none
REPLAN_S = 0.1  # an unchanged queue, batch and tree are re-planned after this long
MAX_TRACKED_TASKS = 100_000  # tasks remembered (release, finished stages) before the
# ones not in flight are forgotten

KeyFactory = Callable[[array], Any]  # prompt token ids -> the tree's key (RadixKey)
UNRESOLVED = "unresolved"  # Controller.link before its first use


@dataclass
class Stats:
    """What the controller did, for logs and tests."""

    rounds: int = 0  # calc_priority calls with tagged requests, planned afresh
    reused: int = 0  # calls that found nothing changed and kept the last plan
    reordered: int = 0  # rounds whose order differed from SGLang's
    held: int = 0  # requests held back, summed over rounds
    retraction_orders: int = 0
    fallbacks: int = 0  # rounds that fell back to SGLang's order after an error
    decide_s: float = 0.0  # seconds inside plan_round / retraction_order (wall clock)
    decide_cpu_s: float = 0.0  # ... of the scheduler thread's CPU (time.thread_time):
    # what TOPAS took from the scheduler, without the waits for a CPU that others hold
    malformed: int = 0  # sightings (per planned round) of requests whose metadata failed
    finished: int = 0  # SGLang's finish signals for tagged requests
    reappeared: int = 0  # stages signalled finished, then seen queued or running again
    over_budget: int = 0  # rounds that kept SGLang's order: the time budget was spent
    followed: int = 0  # rounds and retraction orders taken from rank 0 (a TP rank > 0)
    plans: int = 0  # plans received from the planner process (offload; 0 otherwise)
    planner_s: float = 0.0  # CPU seconds the planner process spent on them
    lag: int = 0  # changed rounds between a snapshot and its plan's arrival, summed (0:
    # the plan came back before the next changed round, which applies it)
    ahead: int = 0  # rounds that applied the planner's plan for a predicted finish

    def charge(self, since: tuple[float, float]) -> float:
        """Adds the wall clock and the thread's CPU time since ``since`` (:func:`clocks`)
        to :attr:`decide_s` and :attr:`decide_cpu_s`; the wall seconds."""
        wall = time.perf_counter() - since[0]
        self.decide_s += wall
        self.decide_cpu_s += time.thread_time() - since[1]
        return wall

    def line(self) -> str:
        """One log line (``topas stats: key=value ...``), which the live bench reads."""
        calls = max(1, self.rounds + self.retraction_orders)
        return (
            f"topas stats: rounds={self.rounds} reused={self.reused} "
            f"reordered={self.reordered} held={self.held} "
            f"retraction_orders={self.retraction_orders} fallbacks={self.fallbacks} "
            f"malformed={self.malformed} finished={self.finished} "
            f"reappeared={self.reappeared} over_budget={self.over_budget} "
            f"followed={self.followed} plans={self.plans} "
            f"planner_s={self.planner_s:.6f} lag={self.lag} ahead={self.ahead} "
            f"decide_s={self.decide_s:.6f} "
            f"decide_ms_per_call={1e3 * self.decide_s / calls:.4f} "
            f"decide_cpu_s={self.decide_cpu_s:.6f} "
            f"decide_cpu_ms_per_call={1e3 * self.decide_cpu_s / calls:.4f}"
        )


def clocks() -> tuple[float, float]:
    """(wall clock, this thread's CPU time) now, for :meth:`Stats.charge`."""
    return time.perf_counter(), time.thread_time()


STATS_LINE = re.compile(r"topas stats: (.*)$", re.MULTILINE)


def stats_from_log(text: str) -> dict[str, float]:
    """The counters of the last ``topas stats`` line (:meth:`Stats.line`) in a server's
    log, as numbers; empty when there is none (the server ran without TOPAS)."""
    found = STATS_LINE.findall(text)
    return {k: float(v) for k, v in (kv.split("=") for kv in found[-1].split())} if found else {}


STATS_EVERY = 20
"""Planned rounds between two ``topas stats`` log lines (and at every power of two, so
a short run logs its counters too)."""


DEFAULT_BUDGET_MS = 1.0
"""The plugin's mean planning time per scheduling round, in ms (``budget_ms`` in
``--radix-eviction-policy-config``; 0 turns the budget off), when it plans in the
scheduler (``"offload": false``; the offloaded default has no budget). 1 ms is about 15% of the
shortest decode iteration of the calibrated Llama-3-8B/H100 profile (6.9 ms at a batch of
8 with 2,000-token contexts; 13 ms at 64; ``docs/calibration.md``) and about half of what
SGLang's own lpm ordering takes at 100 waiting requests on this project's 2-core CPU."""

BURST_ROUNDS = 10
"""Rounds' worth of unspent budget a controller may save up for a costly round."""


DEFAULT_POLICY = "topas-greedy"
"""The plugin's default: the single-pass scorer. In the live bench
(``integration/sglang/live_bench.py``, both planning in the planner process) its mean JCT
is within -3.3..+0.4% of the search's (``{"policy": "topas"}``) on the tuning seeds and
-2.0..+1.6% on the reporting seeds, where both are 6-12% below SGLang's own order, and its
plans take about two thirds of the planner's CPU (``integration/sglang/README.md``,
"Which scorer"); in the simulator it is also a little ahead on today's five workloads
(docs/topas.md). So the default stays."""


@dataclass
class Controller:
    """TOPAS for one SGLang scheduler (see the module docstring)."""

    policy_spec: str = DEFAULT_POLICY
    budget_ms: float = DEFAULT_BUDGET_MS  # mean planning time per round; 0: no budget
    key_factory: KeyFactory | None = None  # set by the plugin: RadixKey
    held_rids: frozenset[str] = frozenset()  # this round's hold-backs (read by PrefillAdder)
    ranks: dict[int, tuple] = field(default_factory=dict)  # prompt node id -> eviction rank
    stats: Stats = field(default_factory=Stats)
    link: RankLink | None | str = UNRESOLVED  # the TP group (rank_link); None: one rank

    def __post_init__(self) -> None:
        make_policy(self.policy_spec)  # a bad spec fails at server start, not mid-run
        ms = self.budget_ms
        if isinstance(ms, bool) or not (isinstance(ms, int | float) and 0 <= ms < math.inf):
            raise ValueError(f"budget_ms: a number of ms per round >= 0 expected, got {ms!r}")
        self.credit = 0.0  # seconds of planning this controller may still spend
        self.cache: Any = None
        self.releases: dict[str, float] = {}  # task -> first seen (perf_counter clock)
        self.observer = Observer()  # keeps an unchanged task's epoch between rounds
        self._memo: Memo = {}  # per live request: its metadata and Request (adapter.observe)
        self.finished: dict[str, set[str]] = {}  # task -> stages SGLang signalled finished
        self.task_size: dict[str, int] = {}
        self._active: set[str] = set()  # tasks with a stage queued or running at the last look
        self._signalled: set[str] = set()  # tasks with a finish signal since then
        self.prompt_ids: dict[str, array] = {}  # agent -> its system-prompt token ids
        self.prefix_tokens: dict[str, int] = {}
        self.prompt_nodes: dict[str, int] = {}  # agent -> node its cached prompt ends in
        self._noted: dict[str, Any] = {}  # task -> its Task, once its agents are noted
        self._needs: dict[tuple[str, str], int] = {}  # stage -> its KV need (_need_rule)
        self._needs_for: frozenset[tuple[str, int]] = frozenset()  # the prompt lengths then
        self._policies: dict[str, tuple[Policy, frozenset[tuple[str, int]]]] = {}  # stream ->
        # its policy and the agents' prompt lengths it was built for (_policy_for)
        self._server: ServerSpec | None = None
        self._last_key: tuple = ()  # what the last plan saw, when, and what it said
        self._last_at = -math.inf
        self._last_order: list | None = None
        self.chunked_req: Any = None  # the request SGLang is still prefilling in chunks
        self.exporter = Exporter() if self.exports() else None  # --enable-metrics

    def exports(self) -> bool:
        """Whether this controller's stats go to SGLang's metrics (``--enable-metrics``)."""
        return metrics_enabled()

    # ------------------------------------------------------------------ rounds

    def plan_round(self, cache: Any, waiting: list, running: Sequence, now: float) -> list | None:
        """The waiting queue in TOPAS's order (same members), or None when no request
        carries TOPAS metadata. Sets :attr:`held_rids` and :attr:`ranks`."""
        start = clocks()
        self._earn()
        key = (tuple(map(id, waiting)), tuple(map(id, running)), cache.evictable_size(),
               cache.protected_size())  # fmt: skip
        if key == self._last_key and now - self._last_at < REPLAN_S:
            self.stats.reused += 1  # nothing changed since the last plan: keep it
            return None if self._last_order is None else list(self._last_order)
        self.held_rids = frozenset()
        if self.budget_ms and self.credit <= 0:
            self.stats.over_budget += 1
            self.export()
            return None  # SGLang's order this round; the last ranks keep the prompts
        self._last_key, self._last_at, self._last_order = key, now, None
        self.cache = cache
        planned = self.plan(waiting, self.in_flight(waiting, running), now)
        if planned is None:
            return None
        order, held = planned
        self._last_order = order
        self.stats.rounds += 1
        self.stats.held += len(held)
        self.stats.reordered += any(a is not b for a, b in zip(order, waiting, strict=True))
        self.credit -= self.stats.charge(start)
        self.export()
        self.log_stats(self.stats.rounds)
        return order

    def log_stats(self, count: int) -> None:
        """Logs :meth:`Stats.line` at the ``count``-th planned round when ``count`` is a
        power of two or a multiple of :data:`STATS_EVERY` (1, 2, 4, 8, 16, 20, 32, 40, ...)."""
        if count & (count - 1) == 0 or count % STATS_EVERY == 0:
            logger.info(self.stats.line())

    def in_flight(self, waiting: list, running: Sequence) -> Sequence:
        """``running`` and, while SGLang prefills it in chunks, the chunked request: it is
        in neither the queue nor the batch, in flight and not finished."""
        chunked = self.chunked_req
        if (
            chunked is not None
            and not chunked.finished()
            and not any(r is chunked for r in (*waiting, *running))
        ):
            return [*running, chunked]
        return running

    def plan(self, waiting: list, running: Sequence, now: float) -> tuple[list, list] | None:
        """One plan: the requests read, the State built, the policy's decision, the
        eviction ranks and this round's hold-backs set; (queue order, held requests), or
        None when no request carries TOPAS metadata."""
        obs = observe(waiting, running, self.releases, self._memo)
        self._note_finished(obs)
        return self.plan_observed(obs, waiting, running, now)

    def plan_observed(
        self, obs: Observation, waiting: list, running: Sequence, now: float
    ) -> tuple[list, list] | None:
        """:meth:`plan` for the round ``obs`` observed (``waiting`` and ``running``)."""
        if not obs.requests:
            self.ranks = {}  # no workflow in flight: no prompt has a known next use
            return None
        state = self._state(obs, now)
        policy = self._policy_for(state)
        decision = policy.decide(state)
        self._set_ranks(policy, state, decision)
        order, held = queue_order(waiting, obs, decision, idle=not running)
        self.held_rids = frozenset(r.rid for r in held)
        return order, held

    def _earn(self) -> None:
        """The time budget (a token bucket): every scheduling round earns ``budget_ms``,
        saved up to :data:`BURST_ROUNDS` rounds' worth; a plan spends what it took. A round
        that finds the budget overspent keeps SGLang's order, so the plugin's mean cost per
        round stays near ``budget_ms`` however large the queue. The budget reads the wall
        clock, so which rounds are planned can differ between runs (decisions do not)."""
        earn = self.budget_ms / 1e3
        self.credit = min(self.credit + earn, BURST_ROUNDS * earn)

    def export(self) -> None:
        """Bring SGLang's metrics up to date with :attr:`stats` (with --enable-metrics)."""
        if self.exporter is not None:
            self.exporter.update(self.stats)

    # ------------------------------------------------------------------ TP ranks

    def rank_link(self) -> RankLink | None:
        """This scheduler's TP group (:mod:`topas_sglang.ranks`), found at first use, when
        SGLang has published it; None with one rank. A rank that follows exports no
        metrics: rank 0's are the server's."""
        if isinstance(self.link, str):  # UNRESOLVED
            self.link = sglang_link()
            if self.link is not None and not self.link.leads:
                self.exporter = None
        return self.link  # type: ignore[return-value]

    def follows(self) -> bool:
        link = self.rank_link()
        return link is not None and not link.leads

    def agree(self, link: RankLink, waiting: list, order: list | None) -> list | None:
        """Rank 0's queue order for this round on every rank: rank 0 sends ``order`` (what
        it planned; None for SGLang's order), its hold-backs and eviction ranks; another
        rank takes them and returns its own ``waiting`` in rank 0's order."""
        if link.leads:
            link.share(word(order, self.held_rids, self.ranks))
            return order
        w = link.share(None)
        self.held_rids, self.ranks = w.held, dict(w.ranks)
        self.stats.followed += 1
        return apply_order(waiting, w)

    def agree_retraction(self, link: RankLink, order: list[int], n: int) -> list[int]:
        """Rank 0's retraction order (indices into a batch of ``n``) on every rank."""
        if link.leads:
            link.share(order)
            return order
        self.stats.followed += 1
        return check_retraction(link.share(None), n)

    def retraction_order(self, reqs: Sequence, order: list[int], now: float) -> list[int]:
        """SGLang's retraction ``order`` (indices into ``reqs``, keep-first: the last is
        retracted first) with the tagged requests' slots refilled by the policy's
        retraction order."""
        if self.cache is None:  # no round planned yet: nothing known about the tree
            return order
        start = clocks()
        kept = self.keep_first(reqs, now)
        if not kept:
            return order
        index = {id(r): i for i, r in enumerate(reqs)}
        out = refill(order, [index[id(r)] for r in kept], key=int)
        self.stats.retraction_orders += 1
        self.stats.charge(start)
        self.export()
        return out

    def keep_first(self, reqs: Sequence, now: float) -> list:
        """The tagged requests of ``reqs`` (a running batch) in the policy's retraction
        order, keep-first (the last is retracted first); empty when none is tagged."""
        obs = observe([], reqs, dict(self.releases))
        if not obs.requests:
            return []
        state = self._state(obs, now, Observer(self.observer.stamps))  # not the rounds' one
        victims = self._policy_for(state).retraction_order(state, list(obs.reqs))
        return [obs.reqs[ref] for ref in reversed(victims)]

    # ------------------------------------------------------------------ observation

    def stage_finished(self, req: Any) -> None:
        """SGLang's finish signal: ``req`` completed (not aborted, not retracted) and its KV
        was released. A request without TOPAS metadata is not ours to note."""
        try:
            meta = metadata(req)
        except MetadataError:
            return
        if self.follows():  # rank 0 plans and keeps the books
            self.stats.finished += 1
            return
        self.finished.setdefault(meta.task.id, set()).add(meta.stage)
        self.task_size[meta.task.id] = len(meta.task.stages)
        self._signalled.add(meta.task.id)
        self.stats.finished += 1
        self.export()

    def _note_finished(self, obs: Observation) -> None:
        """Counts the stages signalled finished that are seen again (the client sent one
        twice), which are then in flight, not finished; forgets tasks done and gone."""
        for tid in self.finished.keys() & obs.tasks.keys():
            done = self.finished[tid]
            back = [sid for sid in done if (tid, sid) in obs.reqs]
            done.difference_update(back)
            self.stats.reappeared += len(back)
        active = set(obs.tasks)
        for tid in (self._active | self._signalled) - active:  # left the view, or signalled
            if len(self.finished.get(tid, ())) >= self.task_size.get(tid, 0):
                self._forget(tid)  # every stage done
        if len(self.releases) > MAX_TRACKED_TASKS:  # aborted tasks never finish
            for tid in self.releases.keys() - active:
                self._forget(tid)
        self._active, self._signalled = active, set()
        if obs.errors:
            if not self.stats.malformed:
                logger.warning(
                    "TOPAS metadata not understood, scheduled as SGLang would: %s "
                    "(logged once; Stats.malformed counts them)",
                    obs.errors[0],
                )
            self.stats.malformed += len(obs.errors)

    def _forget(self, tid: str) -> None:
        self._drop_needs(tid)
        for d in (self.finished, self.releases, self.task_size, self._noted):
            d.pop(tid, None)

    def _state(
        self,
        obs: Observation,
        now: float,
        observer: Observer | None = None,
        finished: Mapping[str, set[str]] | None = None,
    ) -> State:
        """The State of this round, built by ``observer`` (default: the rounds' own, which
        changes its state in place from round to round), with the stages ``finished``
        (default: those SGLang signalled finished)."""
        for agent, req in obs.speakers.items():
            if agent not in self.prompt_ids:  # the agent's prompt: its requests' first ids
                n = obs.prefix_tokens[agent]
                self.prompt_ids[agent] = array("q", list(req.origin_input_ids[:n]))
        self.prefix_tokens.update(obs.prefix_tokens)
        tasks = obs.tasks
        for tid, task in tasks.items():
            if self._noted.get(tid) is task:
                continue  # its agents are noted (the adapter shares one Task per task)
            if tid in self._noted:  # another DAG under a known id: its needs are stale
                self._drop_needs(tid)
            self._noted[tid] = task
            self.task_size[tid] = len(task.stages)
            for x in task.stages:  # an agent nobody told the length of: a 0-token prompt
                self.prefix_tokens.setdefault(x.agent, 0)
        server = self._server_spec()
        resident, on_host = self._residency()
        done = self.finished if finished is None else finished
        return (observer or self.observer).state(
            server,
            self.prefix_tokens,
            obs.requests,
            resident,
            now,
            self._need_rule(tasks, server.kv_capacity_tokens),
            {tid: stages for tid, stages in done.items() if tid in tasks},
            on_host=on_host,
        )

    def _need_rule(self, tasks: dict[str, Any], capacity: int) -> KvNeed:
        """What SGLang's PrefillAdder reserves for a stage (:func:`topas.kv.reservation`),
        remembered between rounds for stages with nothing generated (every queued stage but
        a retracted one; a policy asks for each many times a round). The memory is kept
        while the prompt lengths are unchanged, and per task while its Task is."""
        prompts = frozenset(self.prefix_tokens.items())
        if prompts != self._needs_for:
            self._needs, self._needs_for = {}, prompts
        rule = sglang_kv_need(
            lambda ref: tasks[ref[0]].stage_by_id[ref[1]],
            lambda agent: self.prefix_tokens.get(agent, 0),
            capacity,
        )
        needs = self._needs

        def need(ref: tuple[str, str], generated: int) -> int:
            if generated:
                return rule(ref, generated)
            n = needs.get(ref)
            if n is None:
                n = needs[ref] = rule(ref, 0)
            return n

        return need

    def _drop_needs(self, tid: str) -> None:
        task = self._noted.get(tid)
        for x in task.stages if task is not None else ():
            self._needs.pop((tid, x.id), None)

    def _server_spec(self) -> ServerSpec:
        if self._server is None:
            capacity = int(self.cache.token_to_kv_pool_allocator.size)
            slots = int(self.cache.req_to_token_pool.size)
            self._server = ServerSpec(
                kv_capacity_tokens=capacity,
                chunk_tokens=_chunk_tokens(),
                max_running=slots,
                prefix_load=HOST_TIER.host_load() if self._hicache() else RecomputeLoad(),
            )
        return self._server

    def _hicache(self) -> bool:
        """Whether the cache has a host tier (SGLang's HiCache, ``--enable-hierarchical-cache``)."""
        return bool(getattr(self.cache.tree_core, "enable_hicache", False))

    def _residency(self) -> tuple[list[str], list[str] | None]:
        """The agents whose whole prompt is cached on the device (their prompt nodes are
        noted), and, where the cache has a host tier, those whose prompt is whole in device
        or host memory (None without one): a prompt evicted to the host is a swap away,
        not absent."""
        tree = self.cache.tree_core
        page = max(1, int(getattr(self.cache, "page_size", 1)))
        make_key = self.key_factory
        hicache = self._hicache()
        self.prompt_nodes = {}
        device, host = [], []
        for agent, ids in self.prompt_ids.items():
            need = len(ids) // page * page
            if need == 0 or make_key is None:
                continue
            key = make_key(ids)
            matched, node, _ = tree.match_full_device_prefix(key)
            if matched >= need:
                device.append(agent)
                self.prompt_nodes[agent] = node
            if hicache and (matched >= need or host_prefix_len(tree, key, page) >= need):
                host.append(agent)
        return device, (host if hicache else None)

    def _policy_for(self, state: State, stream: str = "rounds") -> Policy:
        """The policy of a stream of states (``rounds``: the rounds' own; another name for
        states of another kind, which keep their own policy, its incremental analyses and
        its service model), rebuilt when an agent appears or its prompt length changes (the
        policy's tables are per agent)."""
        agents = frozenset((a, p.tokens) for a, p in state.prefixes.items())
        policy, known = self._policies.get(stream, (None, frozenset()))
        if policy is None or agents != known:
            policy = make_policy(self.policy_spec)
            policy.reset(PolicyContext(server=self._server_spec(), timing="calibrated"))
            self._policies[stream] = (policy, agents)
        return policy

    def _set_ranks(self, policy: Policy, state: State, decision: Decision) -> None:
        """Eviction ranks of the agents' prompt nodes: those the decision evicts first
        (class 0), every other node by LRU (class 1, not set here), the rest of the agents'
        prompts last (class 2), least worth keeping first."""
        order = policy.eviction_order(state)
        rank = {a: i for i, a in enumerate(order)}
        drop = set(decision.evict)
        self.ranks = {
            node: (0,) if agent in drop else (2, rank.get(agent, len(order)))
            for agent, node in self.prompt_nodes.items()
        }


def queue_order(waiting: list, obs: Observation, decision: Decision, idle: bool):  # type: ignore[no-untyped-def]
    """``waiting`` with its tagged requests in the decision's order (admitted first, in
    prefill order; then the others in their SGLang order) and the held ones at the tail.
    Untagged requests keep their places. ``obs`` is the observation of this very list
    (:func:`topas_sglang.adapter.observe`), whose positions it reads.

    ``idle``: nothing is running. Then holding back is not allowed unless the decision
    admits something, or the server would idle while requests wait.
    """
    reqs, pos = obs.reqs, obs.queued
    admit = [ref for ref in decision.admit if ref in reqs]
    held = [ref for ref in decision.held if ref in reqs] if admit or not idle else []
    first = [pos.get(ref, -1) for ref in admit]  # positions in `waiting`
    last = [pos.get(ref, -1) for ref in held]
    taken = {*first, *last}
    if -1 in taken or len(taken) != len(first) + len(last):
        raise ValueError("queue_order: an admitted or held request is not queued, or twice")
    seen = map(waiting.__getitem__, first + last)
    if not all(map(operator.is_, seen, map(reqs.__getitem__, admit + held))):
        raise ValueError("queue_order: the waiting list is not the one observed")
    order = list(waiting)
    if not taken:
        return order, []
    gone = set(last)
    slots = [i for i in pos.values() if i not in gone] if gone else pos.values()
    fill = itertools.chain(first, (i for i in pos.values() if i not in taken))
    for slot, i in zip(slots, fill, strict=True):  # the tagged, unheld places
        order[slot] = waiting[i]
    if not gone:
        return order, []
    out = [waiting[i] for i in last]
    return [r for i, r in enumerate(order) if i not in gone] + out, out


def refill(seq: list, ranked: list, key: Callable[[Any], Any] = id) -> list:
    """``seq`` with the positions of ``ranked``'s members (matched by ``key``) filled,
    in order, by ``ranked``: the other members keep their places."""
    slots = set(map(key, ranked))
    it = iter(ranked)
    out = [next(it) if key(x) in slots else x for x in seq]
    if Counter(map(key, out)) != Counter(map(key, seq)):
        raise ValueError("refill: the ranked items are not the slotted members")
    return out


def host_prefix_len(tree: Any, key: Any, page: int) -> int:
    """Tokens of ``key`` whose KV the tree holds on the device or in host memory: a
    read-only walk, as SGLang's ``match_full_device_prefix`` does for the device (no LRU
    touch, no split), that also passes a node evicted from the device while it has a host
    copy (``evicted`` and ``backuped``, HiCache's own test in ``_match_prefix_helper``)."""
    key, _ = key.maybe_to_bigram_view(getattr(tree, "is_eagle", False))
    key = key.page_aligned(page)
    node, matched = tree.root_node, 0
    while len(key) > 0:
        child = node.children.get(key.child_key(page))
        if child is None or (child.evicted and not child.backuped):
            break
        n = child.key.match(key, page_size=page)
        matched += n
        if n == 0 or n < len(child.key):
            break
        node, key = child, key[n:]
    return matched


HOST_TIER = get_profile(DEFAULT_PROFILE)
"""The host link TOPAS prices a HiCache swap with: the default profile's (its ``B_swap``
and KV bytes per token, ``docs/calibration.md``), as the calibrated timing model's default
prices compute."""


def _chunk_tokens() -> int:
    try:
        from sglang.srt.server_args import get_global_server_args

        size = get_global_server_args().chunked_prefill_size
    except Exception:  # no server args published (a bare cache in a test)
        return DEFAULT_CHUNK
    return int(size) if size and size > 0 else DEFAULT_CHUNK
