"""SGLang requests -> :class:`topas.observe.Request`.

Reads only plain attributes of SGLang 0.5.23's ``Req`` (``rid``,
``sampling_params.custom_params``, ``output_ids``, ``time_stats``), so it imports nothing
from SGLang. A request whose metadata is missing or malformed is *untagged*: it is left
to SGLang's own order.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from topas.instance import Task
from topas.observe import Request
from topas.workflow_metadata import KEY, MetadataError, StageMeta, decode


@dataclass
class Observation:
    """The tagged requests of one scheduling round, and what was left untagged."""

    requests: list[Request] = field(default_factory=list)
    reqs: dict[tuple[str, str], Any] = field(default_factory=dict)  # stage -> SGLang Req
    tasks: dict[str, Task] = field(default_factory=dict)  # task id -> its Task
    speakers: dict[str, Any] = field(default_factory=dict)  # agent -> a request of its own
    queued: dict[tuple[str, str], int] = field(default_factory=dict)  # a tagged waiting
    # stage -> its position in the waiting list observed, in queue order
    prefix_tokens: dict[str, int] = field(default_factory=dict)  # agent -> prompt length
    # (a request's own agent as it says; the task's other agents as its metadata tells)
    untagged: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # why, per untagged request with metadata


def metadata(req: Any) -> StageMeta:
    """The TOPAS metadata of ``req``; MetadataError if it has none or it is malformed.

    A request carries the same string at every scheduling round: it is decoded once, and
    the stages of one task share one :class:`~topas.instance.Task` (its analyses are cached
    on it; :func:`~topas.workflow_metadata.decode` builds it once per task)."""
    raw = raw_metadata(req)
    if raw is None:  # decode raises the reason
        return decode(getattr(getattr(req, "sampling_params", None), "custom_params", None))
    return _decode_raw(raw)


def raw_metadata(req: Any) -> str | None:
    """``req``'s TOPAS metadata string as the client sent it, undecoded; None if it has
    none (or not a string)."""
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    raw = params.get(KEY) if isinstance(params, Mapping) else None
    return raw if isinstance(raw, str) else None


@functools.lru_cache(maxsize=1 << 16)
def _decode_raw(raw: str) -> StageMeta:
    meta = decode({KEY: raw})
    told = frozenset(meta.prefixes.items())
    prefixes = _PREFIXES.get(told)
    if prefixes is None:
        if len(_PREFIXES) >= 1 << 12:
            _PREFIXES.clear()
        prefixes = _PREFIXES[told] = meta.prefixes
    return dataclasses.replace(meta, prefixes=prefixes)


_PREFIXES: dict[frozenset, Mapping[str, int]] = {}  # the prompt lengths they share
# (one object for equal ones: observe reads each once a round, not once per task)


def queued_at(req: Any) -> float:
    """When ``req`` entered the waiting queue (SGLang's perf_counter clock)."""
    stats = getattr(req, "time_stats", None)
    for name in ("wait_queue_entry_time", "scheduler_recv_time"):
        t = getattr(stats, name, None)
        if isinstance(t, (int, float)) and t > 0:
            return float(t)
    return 0.0


def observe(
    waiting: Iterable[Any],
    running: Iterable[Any],
    releases: MutableMapping[str, float],
    memo: Memo | None = None,
) -> Observation:
    """Tagged requests of ``waiting`` (in queue order) and ``running``; ``releases``
    remembers when each task was first seen (its release on the engine's clock).

    ``memo``, kept by a caller that observes round after round, remembers per request
    (while it is queued or running) its decoded metadata and the ``Request`` built for it,
    which is reused while its queue time, phase and output length are unchanged: a
    waiting request's are the same every round. It is replaced in place by this round's
    requests only."""
    obs = Observation()
    told: dict[str, Mapping[str, int]] = {}  # task -> the prompt lengths it tells
    own: dict[str, int] = {}  # agent -> its prompt length, as its own request says
    last: Memo = memo if memo is not None else {}  # read only until the loop is over
    seen: Memo = {}
    requests, reqs, tasks, speakers = obs.requests, obs.reqs, obs.tasks, obs.speakers
    queued, untagged, errors = obs.queued, obs.untagged, obs.errors
    for queue, is_running in ((waiting, False), (running, True)):
        for i, req in enumerate(queue):
            try:
                if req.finished():  # SGLang is done with it: its finish signal comes on
                    continue  # release
            except (AttributeError, TypeError):  # not SGLang's Req: the general rule
                done = getattr(req, "finished", None)
                if callable(done) and done():
                    continue
            key = id(req)
            hit = last.get(key)
            if hit is None or hit[0] is not req:
                meta = _metadata_or_error(req)
                ref = None if isinstance(meta, MetadataError) else meta.ref
                hit = (req, meta, None, ref)
            seen[key] = hit
            _, meta, r, ref = hit
            if ref is None:
                untagged.append(req)
                if "missing" not in str(meta):
                    errors.append(f"{getattr(req, 'rid', '?')}: {meta}")
                continue
            if reqs.setdefault(ref, req) is not req:  # one stage sent twice: leave both
                untagged.append(req)  # to SGLang
                errors.append(f"{getattr(req, 'rid', '?')}: stage {ref} twice")
                continue
            try:
                t = req.time_stats.wait_queue_entry_time
            except AttributeError:
                t = None
            if t.__class__ is not float or t <= 0:  # not SGLang's usual: the general rule
                t = queued_at(req)
            tid = ref[0]
            release = releases.get(tid)
            if release is None:
                release = releases[tid] = t
            elif t < release:
                release = t
            out = getattr(req, "output_ids", None)
            generated = len(out) if out else 0
            if (
                r is None
                or r.queued_at != t
                or r.running is not is_running
                or r.generated != generated
                or r.release != release
            ):
                r = Request(meta.task, meta.stage, release, t, is_running, generated=generated)
                seen[key] = (req, meta, r, ref)
            requests.append(r)
            if not is_running:
                queued[ref] = i
            if tid not in told:
                told[tid] = meta.prefixes
                tasks[tid] = meta.task
            own[meta.agent] = meta.prefix_tokens
            speakers[meta.agent] = req
    unique = {id(p): p for p in told.values()}  # shared by tasks that tell the same
    for prefixes in unique.values():  # the tasks' other agents, as their first request tells
        for agent, n in prefixes.items():
            obs.prefix_tokens.setdefault(agent, n)
    obs.prefix_tokens.update(own)  # a request's own agent, as it says (the last one wins)
    if memo is not None:
        memo.clear()
        memo.update(seen)
    return obs


def stage_ref(req: Any) -> tuple[str, str] | None:
    """``req``'s (task, stage); None if it has no TOPAS metadata or malformed metadata
    (decoded once, as :func:`metadata`)."""
    if raw_metadata(req) is None:
        return None
    meta = _metadata_or_error(req)
    return None if isinstance(meta, MetadataError) else meta.ref


def _metadata_or_error(req: Any) -> StageMeta | MetadataError:
    try:
        return metadata(req)
    except MetadataError as e:
        return e


Memo = dict[
    int, tuple[Any, "StageMeta | MetadataError", "Request | None", "tuple[str, str] | None"]
]
"""id(req) -> (req, its metadata or why it has none, the Request last built for it, its
stage (None: untagged))."""
