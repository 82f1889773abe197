"""Tensor parallelism: every rank of a scheduler takes rank 0's decision.

With ``--tp-size N`` SGLang runs one scheduler process per rank, in lockstep: rank 0
receives the requests and broadcasts them to the others
(``managers/scheduler_components/request_receiver.py``, ``_broadcast_reqs_across_ranks``),
and every rank must then order, admit, evict and retract alike, or the ranks' KV pools
and batches part ways and the model's collectives hang. A TOPAS plan reads inputs that
differ between ranks: the queue-entry stamps (each rank's own ``perf_counter``), the
re-plan interval and the time budget (the wall clock). So the ranks do not plan on
their own. Rank 0 plans, and its plan goes to the others as plain data (a :class:`Word`)
over the TP group's CPU (gloo) group with SGLang's own ``broadcast_pyobj``, as the
scheduler broadcasts its requests. The other ranks apply it to their own queue:

- the waiting queue in rank 0's order, by request id (the ranks hold the same requests);
- the request ids held out of this round's admission;
- the eviction ranks of the agents' prompt nodes, by node id: node ids come from one
  counter per process (``UnifiedTreeNode.counter``, ``mem_cache/unified_cache/
  unified_tree_core.py``), and the ranks apply the same tree operations in the same
  order (they must, for their allocators to agree), so a prompt ends in the same node
  id on every rank;
- the retraction order, as indices into the batch SGLang hands the hook.

One broadcast per hooked call (each ``calc_priority`` call with a non-empty queue, each
retraction order); the calls come in the same order on every rank, since whether a hook
runs depends only on the state the ranks share. A rank whose queue does not hold rank
0's requests (which SGLang's own lockstep rules out) keeps SGLang's order that round and
counts a fallback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class RankMismatch(RuntimeError):
    """A rank's queue or batch is not the one rank 0 decided on."""


@dataclass(frozen=True)
class Word:
    """Rank 0's plan for one round, as plain data."""

    order: tuple[str, ...] | None  # the waiting queue's rids in rank 0's order; None: SGLang's
    held: frozenset[str]  # rids held out of this round's admission
    ranks: tuple[tuple[int, tuple], ...]  # (prompt node id, eviction rank), sorted


@dataclass(frozen=True)
class RankLink:
    """This scheduler's place in its tensor-parallel group."""

    rank: int  # in the group: 0 plans, the others follow
    size: int
    share: Callable[[Any], Any]  # rank 0's object, returned on every rank (a broadcast)

    @property
    def leads(self) -> bool:
        return self.rank == 0


def group_link(group: Any, rank: int, ranks: list[int]) -> RankLink:
    """The link over a ``torch.distributed`` CPU process group: this process is global
    rank ``rank``; ``ranks`` are the group's global ranks, the first of which plans."""
    from sglang.srt.utils import broadcast_pyobj

    src = ranks[0]

    def share(obj: Any) -> Any:
        return broadcast_pyobj([obj], rank, group, src=src)[0]

    return RankLink(rank=ranks.index(rank), size=len(ranks), share=share)


def sglang_link() -> RankLink | None:
    """The link of this scheduler process's TP group (SGLang's published parallel state);
    None with one rank, or where no server published one (a bare cache in a test)."""
    from sglang.srt.runtime_context import get_parallel

    try:
        size = int(get_parallel().tp_size)
    except ValueError:  # "config namespace 'parallel' not published": no server
        return None
    if size <= 1:
        return None
    tp = get_parallel().tp_group
    return group_link(tp.cpu_group, tp.rank, list(tp.ranks))


def word(order: list | None, held: frozenset[str], ranks: dict[int, tuple]) -> Word:
    """Rank 0's plan (its queue order, hold-backs and eviction ranks) as a :class:`Word`."""
    return Word(
        order=None if order is None else tuple(r.rid for r in order),
        held=held,
        ranks=tuple(sorted(ranks.items())),
    )


def apply_order(waiting: list, w: Word) -> list | None:
    """``waiting`` (this rank's requests) in the order of ``w``; None for SGLang's order.
    :class:`RankMismatch` if the queue does not hold exactly the requests rank 0 ordered."""
    if w.order is None:
        return None
    by_rid = {r.rid: r for r in waiting}
    if len(by_rid) != len(waiting) or len(w.order) != len(waiting):
        raise RankMismatch(f"rank 0 ordered {len(w.order)} requests, this rank has {len(waiting)}")
    try:
        order = [by_rid[rid] for rid in w.order]
    except KeyError as e:
        raise RankMismatch(f"rank 0 ordered request {e.args[0]}, not queued here") from None
    if len(set(w.order)) != len(w.order):
        raise RankMismatch("rank 0 ordered a request twice")
    return order


def check_retraction(order: list[int], n: int) -> list[int]:
    """Rank 0's retraction order, checked to be an order of this rank's ``n`` requests."""
    if sorted(order) != list(range(n)):
        raise RankMismatch(f"rank 0's retraction order does not fit a batch of {n}")
    return order
