"""Planning off the scheduler's thread: a planner process runs the controller's plans.

By default (``"offload"`` in ``--radix-eviction-policy-config``,
:data:`~topas_sglang.retention.DEFAULT_OFFLOAD`) the scheduler keeps an :class:`Offloaded`
controller. At a scheduling round it only

1. writes a *snapshot* of the round to a pipe, when the queue, the batch or the tree
   changed (or :data:`~topas_sglang.controller.REPLAN_S` passed): per tagged request a
   wire tuple ``(rid, metadata or None, queue time, running, generated)``, the metadata
   string only the first time the request is sent, and which agents' prompts the tree
   holds (the read-only match the synchronous controller makes);
2. reads the newest *plan* the planner has sent back, without waiting for it;
3. applies that plan to the waiting queue as it is now: the requests the plan ranks, in
   its order, among their own positions; requests it does not know (they arrived after
   its snapshot) and untagged ones keep their places; the ones it holds go to the tail,
   unless nothing runs and the plan would admit none of them.

A plan made at a change is applied until the next one. In a batch that only decodes, the
next change is a request finishing: its KV is freed, and its task's next stage arrives,
so the scheduler's own controller would then admit by a state the snapshot did not show.
So with :attr:`Offloaded.lookahead` (the default) the planner answers each snapshot with
two plans: one for the queue as it is, and one for the round after the predicted finish
(:func:`next_round`: the running requests fewest decode steps from their predicted
lengths finish, their tasks' ready stages are queued), in which those stages are named by
(task, stage). The scheduler applies the second once a request predicted to finish has
finished (:meth:`Plan.now`); a request it does not know is then ranked, or held, by its
stage (:func:`~topas_sglang.adapter.stage_ref`).

The planner process (``python -m topas_sglang.offload``, started at the first round)
keeps a :class:`Remote` controller, the synchronous :class:`~topas_sglang.controller.Controller`
with the tree's answers and the server's sizes given to it: the same observation, State,
policy and queue order, on stand-ins of SGLang's requests built from the wire tuples.
When several snapshots wait, it plans only the newest (finish signals are all applied, in
order). So a plan is one round old, or more when the planner falls behind; what it does
not know is left in SGLang's order. The scheduler sends no snapshot while one is still
unplanned, so it never waits on the pipe, and a retraction (rare) asks the planner and
waits for its answer for :data:`RETRACT_WAIT_S` at most, else SGLang's order stands.

The planner sees the requests as the scheduler saw them, so its decisions are what the
synchronous controller would decide on the same round (the predicted one's, on the round
predicted, when the prediction holds): determinism and the TP rule
(rank 0 plans, the other ranks take its order) are unchanged. If the planner process
dies, every later round keeps SGLang's order and the failure is logged once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import pickle
import select
import subprocess
import sys
import time
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import SimpleNamespace
from typing import Any

from topas.instance import ServerSpec, StageRef
from topas.observe import Observer, Request
from topas.workflow_metadata import KEY
from topas_sglang.adapter import Observation, observe, queued_at, raw_metadata, stage_ref
from topas_sglang.controller import REPLAN_S, Controller, clocks, refill

logger = logging.getLogger("topas_sglang")

RETRACT_WAIT_S = 0.5
"""How long a retraction waits for the planner's victim order before keeping SGLang's."""

PLANNER_CMD = ["-m", "topas_sglang.offload"]  # run by the scheduler's Python
NAP_S = 0.0002
NAP_FOR_S = 1.0
"""The planner waits for the next snapshot in naps of :data:`NAP_S`, for up to
:data:`NAP_FOR_S` after its last message, then blocks on the pipe. A write to a pipe that a
process sleeps on costs the writer the wake-up of that process (on this project's VMs about
0.1-0.4 ms, measured 2026-12-03); a napping planner is woken by its own timer instead."""

PIPE_BYTES = 1 << 20  # asked of the kernel for each pipe (Linux F_SETPIPE_SZ), best effort

Wire = tuple[str, "str | None", float, bool, int]
"""(rid, TOPAS metadata string (None: sent before), queue entry time, running, generated)."""


# ============================================================================ scheduler side


@dataclass
class Plan:
    """What the planner decided for one snapshot, on the scheduler's side."""

    seq: int  # the snapshot's number
    reqs: list  # the snapshot's requests (waiting, then running): the plan's ids stay theirs
    rank: dict[int, int]  # id(request) -> place in the plan's queue order (unheld ones)
    held: frozenset[int]  # id(request) of those held back
    ranks: dict[str, tuple]  # agent -> its prompt's eviction rank
    cpu_s: float  # the planner's CPU time for it
    ahead: dict[StageRef, int] = dataclasses.field(default_factory=dict)  # a stage the
    # planner predicts to be queued (lookahead) -> its place in the order
    ahead_held: frozenset[StageRef] = frozenset()  # ... those of them held back
    ending: tuple = ()  # requests predicted to finish at the snapshot's forward pass ...
    branch: Plan | None = None  # ... and the plan for the round after it if they did
    # (lookahead; the same eviction ranks)

    def now(self) -> Plan:
        """The plan for the queue as it is now: :attr:`branch` once a request of
        :attr:`ending` has finished (the forward pass was the decode step predicted)."""
        if self.branch is not None and any(r.finished() for r in self.ending):
            return self.branch
        return self


