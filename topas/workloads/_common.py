"""Shared pieces of the workload generators: the :class:`Workload` record, token draws,
the default server rule and the task-demand estimate behind the load factor.

Every number here is documented, with its source, in ``docs/workloads.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topas.errors import InputError
from topas.instance import (
    Agent,
    HostLoad,
    LinearCost,
    ServerSpec,
    Stage,
    StepCost,
    Task,
)

# --------------------------------------------------------------------------- constants

KV_BYTES_PER_TOKEN = 128 * 1024
"""Llama-3-8B, bf16: 32 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes = 128 KiB."""

TOKENS_PER_GIB = (1 << 30) // KV_BYTES_PER_TOKEN
"""8192 tokens of KV per GiB for the model shape above."""

DEFAULT_PREFIX_SHARE = 0.5
"""Chosen: all agents' prefixes together take half the KV budget (brief: 30-70%)."""

KV_ROUND_TOKENS = 1024
"""The default KV budget is rounded up to a multiple of this (1024 tokens = 128 MiB)."""

DEFAULT_CHUNK_TOKENS = 2048
"""SGLang's ``chunked_prefill_size`` on small-memory GPUs (server_args.py picks 2048 below
~20-35 GB of GPU memory, 8192 on H100/H200-class GPUs). We model a small KV share, so 2048."""

DEFAULT_MAX_RUNNING: int | None = None
"""Unlimited: the KV budget, not a request cap, bounds the batch (the tradeoff we study)."""

INPUT_CAP = 4096
"""Chosen: no single call's own input (beyond its prefix) exceeds 4096 tokens."""

OUTPUT_CAP = 2048
"""Chosen: no single call generates more than 2048 tokens (a common ``max_tokens``)."""

MIN_ROOM_SHARE = 0.25
"""Chosen: the load factor assumes at least a quarter of the KV budget is left to requests,
even when keeping every prefix would leave less (see :func:`decode_regime`)."""

DEFAULT_TOKEN_SIGMA = 0.5
"""Chosen: per-call lognormal spread of token counts (median/mean ratio exp(-sigma^2/2))."""


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Draft:
    """What a family builder returns: agents and, per task, its stages (no arrivals yet)."""

    agents: tuple[Agent, ...]
    tasks: tuple[tuple[Stage, ...], ...]


Builder = Callable[[np.random.Generator, int, Mapping[str, Any]], Draft]


@dataclass(frozen=True)
class ServerDefaults:
    """How a family's default server is sized (see :func:`default_server`)."""

    prefix_share: float = DEFAULT_PREFIX_SHARE  # sum of prefixes / kv budget, before rounding
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    max_running: int | None = DEFAULT_MAX_RUNNING
    stage_cap_tokens: int = INPUT_CAP + OUTPUT_CAP  # largest input+output a stage can draw


@dataclass(frozen=True)
class Workload:
    """A workload family: a name, its parameters and a builder of agents and task DAGs.

    ``build(rng, num_tasks, params)`` draws agents and ``num_tasks`` stage lists from
    ``rng`` with the full parameter dict ``params`` (defaults merged with overrides).
    ``small_params`` shrink the family for :func:`topas.workloads.small_instance`.
    """

    name: str
    description: str
    params: Mapping[str, Any]
    param_help: Mapping[str, str]
    build: Builder
    server: ServerDefaults = ServerDefaults()
    small_params: Mapping[str, Any] = field(default_factory=dict)
    profile: str | None = None  # the server profile it defaults to (None: the project's)

    def default_server(
        self, agents: Sequence[Agent], prefix_share: float | None = None
    ) -> ServerSpec:
        return default_server(agents, self.server, prefix_share)


# --------------------------------------------------------------------------- server


def round_up(x: float, multiple: int) -> int:
    return int(math.ceil(x / multiple - 1e-12)) * multiple


def default_server(
    agents: Sequence[Agent], defaults: ServerDefaults, prefix_share: float | None = None
) -> ServerSpec:
    """The default server of a family for these agents.

    ``kv_capacity_tokens`` is the KV share left to this workload on a shared GPU, sized so
    that all agents' prefixes together take ``prefix_share`` of it (rounded up to
    :data:`KV_ROUND_TOKENS`), and never less than the largest prefix plus the largest stage
    the family can draw, so that every stage fits.
    """
    share = defaults.prefix_share if prefix_share is None else prefix_share
    total = sum(a.prefix_tokens for a in agents)
    largest = max(a.prefix_tokens for a in agents) + defaults.stage_cap_tokens
    kv = max(round_up(total / share, KV_ROUND_TOKENS), round_up(largest, KV_ROUND_TOKENS))
    return ServerSpec(
        kv_capacity_tokens=kv,
        chunk_tokens=defaults.chunk_tokens,
        max_running=defaults.max_running,
    )


# --------------------------------------------------------------------------- draws


def lognormal_int(
    rng: np.random.Generator,
    mean: float,
    sigma: float,
    lo: int = 1,
    hi: int | None = None,
) -> int:
    """A lognormal draw with the given *mean* (not median), rounded and clipped to [lo, hi]."""
    if sigma <= 0:
        x = mean
    else:
        x = float(rng.lognormal(math.log(mean) - sigma * sigma / 2.0, sigma))
    v = max(lo, int(round(x)))
    return v if hi is None else min(hi, v)


def draw_input(rng: np.random.Generator, mean: float, sigma: float) -> int:
    return lognormal_int(rng, mean, sigma, 1, INPUT_CAP)


def draw_output(rng: np.random.Generator, mean: float, sigma: float) -> int:
    return lognormal_int(rng, mean, sigma, 1, OUTPUT_CAP)


