"""The functions the plugin hooks into SGLang 0.5.23 (see :mod:`topas_sglang.plugin`).

Every hook runs SGLang's own code first and changes its result only where TOPAS has a
say; any exception inside TOPAS is logged once (per place and exception type) and that
round keeps SGLang's own result. The waiting queue is permuted in place and only after
its new order is checked to hold the same requests, so nothing is lost or duplicated.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

from topas_sglang.retention import active, controller_of

logger = logging.getLogger("topas_sglang")

_logged: set[tuple[str, str]] = set()

clock = time.perf_counter
"""The scheduler's clock, the one SGLang stamps queue entries with (a CPU replay of the
scheduler swaps in its simulated clock)."""


def _fell_back(where: str, exc: BaseException, controller: Any = None) -> None:
    if controller is not None:
        controller.stats.fallbacks += 1
        controller.held_rids = frozenset()
        controller.export()
    key = (where, type(exc).__name__)
    if key not in _logged:
        _logged.add(key)
        logger.warning(
            "TOPAS %s failed (%s: %s); this round keeps SGLang's own order "
            "(logged once per error type)",
            where,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )


def calc_priority(original, policy, waiting_queue, running_batch=None, processed_tokens=0):  # type: ignore[no-untyped-def]
    """AROUND ``SchedulePolicy.calc_priority``: SGLang sorts the queue (and matches each
    request's prefix), then TOPAS permutes its tagged requests and picks the hold-backs."""
    result = original(policy, waiting_queue, running_batch, processed_tokens=processed_tokens)
    controller = controller_of(policy.tree_cache)
    if controller is None or not waiting_queue:
        return result
    snapshot = list(waiting_queue)
    link = controller.rank_link()  # with TP > 1: rank 0 plans, the others follow it
    order = None
    if link is None or link.leads:
        try:
            running = list(getattr(running_batch, "reqs", None) or ())
            order = controller.plan_round(policy.tree_cache, snapshot, running, clock())
        except Exception as e:  # noqa: BLE001 - any failure: SGLang's order this round
            _fell_back("ordering", e, controller)
    if link is not None:
        try:
            order = controller.agree(link, snapshot, order)
        except Exception as e:  # noqa: BLE001
            order = None
            _fell_back("ordering as rank 0 said", e, controller)
    if order is not None:
        waiting_queue[:] = order
    return result


class TopasPrefillAdder(PrefillAdder):
    """SGLang's ``PrefillAdder`` that stops admission at a request TOPAS holds back.

    Returning ``OTHER`` before any side effect ends this round's admission loop, as
    SGLang's own ``prefill_max_requests`` limit does; the request stays queued. The held
    requests sit at the tail of the queue, so nothing else is kept out.
    """

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.topas = controller_of(self.tree_cache)
        self.topas_held = self.topas.held_rids if self.topas is not None else frozenset()
        if self.topas is not None:  # set again below while a request is still chunked
            self.topas.chunked_req = None

    def add_chunked_req(self, req):  # type: ignore[no-untyped-def]
        """SGLang's, then tell the controller which request is still being chunked: it is
        in neither the waiting queue nor the running batch, yet it holds KV and has not
        finished (the scheduler keeps it in ``Scheduler.chunked_req``)."""
        still = super().add_chunked_req(req)
        if self.topas is not None:
            self.topas.chunked_req = still
        return still

    def add_one_req(self, req, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.topas_held and req.rid in self.topas_held:
            return AddReqResult.OTHER
        result = super().add_one_req(req, *args, **kwargs)
        if self.topas is not None and self.new_chunked_req is req:  # its first chunk:
            self.topas.chunked_req = req  # the scheduler keeps it as its chunked_req
        return result


def prefill_adder_class(scheduler) -> type[PrefillAdder]:  # type: ignore[no-untyped-def]
    """REPLACE for ``Scheduler.get_prefill_adder_class``."""
    return TopasPrefillAdder


def retraction_order(original, reqs):  # type: ignore[no-untyped-def]
    """AROUND the staticmethod ``ScheduleBatch._get_decode_retraction_order``: the tagged
    requests' victim order follows TOPAS's preemption term (the last is retracted first)."""
    order = original(reqs)
    controller = active()
    if controller is None:
        return order
    link = controller.rank_link()  # with TP > 1: rank 0 orders, the others follow it
    mine = order
    if link is None or link.leads:
        try:
            mine = controller.retraction_order(reqs, list(order), clock())
        except Exception as e:  # noqa: BLE001
            _fell_back("retraction order", e, None)
    if link is not None:
        try:
            mine = controller.agree_retraction(link, list(mine), len(reqs))
        except Exception as e:  # noqa: BLE001
            mine = order
            _fell_back("retraction order as rank 0 said", e, None)
    return mine


def request_released(original, cache, req, *args, **kwargs):  # type: ignore[no-untyped-def]
    """AROUND ``UnifiedRadixCache.on_release``, which ``release_kv_cache`` calls once a
    request's KV row is freed: when the request has finished (SGLang set its
    ``finished_reason``, and not to an abort), that is the stage's finish signal. A
    retracted request is released unfinished and goes back to the queue."""
    result = original(cache, req, *args, **kwargs)
    if req.finished() and not isinstance(req.finished_reason, FINISH_ABORT):
        controller = controller_of(cache)
        if controller is not None:
            try:
                controller.stage_finished(req)
            except Exception as e:  # noqa: BLE001
                _fell_back("finish signal", e, None)
    return result


def tree_core_backend(original, params):  # type: ignore[no-untyped-def]
    """AROUND ``select_tree_core_backend``: the ``topas`` strategy needs the Python core
    (SGLang's Rust core accepts only its built-in policy names)."""
    from topas_sglang.retention import NAME

    if str(getattr(params, "eviction_policy", "")).lower() == NAME:
        return "python"
    return original(params)


def check_server_args(original, args):  # type: ignore[no-untyped-def]
    """AROUND ``ServerArgs.check_server_args``: the plugin's own start-up checks first
    (:func:`topas_sglang.plugin.check_topas_args`), then SGLang's."""
    from topas_sglang.plugin import check_topas_args

    check_topas_args(args)
    return original(args)


def tree_cache_built(original, ctx):  # type: ignore[no-untyped-def]
    """AROUND ``create_tree_cache``: SGLang builds the cache; if TOPAS was asked for and the
    cache has no ``topas`` strategy to run (with ``--disable-radix-cache`` SGLang builds a
    disabled UnifiedRadixCache without one; a registered backend such as flexkv has its
    own tree), say so once at start-up instead of letting SGLang's order run silently."""
    cache = original(ctx)
    if topas_configured() and controller_of(cache) is None:
        logger.warning(
            "--radix-eviction-policy topas: the %s that SGLang built has no topas eviction "
            "strategy to attach to, so TOPAS neither orders the queue nor retains prompts; "
            "SGLang schedules on its own",
            type(cache).__name__,
        )
    return cache


def topas_configured() -> bool:
    """Whether the published server config asks for ``--radix-eviction-policy topas``."""
    try:
        from sglang.srt.runtime_context import get_memory

        return str(get_memory().radix_eviction_policy).lower() == "topas"
    except Exception:  # noqa: BLE001 - no published config (a bare cache in a test)
        return False