def plan_of(seq: int, reqs: list, order: list, held: list, ranks: dict, cpu_s: float) -> Plan:
    """The :class:`Plan` of a planner's answer, whose ``order`` and ``held`` name requests
    by their place in ``reqs`` or, predicted ones, by their (task, stage)."""
    rank, ahead = {}, {}
    for k, x in enumerate(order):
        if x.__class__ is int:
            rank[id(reqs[x])] = k
        else:
            ahead[tuple(x)] = k
    out = frozenset(id(reqs[x]) for x in held if x.__class__ is int)
    later = frozenset(tuple(x) for x in held if x.__class__ is not int)
    return Plan(seq, reqs, rank, out, ranks, cpu_s, ahead, later)


@dataclass
class Offloaded(Controller):
    """A :class:`~topas_sglang.controller.Controller` whose plans are made in a planner
    process (see the module docstring). The time budget does not apply: the scheduler's
    share of a round is a pass over the queue."""

    lookahead: bool = True  # the planner plans for the round its plan is applied in

    def __post_init__(self) -> None:
        super().__post_init__()
        self._to: Connection | None = None  # scheduler -> planner
        self._from: Connection | None = None
        self._ready: Any = None  # a select.poll() on the planner's end of the pipe
        self._proc: subprocess.Popen | None = None
        self._dead = False
        self._wired: WireMemo = {}  # the requests of the last snapshot (the planner has
        # their metadata)
        self._snapshot: tuple[int, list] = (0, [])  # the last one sent: (seq, requests)
        self._changed = 0  # rounds that found the queue, batch or tree changed
        self._sent_at = 0  # ... when the last snapshot was sent
        self._seq = 0  # snapshots and retraction questions sent
        self._acked = 0  # the newest of them answered
        self._plan: Plan | None = None
        self._fresh = False  # a plan arrived since the order was last applied
        self._early: list[tuple] = []  # finish signals before the planner started

    # ------------------------------------------------------------------ rounds

    def plan_round(self, cache: Any, waiting: list, running: Sequence, now: float) -> list | None:
        start = clocks()
        self.cache = cache
        running = self.in_flight(waiting, running)
        # The queue as a set: the order the last plan gave it, which SGLang's stable sort
        # keeps, is no reason to plan again (the planner saw the order before it).
        key = (frozenset(map(id, waiting)), tuple(map(id, running)), cache.evictable_size(),
               cache.protected_size())  # fmt: skip
        if self._link() is None:
            self.held_rids, self.ranks = frozenset(), {}
            return None
        self._receive()
        changed = key != self._last_key or now - self._last_at >= REPLAN_S
        self._changed += changed
        if not changed and not self._fresh:
            self.stats.reused += 1
            return None if self._last_order is None else list(self._last_order)
        if changed and self._seq == self._acked:  # the planner has caught up: send
            self._last_key, self._last_at = key, now
            self._send_snapshot(waiting, running, now)
        order = self._apply(waiting, running)
        self._last_order = order
        self.stats.charge(start)
        self.export()
        return order

    def _send_snapshot(self, waiting: list, running: Sequence, now: float) -> None:
        wires, reqs, self._wired = wire_requests(waiting, running, self._wired)
        if not wires:
            return
        device, host = self._residency()
        self._seq += 1
        self._snapshot = (self._seq, reqs)
        self._sent_at = self._changed
        self.stats.rounds += 1
        self._post(("plan", self._seq, now, wires, device, host))

    def _apply(self, waiting: list, running: Sequence) -> list | None:
        """``waiting`` in the newest plan's order (see the module docstring)."""
        plan = self._plan
        self._fresh = False
        if plan is None:
            return None
        plan = plan.now()
        self.stats.ahead += plan is not self._plan
        order, out, ranked = self._arrange(waiting, plan, hold=True)
        if out and not running and not ranked:  # hold nothing while the server would idle
            order, out, ranked = self._arrange(waiting, plan, hold=False)
        self.held_rids = frozenset(r.rid for r in out)
        self.stats.held += len(out)
        self.stats.reordered += any(a is not b for a, b in zip(order, waiting, strict=True))
        last = (2, len(plan.ranks))  # an agent the plan did not rank: after those it did
        self.ranks = (
            {node: plan.ranks.get(agent, last) for agent, node in self.prompt_nodes.items()}
            if plan.ranks
            else {}  # the plan saw no workflow in flight
        )
        return order

    def _arrange(self, waiting: list, plan: Plan, hold: bool) -> tuple[list, list, int]:
        """(``waiting`` with the requests ``plan`` ranks in its order among their own
        places and, with ``hold``, those it holds at the tail; the held; how many it
        ranked). A request the snapshot did not have is ranked or held by its stage when
        the plan predicted that stage (lookahead)."""
        rank, held, ahead = plan.rank, plan.held, plan.ahead or plan.ahead_held
        keep, out, ranked = [], [], []  # ranked: (place in the plan, place in keep)
        for r in waiting:
            i = id(r)
            k = rank.get(i)
            if k is None:
                if i in held:
                    if hold:
                        out.append(r)
                        continue
                elif ahead:  # not in the snapshot: a stage the plan predicted?
                    ref = stage_ref(r)
                    if ref in plan.ahead_held:
                        if hold:
                            out.append(r)
                            continue
                    else:
                        k = plan.ahead.get(ref)  # type: ignore[arg-type]
            if k is not None:
                ranked.append((k, len(keep)))
            keep.append(r)
        order = list(keep)
        slots = [j for _, j in ranked]
        ranked.sort()
        for slot, (_, j) in zip(slots, ranked, strict=True):
            order[slot] = keep[j]
        return order + out, out, len(ranked)

    # ------------------------------------------------------------------ signals

    def stage_finished(self, req: Any) -> None:
        raw = raw_metadata(req)
        if raw is None:
            return
        self.stats.finished += 1
        if self.follows() or self._dead:
            pass
        elif self._to is None:  # no round yet: the planner starts at the first
            self._early.append(("done", req.rid, raw))
        else:
            self._post(("done", req.rid, raw))
        self.export()

    def retraction_order(self, reqs: Sequence, order: list[int], now: float) -> list[int]:
        if self._plan is None or self._link() is None:  # no plan yet: nothing known
            return order
        start = clocks()
        wires, _, _ = wire_requests((), reqs, {})
        if not wires:
            return order
        self._seq += 1
        seq = self._seq
        self._post(("retract", seq, now, wires))
        kept = self._await_retraction(seq)
        self.stats.charge(start)
        if kept is None:
            return order
        index = {r.rid: i for i, r in enumerate(reqs)}
        out = refill(order, [index[rid] for rid in kept if rid in index], key=int)
        self.stats.retraction_orders += 1
        self.export()
        return out

    # ------------------------------------------------------------------ the pipe

    def _link(self) -> Connection | None:
        """The pipe to the planner, which is started at the first use; None once it died."""
        if self._dead:
            return None
        if self._to is None:
            try:
                self._start()
            except OSError as e:
                self._died(e)
                return None
        return self._to

    def _start(self) -> None:
        to_child, from_child = os.pipe(), os.pipe()
        for fd in (*to_child, *from_child):
            _widen(fd)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self._proc = subprocess.Popen(
            [sys.executable, *PLANNER_CMD, str(to_child[0]), str(from_child[1])],
            pass_fds=(to_child[0], from_child[1]),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        os.close(to_child[0])
        os.close(from_child[1])
        self._to = Connection(to_child[1], readable=False)
        self._from = Connection(from_child[0], writable=False)
        self._ready = select.poll()  # one poll(2) call per check (Connection.poll builds
        self._ready.register(from_child[0], select.POLLIN)  # a selector each time)
        self._to.send(("init", self.policy_spec, self._server_spec(), self.lookahead))
        for msg in self._early:
            self._to.send(msg)
        self._early = []

    def _post(self, msg: tuple) -> None:
        try:
            assert self._to is not None
            self._to.send_bytes(pickle.dumps(msg, pickle.HIGHEST_PROTOCOL))  # as send()
        except (OSError, EOFError, AssertionError) as e:
            self._died(e)

    def _receive(self) -> None:
        """Takes every message the planner has sent, keeping the newest plan."""
        conn = self._from
        try:
            while conn is not None and self._ready.poll(0):  # readable, or the planner gone
                self._take(conn.recv())
        except (OSError, EOFError) as e:
            self._died(e)

    def _take(self, msg: tuple) -> Any:
        kind = msg[0]
        if kind == "plan":
            _, seq, order, held, ranks, learn, branch, cpu_s = msg
            sent, reqs = self._snapshot
            if seq == sent:  # else a plan for a snapshot before the last: none is sent so
                plan = plan_of(seq, reqs, order, held, ranks, cpu_s)
                if branch is not None:
                    ending, order, held = branch
                    plan.ending = tuple(reqs[i] for i in ending)
                    plan.branch = plan_of(seq, reqs, order, held, ranks, 0.0)
                self._adopt(plan, learn)
            self._acked = max(self._acked, seq)
        elif kind == "retract":
            self._acked = max(self._acked, msg[1])
        elif kind == "error":
            self._acked = max(self._acked, msg[1])
            self.stats.fallbacks += 1
            _warn_once(f"TOPAS planner failed on round {msg[1]} ({msg[2]}); SGLang's order")
        return msg

    def _adopt(self, plan: Plan, learn: dict[str, tuple[int, int]]) -> None:
        self._plan, self._fresh = plan, True
        for agent, (i, n) in learn.items():  # new agents: their prompts' token ids, from a
            ids = plan.reqs[i].origin_input_ids[:n]  # request of theirs
            self.prompt_ids[agent] = array("q", list(ids))
        self.stats.plans += 1
        self.stats.planner_s += plan.cpu_s
        self.stats.lag += self._changed - self._sent_at  # changed rounds it came too late for
        self.log_stats(self.stats.plans)

    def settle(self, timeout: float = 10.0) -> bool:
        """Waits until the planner has answered everything sent (tests and benches that
        compare plans); False if it did not within ``timeout`` seconds."""
        deadline = time.perf_counter() + timeout
        try:
            while self._acked < self._seq and self._from is not None:
                if not self._from.poll(max(0.0, deadline - time.perf_counter())):
                    return False
                self._take(self._from.recv())
        except (OSError, EOFError) as e:
            self._died(e)
        return self._acked >= self._seq

    def _await_retraction(self, seq: int) -> list[str] | None:
        conn = self._from
        deadline = time.perf_counter() + RETRACT_WAIT_S
        try:
            while conn is not None and conn.poll(max(0.0, deadline - time.perf_counter())):
                msg = self._take(conn.recv())
                if msg[0] == "retract" and msg[1] == seq:
                    return msg[2]
                if msg[0] == "error" and msg[1] == seq:
                    return None
        except (OSError, EOFError) as e:
            self._died(e)
        return None

    def _died(self, e: BaseException) -> None:
        if not self._dead:
            logger.warning(
                "TOPAS planner process unavailable (%s: %s); SGLang's own order from now on",
                type(e).__name__,
                e,
            )
        self._dead = True
        self.stats.fallbacks += 1
        self.held_rids, self.ranks, self._plan = frozenset(), {}, None

    def close(self) -> None:
        """Ends the planner process (it also ends by itself when the scheduler's end of
        the pipe closes)."""
        for conn in (self._to, self._from):
            if conn is not None:
                conn.close()
        self._to = self._from = None
        if self._proc is not None:
            self._proc.wait(timeout=10)
            self._proc = None
        self._dead = True


WireMemo = dict[int, tuple[Any, str, float]]
"""id(request) -> (the request, its rid, its queue entry time): the requests the planner
was last sent, whose metadata it has."""


def wire_requests(
    waiting: Sequence, running: Sequence, memo: WireMemo
) -> tuple[list[Wire], list, WireMemo]:
    """The wire tuples of the tagged, unfinished requests (waiting first, in queue order),
    with the metadata string only for requests not in ``memo``; the requests, in the same
    order; and the memo of these."""
    wires: list[Wire] = []
    reqs: list = []
    seen: WireMemo = {}
    for queue, is_running in ((waiting, False), (running, True)):
        for req in queue:
            if req.finished():
                continue
            hit = memo.get(id(req))
            if hit is not None and hit[0] is req:
                _, rid, t = hit
                raw = None
            else:
                raw = raw_metadata(req)
                if raw is None:
                    continue  # untagged: SGLang's order
                rid = req.rid
                t = queued_at(req)  # as the synchronous controller reads it
                hit = (req, rid, t)
            seen[id(req)] = hit
            out = req.output_ids
            wires.append((rid, raw, t, is_running, len(out) if out else 0))
            reqs.append(req)
    return wires, reqs, seen


def _widen(fd: int) -> None:
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except OSError:
        pass  # the kernel's default size: a large snapshot then waits for the planner


_warned: set[str] = set()


def _warn_once(text: str) -> None:
    head = text.split(" on round ")[0]
    if head not in _warned:
        _warned.add(head)
        logger.warning("%s (logged once)", text)


# ============================================================================ planner side


class WireReq:
    """The planner's stand-in for an SGLang ``Req``: the attributes the adapter reads."""

    __slots__ = ("rid", "sampling_params", "time_stats", "output_ids", "origin_input_ids")

    def __init__(self, rid: str, raw: str) -> None:
        self.rid = rid
        self.sampling_params = SimpleNamespace(custom_params={KEY: raw})
        self.time_stats = SimpleNamespace(wait_queue_entry_time=0.0)
        self.output_ids: range = range(0)
        self.origin_input_ids: tuple = ()

    def finished(self) -> bool:
        return False


@dataclass
class Remote(Controller):
    """The controller in the planner process: the tree's answers (which prompts are
    cached) and the server's sizes come from the scheduler instead of a cache."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.link = None  # one rank: the scheduler process has settled who plans
        self.cache = True  # no cache here: its answers come with each snapshot
        self.server: ServerSpec | None = None
        self.device: list[str] = []
        self.host: list[str] | None = None
        self.reqs: dict[str, WireReq] = {}  # rid -> its stand-in, kept while it is sent
        self.speakers: dict[str, Any] = {}
        self.lookahead = True  # also plan for the round after the snapshot (plan_ahead)
        self.ahead_observer = Observer(self.observer.stamps)  # that round's states

    def exports(self) -> bool:
        return False  # the scheduler's controller exports (and this process has no SGLang)

    def _server_spec(self) -> ServerSpec:
        assert self.server is not None, "the planner was not initialised"
        return self.server

    def _residency(self) -> tuple[list[str], list[str] | None]:
        self.prompt_nodes = {a: a for a in self.device}  # ranks keyed by agent
        return list(self.device), self.host

    def _state(self, obs, now, observer=None, finished=None):  # type: ignore[no-untyped-def]
        self.speakers = obs.speakers
        return super()._state(obs, now, observer, finished)

    def register(self, wires: Sequence[Wire]) -> None:
        """Stand-ins for the requests whose metadata ``wires`` carry."""
        for rid, raw, *_ in wires:
            if raw is not None:
                self.reqs[rid] = WireReq(rid, raw)

    def requests(self, wires: Sequence[Wire]) -> tuple[list[WireReq], list[WireReq]]:
        waiting, running = [], []
        for rid, _, t, is_running, generated in wires:
            req = self.reqs[rid]
            req.time_stats.wait_queue_entry_time = t
            if len(req.output_ids) != generated:
                req.output_ids = range(generated)
            (running if is_running else waiting).append(req)
        return waiting, running

    def plan_snapshot(self, seq: int, now: float, wires: Sequence[Wire], device, host) -> tuple:  # type: ignore[no-untyped-def]
        """The plan for one snapshot, with requests named by their place in ``wires``: the
        queue order of the unheld ones, the held ones, the agents' eviction ranks, and for
        each agent new to the planner a request of its and its prompt length (the
        scheduler reads the prompt's token ids from it). With :attr:`lookahead` the plan
        is the decision for the round after the snapshot (:func:`next_round`), and the
        stages it predicts to be queued then are named by their (task, stage) instead."""
        start = time.thread_time()
        self.device, self.host = device, host
        waiting, running = self.requests(wires)
        place = {id(r): i for i, r in enumerate((*waiting, *running))}
        self.reqs = {r.rid: r for r in (*waiting, *running)}
        known = set(self.prompt_ids)
        obs = observe(waiting, running, self.releases, self._memo)
        self._note_finished(obs)
        planned = self.plan_observed(obs, waiting, running, now)
        learn = {
            a: (place[id(self.speakers[a])], self.prefix_tokens.get(a, 0))
            for a in sorted(self.prompt_ids.keys() - known)
            if id(self.speakers.get(a)) in place
        }
        if planned is None:
            return ("plan", seq, [], [], {}, learn, None, time.thread_time() - start)
        name = lambda r: r if r.__class__ is tuple else place[id(r)]  # noqa: E731
        queue, out = planned
        order = [name(r) for r in queue[: len(queue) - len(out)]]
        held = [name(r) for r in out]
        branch = None
        if self.lookahead:
            ahead = self.plan_ahead(obs, waiting, now)
            if ahead is not None:
                ending, queue, out = ahead
                branch = ([name(r) for r in ending], [name(r) for r in queue],
                          [name(r) for r in out])  # fmt: skip
        ranks = dict(self.ranks)
        return ("plan", seq, order, held, ranks, learn, branch, time.thread_time() - start)

    def plan_ahead(self, obs: Observation, waiting: list, now: float) -> tuple | None:
        """The plan for the round after ``obs``'s if its forward pass is a decode step
        (:func:`next_round`), or None if no request is predicted to finish in it: (the
        running stand-ins predicted to finish, the queue order, the held). Members are
        stand-ins or, for stages predicted to be queued, their (task, stage); the unheld
        order is the decision's admissions, then the other queued stand-ins in their
        order. The eviction ranks and hold-backs stay the snapshot's own plan's. Predicted
        states have a policy of their own (an ``ahead`` stream): the rounds' policy keeps
        its incremental analyses, and its service model learns real finishes only."""
        ahead, finished, ending = next_round(obs, self.finished, now)
        if not ending:
            return None
        state = self._state(ahead, now, self.ahead_observer, finished)
        decision = self._policy_for(state, "ahead").decide(state)  # its own stream
        member = lambda ref: obs.reqs.get(ref, ref)  # noqa: E731
        admit = [member(ref) for ref in decision.admit]
        held = [member(ref) for ref in decision.held]
        taken = {id(r) for r in (*admit, *held)}
        queue = admit + [r for r in waiting if id(r) not in taken]
        return [obs.reqs[r.task.id, r.stage] for r in ending], queue, held

    def retract(self, seq: int, now: float, wires: Sequence[Wire]) -> tuple:
        reqs = [WireReq(rid, raw or "") for rid, raw, *_ in wires]
        for req, (_, _, t, _, generated) in zip(reqs, wires, strict=True):
            req.time_stats.wait_queue_entry_time, req.output_ids = t, range(generated)
        return ("retract", seq, [r.rid for r in self.keep_first(reqs, now)])

    def finish(self, rid: str, raw: str) -> None:
        self.stage_finished(WireReq(rid, raw))


def next_round(
    obs: Observation, finished: Mapping[str, set[str]], now: float
) -> tuple[Observation, dict[str, set[str]], list[Request]]:
    """``obs`` as predicted at the next round that finds a request finished, if the batch
    only decodes until then (a plan made at a change is applied until the next one): the
    running requests that are the fewest decode steps from their predicted output length
    finish, the others decode as many tokens; each stage of a finished request's task
    whose dependencies have then all finished, and that has no request yet, is queued at
    ``now``; a task with every stage finished leaves. Returns that observation (requests
    and tasks changed, the rest ``obs``'s), the finished stages then (``finished`` is not
    changed) and the requests predicted to finish (none: no running request is short of
    its predicted length)."""
    left = {id(r): r.task.stage_by_id[r.stage].output_tokens - r.generated
            for r in obs.requests if r.running}  # fmt: skip
    steps = min((n for n in left.values() if n > 0), default=0)
    if not steps:
        return obs, dict(finished), []
    done = dict(finished)
    requests: list[Request] = []
    ending: list[Request] = []
    for r in obs.requests:
        if r.running:
            if left[id(r)] == steps:
                tid = r.task.id
                done[tid] = {*done.get(tid, ()), r.stage}
                ending.append(r)
                continue
            r = dataclasses.replace(r, generated=r.generated + steps)
        requests.append(r)
    tasks = dict(obs.tasks)
    queued = set(obs.reqs)  # every stage with a request (obs's, and those queued here)
    for r in ending:
        task, gone = r.task, done[r.task.id]
        if len(gone) >= len(task.stages):
            tasks.pop(task.id, None)
            continue
        for x in task.stages:
            ref = (task.id, x.id)
            if x.id not in gone and ref not in queued and gone.issuperset(x.deps):
                queued.add(ref)
                requests.append(Request(task, x.id, r.release, now))
    return dataclasses.replace(obs, requests=requests, tasks=tasks), done, ending


def serve(inp: Connection, out: Connection) -> None:
    """The planner's loop: plans the newest snapshot of each batch of messages, applies
    every finish signal in order, answers every retraction; ends when the pipe closes."""
    kind, spec, server, lookahead = inp.recv()
    assert kind == "init", kind
    remote = Remote(policy_spec=spec, budget_ms=0)
    remote.server, remote.lookahead = server, lookahead
    idle_since = time.monotonic()
    while True:
        try:
            if not inp.poll():
                if time.monotonic() - idle_since < NAP_FOR_S:
                    time.sleep(NAP_S)  # the scheduler's write then wakes nobody
                    continue
                inp.poll(None)
            batch = [inp.recv()]
            while inp.poll():
                batch.append(inp.recv())
        except (EOFError, OSError):
            return
        idle_since = time.monotonic()
        last = max((i for i, m in enumerate(batch) if m[0] == "plan"), default=-1)
        for i, msg in enumerate(batch):
            try:
                if msg[0] == "done":
                    remote.finish(msg[1], msg[2])
                elif msg[0] == "plan":
                    remote.register(msg[3])
                    if i == last:
                        out.send(remote.plan_snapshot(*msg[1:]))
                elif msg[0] == "retract":
                    out.send(remote.retract(*msg[1:]))
            except Exception as e:  # noqa: BLE001 - reported; the scheduler keeps its order
                if msg[0] != "done":
                    out.send(("error", msg[1], f"{type(e).__name__}: {e}"))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="[topas planner] %(message)s")
    inp = Connection(int(args[0]), writable=False)
    out = Connection(int(args[1]), readable=False)
    try:
        serve(inp, out)
    except (EOFError, BrokenPipeError):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