def uniform_int(rng: np.random.Generator, lo: int, hi: int) -> int:
    """An integer uniform on [lo, hi], both included."""
    return int(rng.integers(lo, hi + 1))


def log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def positive_poisson(rng: np.random.Generator, mean: float, cap: int) -> int:
    """``1 + Poisson(mean - 1)``, capped at ``cap``: a count of at least 1 with the given mean."""
    extra = int(rng.poisson(max(0.0, mean - 1.0)))
    return max(1, min(cap, 1 + extra))


# --------------------------------------------------------------------------- checks


def require(cond: bool, message: str) -> None:
    if not cond:
        raise InputError(message)


def require_choice(value: Any, name: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise InputError(
            f"parameter {name}: invalid value {value!r} (valid: {', '.join(map(str, choices))})"
        )


# --------------------------------------------------------------------------- demand


@dataclass(frozen=True)
class DecodeRegime:
    """The decode batch and context at the server's best throughput (see :func:`decode_regime`)."""

    batch: int  # b = min(max_running, floor((kv_capacity - all prefixes) / mean input+output))
    context: float  # c = mean attended context per decode step: prefix + input + output/2


def decode_regime(
    stages: Sequence[Stage], agents_by_id: Mapping[str, Agent], server: ServerSpec
) -> DecodeRegime:
    """Effective decode batch ``b`` and mean attended context ``c`` over ``stages``.

    ``b`` is the number of average stages whose KV (input + output, as admission
    reserves it) fits beside every agent's prefix kept resident: the best-locality
    regime, so load 1 is about where a server that keeps all prefixes saturates. When
    the prefixes leave less than :data:`MIN_ROOM_SHARE` of the budget (or do not fit at
    all, as MetaGPT-TL's measured prompts on the paper's profile), that share is taken
    as the room: a server must then drain prompts, and keeps at least that much free.
    """
    n = len(stages)
    mean_seq = sum(s.input_tokens + s.output_tokens for s in stages) / n
    cap = server.kv_capacity_tokens
    room = max(cap - sum(a.prefix_tokens for a in agents_by_id.values()), MIN_ROOM_SHARE * cap)
    b = max(1, math.floor(room / mean_seq))
    if server.max_running is not None:
        b = min(b, server.max_running)
    c = (
        sum(
            agents_by_id[s.agent].prefix_tokens + s.input_tokens + s.output_tokens / 2
            for s in stages
        )
        / n
    )
    return DecodeRegime(batch=b, context=c)


def task_demand_s(
    task: Task,
    agents_by_id: Mapping[str, Agent],
    server: ServerSpec,
    regime: DecodeRegime | None = None,
) -> float:
    """A task's demand in server-seconds at the server's best throughput.

    Calibrated (linear) model::

        demand = sum_v (input_v + prefix share_v) * prefill_token_s
               + sum_v output_v * decode_token_cost
        decode_token_cost = (base_s + decode_seq_s*b + kv_token_s*b*c) / b

    where ``b`` and ``c`` come from ``regime`` (by default :func:`decode_regime` over the
    task's own stages). The *prefix share* charges each distinct agent of the task its
    prefix once (a task's stages share their agent's prefix; tasks do not share it with
    each other). With host prefix loads the transfer overlaps compute and is not charged.

    Step model: a stage lasts ``ceil(input/chunk) + output`` steps, a prefix load
    ``ceil(p/chunk)`` (recompute) or ``max(1, ceil(p/(tokens_per_s*step_s)))`` (host) steps,
    and ``b`` stages progress at once, so ``demand = step_s * (sum of durations) / b``.

    The cost parameters are the server's own ``LinearCost`` or, when it has none,
    ``topas.timing.DEFAULT_LINEAR``.
    """
    from topas.timing import DEFAULT_LINEAR

    if regime is None:
        regime = decode_regime(task.stages, agents_by_id, server)
    b, c = regime.batch, regime.context
    agents = sorted({s.agent for s in task.stages})
    prefixes = [agents_by_id[a].prefix_tokens for a in agents]
    cost = server.cost_model
    host = server.prefix_load if isinstance(server.prefix_load, HostLoad) else None
    if isinstance(cost, StepCost):
        chunk = server.chunk_tokens
        steps = sum(math.ceil(s.input_tokens / chunk) + s.output_tokens for s in task.stages)
        if host is None:
            steps += sum(math.ceil(p / chunk) for p in prefixes)
        else:
            steps += sum(max(1, math.ceil(p / (host.tokens_per_s * cost.step_s))) for p in prefixes)
        return cost.step_s * steps / b
    lin: LinearCost = cost if isinstance(cost, LinearCost) else DEFAULT_LINEAR
    prefill_tokens = sum(s.input_tokens for s in task.stages)
    if host is None:
        prefill_tokens += sum(prefixes)
    decode_token_cost = (lin.base_s + lin.decode_seq_s * b + lin.kv_token_s * b * c) / b
    output_tokens = sum(s.output_tokens for s in task.stages)
    return prefill_tokens * lin.prefill_token_s + output_tokens * decode_token_cost


def mean_task_demand_s(
    tasks: Sequence[Task], agents_by_id: Mapping[str, Agent], server: ServerSpec
) -> float:
    """Mean of :func:`task_demand_s` over ``tasks``, with ``b`` and ``c`` pooled over all of
    their stages (the regime of the whole workload, not of each task alone)."""
    stages = [s for t in tasks for s in t.stages]
    regime = decode_regime(stages, agents_by_id, server)
    return sum(task_demand_s(t, agents_by_id, server, regime) for t in tasks) / len(tasks)
