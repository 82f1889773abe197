"""A scheduler-in-the-loop replay on the CPU: SGLang decides, a timing model runs.

A workload (a ``topas-instance/1``) is pushed through SGLang 0.5.23's own scheduling
objects: ``SchedulePolicy.calc_priority`` orders the waiting queue, the scheduler's
``PrefillAdder`` class admits, a ``UnifiedRadixCache`` over real token pools matches,
caches, locks and evicts, and ``ScheduleBatch._get_decode_retraction_order`` picks
retraction victims: each one hooked by the plugin when it is loaded. What the GPU would
do is replaced by the calibrated timing model (:func:`topas.timing.iteration_s`): an
iteration is either one prefill batch (as SGLang runs without mixed chunks) or one
decode step of every running request.

The requests are the ones ``topas serve-bench`` sends (:func:`topas.serve_bench.
stage_payload`: the agent's prompt ids, fresh ids, ``max_new_tokens`` = the true output,
the TOPAS metadata); a stage is sent when its dependencies have finished, as the client
does. With ``eviction="lru"`` the plugin stays off (every hook passes SGLang's result
through): that is SGLang as it ships. The lifecycle follows the scheduler's
(``scheduler.py`` admission loop, ``release_kv_cache``, ``retract_decode``) without
chunked prefill, overlap scheduling, or speculative decoding.

With ``offload=True`` the plans are made in a planner process
(:mod:`topas_sglang.offload`). The replay then waits for the planner's answer after each
iteration, as the iteration's time on a GPU (the model's 10-100 ms) would give it: each
plan is applied one round late, as on a live server whose planner keeps up, and the
replay is deterministic. Without that wait the replay, which runs its iterations in
microseconds of CPU, would outrun the planner by tens of rounds.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

import torch
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, SchedulePolicy
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import (
    checkpoint_kv_cache,
    evict_from_tree_cache,
    release_kv_cache,
)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.sampling.sampling_params import SamplingParams

from topas.instance import Instance, StageRef
from topas.serve_bench import prefix_ids, stage_payload
from topas.timing import iteration_s, linear_cost
from topas_sglang import hooks
from topas_sglang.controller import Controller, Stats
from topas_sglang.offload import Offloaded
from topas_sglang.retention import controller_of

EPOCH = 1.0  # the replay clock starts here: SGLang reads a 0.0 queue time as "unset"
MAX_PREFILL_TOKENS = 16384  # SGLang's default --max-prefill-tokens


@dataclass
class LoopResult:
    """What one replay measured."""

    eviction: str
    jct: dict[str, float]  # task -> completion - arrival, seconds on the model's clock
    finished: list[StageRef] = field(default_factory=list)  # stages in finishing order
    iterations: int = 0
    retractions: int = 0
    prompt_tokens: int = 0  # agent-prompt tokens of admitted requests
    prompt_hits: int = 0  # ... found cached at admission
    stats: Stats | None = None  # the plugin's, when it was on

    @property
    def mean_jct(self) -> float:
        return sum(self.jct.values()) / max(1, len(self.jct))

    def quantile(self, q: float) -> float:
        xs = sorted(self.jct.values())
        return xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)] if xs else 0.0

    @property
    def hit_rate(self) -> float:
        return self.prompt_hits / max(1, self.prompt_tokens)


def make_cache(
    eviction: str = "topas",
    kv_tokens: int = 512,
    slots: int = 16,
    max_context: int = 4096,
    backend: str | None = None,
    budget_ms: float | None = None,
    offload: bool = False,
) -> UnifiedRadixCache:
    """A ``UnifiedRadixCache`` over CPU token pools, as the scheduler builds its own
    (``backend`` None: SGLang picks the tree core; the plugin's hook may override), with
    its TOPAS controller's time budget set to ``budget_ms`` (None: the plugin's default;
    0: off); with ``offload`` it plans in a planner process (:mod:`topas_sglang.offload`)."""
    rtp = ReqToTokenPool(size=slots, max_context_len=max_context, device="cpu",
                         enable_memory_saver=False)  # fmt: skip
    pool = MHATokenToKVPool(size=kv_tokens, page_size=1, dtype=torch.bfloat16, head_num=1,
                            head_dim=1, layer_num=1, device="cpu",
                            enable_memory_saver=False)  # fmt: skip
    alloc = TokenToKVPoolAllocator(size=kv_tokens, dtype=torch.bfloat16, device="cpu",
                                   kvcache=pool, need_sort=False)  # fmt: skip
    cache = UnifiedRadixCache(CacheInitParams(
        disable=False, req_to_token_pool=rtp, token_to_kv_pool_allocator=alloc, page_size=1,
        tree_components=(ComponentType.FULL,), eviction_policy=eviction,
        tree_core_backend=backend,
    ))  # fmt: skip
    controller = controller_of(cache)
    if controller is not None and offload is not isinstance(controller, Offloaded):
        kind = Offloaded if offload else Controller  # not the strategy's default
        controller = cache.tree_core.eviction_strategy.adopt(
            kind(policy_spec=controller.policy_spec, key_factory=controller.key_factory)
        )
    if controller is not None and budget_ms is not None:
        controller.budget_ms = budget_ms
    return cache


def payload_req(body: dict) -> Req:
    """The scheduler's ``Req`` for a ``/generate`` body (``topas serve-bench``'s payload)."""
    params = SamplingParams(**body["sampling_params"])
    params.normalize(None)
    ids = array("q", body["input_ids"])
    return Req(rid=body["rid"], origin_input_text="", origin_input_ids=ids, sampling_params=params)


def insert_prompt(cache: UnifiedRadixCache, tokens: list[int]) -> None:
    """Put ``tokens`` in the tree, as a finished request leaves its prompt."""
    value = cache.token_to_kv_pool_allocator.alloc(len(tokens))
    cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=value))


class CpuLoop:
    """One replay (see the module docstring). ``policy_spec`` is the plugin's policy with
    ``eviction="topas"`` (default: the plugin's own, ``topas-greedy``)."""

    def __init__(
        self,
        instance: Instance,
        eviction: str = "topas",
        schedule_policy: str = "lpm",
        kv_tokens: int | None = None,
        max_running: int | None = None,
        seed: int = 0,
        offload: bool = False,
        policy_spec: str | None = None,
    ) -> None:
        self.inst = instance
        self.eviction = eviction
        self.seed = seed
        server = instance.server
        self.cost = linear_cost(server)
        kv = kv_tokens or server.kv_capacity_tokens
        slots = max_running or server.max_running or 256
        self.prefixes = prefix_ids(instance, seed)
        longest = max(map(len, self.prefixes.values())) + max(
            s.input_tokens + s.output_tokens for t in instance.tasks for s in t.stages
        )
        # the replay's clock is simulated and charges no planning time: a wall-clock
        # budget would only add noise
        self.cache = make_cache(
            eviction, kv, slots, max_context=longest + 8, budget_ms=0, offload=offload
        )
        if policy_spec is not None and eviction == "topas":  # else the plugin's default
            controller_of(self.cache).policy_spec = policy_spec
        self.rtp = self.cache.req_to_token_pool
        self.alloc = self.cache.token_to_kv_pool_allocator
        self.policy = SchedulePolicy(schedule_policy, self.cache, False, False, False)
        self.adder_class = Scheduler.get_prefill_adder_class(None)
        self.slots = slots
        self.offload = offload
        self.t = 0.0
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.done: set[StageRef] = set()
        self.result = LoopResult(eviction=eviction, jct={})

    # ------------------------------------------------------------------ the run

    def run(self) -> LoopResult:
        saved = hooks.clock
        hooks.clock = lambda: EPOCH + self.t
        try:
            self._run()
        finally:
            hooks.clock = saved
        controller = controller_of(self.cache)
        self.result.stats = getattr(controller, "stats", None)
        if isinstance(controller, Offloaded):  # its planner process ends
            controller.close()
        return self.result

    def _run(self) -> None:
        arrivals = sorted(self.inst.tasks, key=lambda task: task.arrival)
        total = len(arrivals)
        while len(self.result.jct) < total:
            while arrivals and arrivals[0].arrival <= self.t:
                task = arrivals.pop(0)
                for s in task.stages:
                    if not s.deps:
                        self._send((task.id, s.id))
            if not (self.waiting or self.running):
                self.t = arrivals[0].arrival
                continue
            admitted = self._admit() if self.waiting else []
            if admitted:
                self._prefill(admitted)
            elif self.running:
                self._decode()
            else:  # nothing fits and nothing runs: wait for the next arrival
                if not arrivals:
                    raise RuntimeError(f"stuck at t={self.t:.3f}: nothing admissible")
                self.t = arrivals[0].arrival
            self.result.iterations += 1
            if self.offload:  # the planner has the iteration's time (module docstring)
                controller = controller_of(self.cache)
                if isinstance(controller, Offloaded):
                    controller.settle()

    def _send(self, ref: StageRef) -> None:
        """The client sends the stage's request (as ``topas serve-bench`` does)."""
        task = self.inst.task_by_id[ref[0]]
        req = payload_req(stage_payload(self.inst, task, ref[1], self.prefixes, self.seed))
        req.time_stats.wait_queue_entry_time = EPOCH + self.t
        self.waiting.append(req)

    # ------------------------------------------------------------------ admission

    def _admit(self) -> list[Req]:
        """SGLang's admission round (scheduler.py ``_get_new_batch_prefill_raw``)."""
        if len(self.running) >= self.slots:
            return []
        batch = ScheduleBatch(reqs=list(self.running))
        self.policy.calc_priority(self.waiting, batch)
        adder = self.adder_class(1, self.cache, self.alloc, batch, 1.0, MAX_PREFILL_TOKENS, None)
        for req in self.waiting:
            if len(self.running) + len(adder.can_run_list) >= self.slots:
                break
            req.init_next_round_input(self.cache)
            if adder.add_one_req(req, False, None) != AddReqResult.CONTINUE:
                break
        admitted = list(adder.can_run_list)
        chosen = {id(r) for r in admitted}
        self.waiting = [r for r in self.waiting if id(r) not in chosen]
        return admitted

    def _prefill(self, reqs: list[Req]) -> None:
        tokens = 0
        for req in reqs:
            prompt = self._prompt_len(req)
            self.result.prompt_tokens += prompt
            self.result.prompt_hits += min(prompt, req.prefix_len)
            self.rtp.alloc([req])
            row = req.kv.req_pool_idx
            prefix = self.cache.prefix_device_indices(req)
            extend = req.extend_end - req.prefix_len
            fresh = self._take(extend)
            self.rtp.write((row, slice(0, req.prefix_len)), prefix)
            self.rtp.write((row, slice(req.prefix_len, req.extend_end)), fresh)
            req.kv.kv_committed_len = req.kv.kv_allocated_len = req.extend_end
            checkpoint_kv_cache(req, self.cache)  # the prompt is now shared in the tree
            tokens += extend
        self.t += iteration_s(self.cost, tokens, 0, 0.0)
        for req in reqs:
            req.output_ids.append(1)  # the prefill's token
            self.running.append(req)
        self._finish_done()

    def _prompt_len(self, req: Req) -> int:
        task_id, stage = req.rid.split("/", 1)
        agent = self.inst.task_by_id[task_id].stage_by_id[stage].agent
        return len(self.prefixes[agent])

    # ------------------------------------------------------------------ decoding

    def _decode(self) -> None:
        while not self._room(len(self.running)):
            self._retract_one()
        ctx = sum(r.kv.kv_committed_len for r in self.running)
        self.t += iteration_s(self.cost, 0, len(self.running), float(ctx))
        for req in self.running:
            at = req.kv.kv_committed_len
            self.rtp.write((req.kv.req_pool_idx, slice(at, at + 1)), self._take(1))
            req.kv.kv_committed_len += 1
            req.kv.kv_allocated_len += 1
            req.output_ids.append(1)
        self._finish_done()

    def _room(self, tokens: int) -> bool:
        if self.alloc.available_size() < tokens:
            evict_from_tree_cache(self.cache, tokens)  # evicts the shortfall
        return self.alloc.available_size() >= tokens

    def _take(self, n: int) -> torch.Tensor:
        if not self._room(n):
            raise RuntimeError(
                f"out of KV at t={self.t:.3f}: {n} tokens, {self.alloc.available_size()} "
                f"free, {self.cache.evictable_size()} evictable, "
                f"{self.cache.protected_size()} protected, {len(self.running)} running"
            )
        return self.alloc.alloc(n)

    def _retract_one(self) -> None:
        """``retract_decode``: the last of the (hooked) retraction order goes back."""
        if len(self.running) <= 1:
            raise RuntimeError(f"out of KV at t={self.t:.3f} with one request running")
        order = ScheduleBatch._get_decode_retraction_order(self.running)
        victim = self.running.pop(order[-1])
        release_kv_cache(victim, self.cache, checkpoint=False)
        victim.reset_for_retract()
        victim.time_stats.wait_queue_entry_time = EPOCH + self.t
        self.waiting.append(victim)
        self.result.retractions += 1

    def _finish_done(self) -> None:
        still = []
        for req in self.running:
            if len(req.output_ids) < req.sampling_params.max_new_tokens:
                still.append(req)
                continue
            req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
            release_kv_cache(req, self.cache, checkpoint=True)
            self._stage_done(tuple(req.rid.split("/", 1)))  # type: ignore[arg-type]
        self.running = still

    def _stage_done(self, ref: StageRef) -> None:
        self.done.add(ref)
        self.result.finished.append(ref)
        task = self.inst.task_by_id[ref[0]]
        for child in task.children.get(ref[1], ()):
            if all((task.id, d) in self.done for d in task.stage_by_id[child].deps):
                self._send((task.id, child))
        if all((task.id, s.id) in self.done for s in task.stages):
            self.result.jct[task.id] = self.t - task.arrival


def load_plugin() -> None:
    """What a scheduler process does first: publish the server arguments (the scheduler
    objects read them) and load the TOPAS plugin through SGLang's own loader (only it:
    ``SGLANG_PLUGINS=topas``). Once per process: hooks cannot be undone."""
    import os

    import sglang.srt.plugins as plugins
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=1))
    os.environ["SGLANG_PLUGINS"] = "topas"
    plugins.load_plugins()


def replay(instance: Instance, eviction: str = "topas", **kw) -> LoopResult:  # type: ignore[no-untyped-def]
    """Replay ``instance`` through SGLang's scheduler objects (see :class:`CpuLoop`)."""
    return CpuLoop(instance, eviction, **kw).run()
