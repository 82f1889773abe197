"""Timing: the exact step model and the calibrated iteration-time model.

Step model (DESIGN rules 1-2): integer steps; a stage lasts
``ceil(input/chunk) + output`` steps and a prefix load ``ceil(p/chunk)`` steps
(recompute) or ``max(1, ceil(p/(tokens_per_s*step_s)))`` (host).

Calibrated model: one iteration costs
``base_s + prefill_token_s*P + decode_seq_s*D + kv_token_s*K`` seconds (P prefill
tokens, D decode sequences, K KV tokens read). :data:`DEFAULT_LINEAR` holds the
defaults for Llama-3-8B on one H100, fitted by ``analysis/fit_timing.py``;
``docs/calibration.md`` gives the sources.

Policies estimate durations through a :class:`Predictor` (their context's ``predict``),
which reads only what a policy is allowed to see.

This module imports only :mod:`topas.instance`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from topas.instance import (
    HostLoad,
    Instance,
    LinearCost,
    ServerSpec,
    StepCost,
    release_step,
)

DEFAULT_LINEAR = LinearCost(
    base_s=0.00600793553647028,
    prefill_token_s=1.9738919263606472e-05,
    decode_seq_s=1.7476519699579642e-05,
    kv_token_s=4.6030553116769094e-08,
)
"""Llama-3-8B (bf16, GQA 8 KV heads) on one H100 SXM, TP=1.

``base_s``, ``prefill_token_s`` and ``decode_seq_s``: least-squares fits of the linear
layers' measured operator times (Vidur's public H100 profiles, scaled from the
Llama-2-7B to the Llama-3-8B shape, plus an LM-head estimate) by
``analysis/fit_timing.py``; ``kv_token_s``: 128 KiB of KV per token over 85% of the
H100's 3.35 TB/s. Sources, residuals and the A100 cross-check: docs/calibration.md.
"""

REFERENCE_DECODE_BATCH = 32
"""Decode batch size assumed by :class:`CalibratedPredictor`."""

TIMING_MODES = ("step", "calibrated")


# --------------------------------------------------------------------------- step model


@dataclass(frozen=True)
class StepTiming:
    """Durations of the step model for one instance (DESIGN rules 1-2)."""

    step_s: float
    chunk_tokens: int
    load_steps: dict[str, int]  # agent -> l_a

    @classmethod
    def of(cls, instance: Instance) -> StepTiming:
        server = instance.server
        step_s = step_seconds(server)
        loads = {a.id: prefix_load_steps(a.prefix_tokens, server, step_s) for a in instance.agents}
        return cls(step_s=step_s, chunk_tokens=server.chunk_tokens, load_steps=loads)

    def stage_steps(self, input_tokens: int, output_tokens: int) -> int:
        """``d_v = ceil(input/chunk) + output``."""
        return stage_steps(input_tokens, output_tokens, self.chunk_tokens)

    def release(self, arrival: float) -> int:
        return release_step(arrival, self.step_s)


def step_seconds(server: ServerSpec) -> float:
    """``step_s`` of a step cost model; a linear model's ``base_s`` when overridden."""
    cost = server.cost_model
    if isinstance(cost, StepCost):
        return cost.step_s
    if isinstance(cost, LinearCost):
        return cost.base_s
    return DEFAULT_LINEAR.base_s


