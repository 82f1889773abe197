"""The ``topas`` radix eviction strategy: TOPAS decides which agent prompts stay.

SGLang's Python tree core heaps evictable leaves by ``strategy.get_priority(node)`` and
evicts the smallest first. This strategy ranks nodes in three classes, each by LRU within:

- ``0``: the prompt nodes of agents the last TOPAS decision evicts: first to go;
- ``1``: every other node (request tails, untagged traffic): SGLang's LRU;
- ``2``: the prompt nodes of the other agents TOPAS knows, in its eviction order (least
  worth keeping first): last to go.

A prompt node is the node an agent's system prompt ends in (see
:mod:`topas_sglang.controller`); its ancestors are not leaves while it stays, so the
whole prompt is retained with it.

Why this and not SGLang's ``priority`` policy: a node's priority there is a maximum over
the requests that inserted it and is never lowered, so it cannot mark a prompt to drop
first, and it must be set on the request before its insert. This strategy is re-ranked at
every scheduling round. It needs the Python tree core (SGLang's Rust core accepts only
its own policy names); the plugin selects it when this strategy is configured.

Each strategy owns the :class:`~topas_sglang.controller.Controller` of its scheduler:
configured with ``--radix-eviction-policy topas``, and optionally
``--radix-eviction-policy-config '{"policy": "topas-greedy:horizon=2", "budget_ms": 1.0}'``
(a TOPAS policy spec, the default ``controller.DEFAULT_POLICY``; the mean planning time per
round, the default ``controller.DEFAULT_BUDGET_MS``, which applies when planning in the
scheduler). By default (:data:`DEFAULT_OFFLOAD`) the plans are made in a process of
their own, off the scheduler's thread (:mod:`topas_sglang.offload`), there also for the
round after the next predicted finish unless ``"lookahead": false``; ``"offload": false``
plans in the scheduler's own thread.
"""

from __future__ import annotations

import weakref
from typing import Any

from sglang.srt.mem_cache.evict_policy import EvictionStrategy
from sglang.srt.mem_cache.radix_cache import RadixKey

from topas_sglang.controller import DEFAULT_BUDGET_MS, DEFAULT_POLICY, Controller

NAME = "topas"
"""The eviction-policy name (``--radix-eviction-policy topas``)."""

DEFAULT_OFFLOAD = True
"""Plan in a planner process (``"offload"``). Chosen on 2026-12-04 from the live bench
(the real server on the CPU, fake model) on tuning seeds 1000 and 1001: the offloaded
plugin's mean JCT was 1-9% below the synchronous one's in all four cells, its scheduler
share 0.23-0.34 ms of CPU per planned round against 0.98-1.33 ms. On a machine whose
CPUs other work holds it was behind (5-14%, 2026-12-03): ``"offload": false`` there
(``integration/sglang/README.md``, "Planning off the scheduler's thread")."""

_active: weakref.ref[Controller] | None = None


def active() -> Controller | None:
    """The controller of the newest ``topas`` strategy in this process (one scheduler
    per process): hooks without a cache at hand (retraction order) reach it here."""
    return None if _active is None else _active()


class TopasRetention(EvictionStrategy):
    """See the module docstring."""

    def __init__(
        self,
        policy: str = DEFAULT_POLICY,
        budget_ms: float = DEFAULT_BUDGET_MS,
        offload: bool = DEFAULT_OFFLOAD,
        lookahead: bool = True,
    ) -> None:
        for name, value in (("offload", offload), ("lookahead", lookahead)):
            if not isinstance(value, bool):
                raise ValueError(f"{name}: true or false expected, got {value!r}")
        if offload:
            from topas_sglang.offload import Offloaded

            self.adopt(Offloaded(policy_spec=policy, budget_ms=budget_ms,
                                 key_factory=RadixKey, lookahead=lookahead))  # fmt: skip
        else:
            self.adopt(Controller(policy_spec=policy, budget_ms=budget_ms, key_factory=RadixKey))

    def adopt(self, controller: Controller) -> Controller:
        """Make ``controller`` this strategy's (and the process's active one)."""
        global _active
        self.controller = controller
        _active = weakref.ref(controller)
        return controller

    def get_priority(self, node: Any) -> tuple:
        rank = self.controller.ranks.get(node.id)
        if rank is None:
            return (1, node.last_access_time)
        return (*rank, node.last_access_time)


def controller_of(tree_cache: Any) -> Controller | None:
    """The controller behind ``tree_cache``'s eviction strategy, if it is ``topas``."""
    core = getattr(tree_cache, "tree_core", None)
    strategy = getattr(core, "eviction_strategy", None)
    return strategy.controller if isinstance(strategy, TopasRetention) else None