def stage_steps(input_tokens: int, output_tokens: int, chunk_tokens: int) -> int:
    return -(-input_tokens // chunk_tokens) + output_tokens


def prefix_load_steps(prefix_tokens: int, server: ServerSpec, step_s: float) -> int:
    """``l_a``: recompute ``ceil(p/chunk)``; host ``max(1, ceil(p/(tokens_per_s*step_s)))``."""
    load = server.prefix_load
    if isinstance(load, HostLoad):
        return max(1, math.ceil(prefix_tokens / (load.tokens_per_s * step_s) - 1e-9))
    return -(-prefix_tokens // server.chunk_tokens)


# --------------------------------------------------------------------------- calibrated


def linear_cost(server: ServerSpec) -> LinearCost:
    """The iteration-cost parameters of the calibrated model for this server."""
    cost = server.cost_model
    return cost if isinstance(cost, LinearCost) else DEFAULT_LINEAR


def iteration_s(
    cost: LinearCost, prefill_tokens: int, decode_seqs: int, kv_tokens_read: float
) -> float:
    """Time of one iteration of the calibrated model."""
    return (
        cost.base_s
        + cost.prefill_token_s * prefill_tokens
        + cost.decode_seq_s * decode_seqs
        + cost.kv_token_s * kv_tokens_read
    )


def decode_span_s(cost: LinearCost, n: int, ctx_sum: float, k: int) -> float:
    """Time of ``k`` decode iterations of ``n`` sequences whose contexts sum to ``ctx_sum``.

    Each iteration reads every context and then grows each by one token, so
    iteration ``i`` (from 0) reads ``ctx_sum + n*i``:
    ``k*(base + decode_seq*n + kv*ctx_sum) + kv*n*k*(k-1)/2``.
    """
    per = cost.base_s + cost.decode_seq_s * n + cost.kv_token_s * ctx_sum
    return k * per + cost.kv_token_s * n * k * (k - 1) / 2.0


def decode_iters_within(cost: LinearCost, n: int, ctx_sum: float, budget_s: float) -> int:
    """Smallest ``k >= 1`` such that ``k`` decode iterations take at least ``budget_s``."""
    if budget_s <= 0:
        return 1
    a = cost.kv_token_s * n / 2.0
    b = cost.base_s + cost.decode_seq_s * n + cost.kv_token_s * ctx_sum - a
    # solve a*k^2 + b*k = budget_s for the positive root, then round up and fix rounding
    if a > 0:
        k = (-b + math.sqrt(b * b + 4 * a * budget_s)) / (2 * a)
    else:
        k = budget_s / b
    k = max(1, math.ceil(k - 1e-9))
    while k > 1 and decode_span_s(cost, n, ctx_sum, k - 1) >= budget_s:
        k -= 1
    while decode_span_s(cost, n, ctx_sum, k) < budget_s:
        k += 1
    return k


def host_transfer_s(prefix_tokens: int, load: HostLoad) -> float:
    return prefix_tokens / load.tokens_per_s


# --------------------------------------------------------------------------- predictions


class Predictor(Protocol):
    """What a policy may know of time, injected through its context
    (``PolicyContext.predict``) instead of branching on the timing mode's name: the
    predicted service of a stage, the time to make a prefix resident, and whether such a
    load takes compute from the batch. Each timing mode has one (:data:`PREDICTORS`)."""

    loads_share_compute: bool  # a prefix load is a prefill beside the batch's own
    discrete: bool  # time advances in whole steps of known length (the step model)

    def service_s(self, input_tokens: int, predicted_output: int) -> float:
        """A stage's service in seconds from what a policy sees (no prefix load)."""
        ...

    def load_s(self, prefix_tokens: int, host_copy: bool | None = None) -> float:
        """Seconds to make a prefix of ``prefix_tokens`` resident (``host_copy``: see
        :attr:`topas.state.PrefixInfo.host_copy`)."""
        ...


@dataclass(frozen=True)
class StepPredictor:
    """The step model: ``d_v`` steps of ``step_s`` with the predicted output; ``l_a``
    steps for a load, which overlaps the stages' own steps (rule 5)."""

    server: ServerSpec
    loads_share_compute: bool = False
    discrete: bool = True

    def service_s(self, input_tokens: int, predicted_output: int) -> float:
        step_s = step_seconds(self.server)
        return stage_steps(input_tokens, predicted_output, self.server.chunk_tokens) * step_s

    def load_s(self, prefix_tokens: int, host_copy: bool | None = None) -> float:
        """The step model knows no host tier beside ``server.prefix_load``: ``host_copy``
        is not used."""
        step_s = step_seconds(self.server)
        return prefix_load_steps(prefix_tokens, self.server, step_s) * step_s


@dataclass(frozen=True)
class CalibratedPredictor:
    """The calibrated model: a stage's prefill at the prefill rate plus one decode
    iteration per output token at a reference batch of :data:`REFERENCE_DECODE_BATCH`
    sequences; a load is a host transfer (beside compute) or a recompute (a prefill that
    shares the GPU with the batch)."""

    server: ServerSpec
    discrete: bool = False

    @property
    def loads_share_compute(self) -> bool:
        return not isinstance(self.server.prefix_load, HostLoad)

    def service_s(self, input_tokens: int, predicted_output: int) -> float:
        cost = linear_cost(self.server)
        per_iter = iteration_s(cost, 0, REFERENCE_DECODE_BATCH, 0.0)
        return input_tokens * cost.prefill_token_s + predicted_output * per_iter

    def load_s(self, prefix_tokens: int, host_copy: bool | None = None) -> float:
        """A host transfer where ``server.prefix_load`` is a host tier, unless the engine
        saw no host copy (``host_copy`` False); else a recompute."""
        load = self.server.prefix_load
        if isinstance(load, HostLoad) and host_copy is not False:
            return host_transfer_s(prefix_tokens, load)
        return prefix_tokens * linear_cost(self.server).prefill_token_s


PREDICTORS: dict[str, type[StepPredictor] | type[CalibratedPredictor]] = {
    "step": StepPredictor,
    "calibrated": CalibratedPredictor,
}
"""The predictor of each timing mode (:data:`TIMING_MODES`)."""


def predictor(server: ServerSpec, timing: str) -> Predictor:
    """The :class:`Predictor` of timing mode ``timing`` for ``server``."""
    try:
        return PREDICTORS[timing](server)
    except KeyError:
        raise ValueError(
            f"unknown timing mode {timing!r} (valid: {', '.join(PREDICTORS)})"
        ) from None
