"""``TopasFakeForCausalLM``: a model whose forward takes the iteration time of a server
profile and emits a fixed token, so that a stock SGLang server serves on the CPU.

For each forward SGLang hands it (``model_executor/runner/eager_runner.py``: decode,
extend; a mixed batch arrives as an extend), it reads what the batch costs from the
``ForwardBatch`` (``model_executor/forward_batch_info.py``): new prefill tokens
``sum(extend_seq_lens_cpu)`` in an extend, decode sequences ``batch_size`` in a decode,
KV tokens read ``seq_lens_sum``. It sleeps for the calibrated iteration time of the
profile (:func:`topas.timing.iteration_s`), times the time scale and, with noise, a
log-normal factor, then returns logits with one row per sequence
(``LogitsProcessorOutput.next_token_logits``) that make the sampler pick one token.
In a mixed batch SGLang gives the decoding requests as one-token extends, so they count
as prefill tokens here (``ForwardBatch`` does not say which rows decode).

Read from the environment of the server (the scheduler process builds the model):

- ``TOPAS_FAKE_PROFILE``: the server profile whose cost model times iterations
  (``topas profiles``; default :data:`DEFAULT_PROFILE`);
- ``TOPAS_FAKE_TIME_SCALE``: seconds slept per second of model time (default 1; 0.1 runs
  ten times faster than the profile's GPU);
- ``TOPAS_FAKE_NOISE``: sigma of a log-normal factor on each iteration (default 0), so
  that the scheduler's predictions are not exact; ``TOPAS_FAKE_SEED`` seeds it (default 0);
- ``TOPAS_FAKE_TOKEN``: the token id emitted (default 7: not the config's bos or eos).
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Iterable

import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from torch import nn

from topas.instance import LinearCost
from topas.profiles import get_profile
from topas.timing import iteration_s

DEFAULT_PROFILE = "llama-3-8b/h100"
DEFAULT_TOKEN = 7


def _env_float(name: str, default: float, least: float) -> float:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}: not a number: {text!r}") from None
    if not math.isfinite(value) or value < least:
        raise ValueError(f"{name}: must be a finite number >= {least:g}, got {text!r}")
    return value


def batch_cost(forward_batch: ForwardBatch) -> tuple[int, int, int, int]:
    """(rows that need logits, new prefill tokens, decode sequences, KV tokens read) of
    one forward."""
    mode = forward_batch.forward_mode
    rows = int(forward_batch.batch_size)
    if mode.is_idle() or rows == 0:
        return 0, 0, 0, 0
    kv = forward_batch.seq_lens_sum
    if kv is None:
        lens = forward_batch.seq_lens_cpu
        kv = int(lens.sum()) if lens is not None else int(forward_batch.seq_lens.sum())
    if mode.is_decode():
        return rows, 0, rows, int(kv)
    extend = forward_batch.extend_seq_lens_cpu
    prefill = int(sum(extend)) if extend is not None else int(forward_batch.input_ids.shape[0])
    return rows, prefill, 0, int(kv)


class TopasFakeForCausalLM(nn.Module):
    """See the module docstring."""

    def __init__(self, config, quant_config=None, prefix: str = "", **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.config = config
        self.quant_config = quant_config
        self.vocab_size = int(config.vocab_size)
        self.dummy = nn.Parameter(torch.zeros(1))  # dummy loading wants a parameter
        self.cost: LinearCost = get_profile(
            os.environ.get("TOPAS_FAKE_PROFILE") or DEFAULT_PROFILE
        ).cost
        self.time_scale = _env_float("TOPAS_FAKE_TIME_SCALE", 1.0, 0.0)
        self.noise = _env_float("TOPAS_FAKE_NOISE", 0.0, 0.0)
        self.rng = random.Random(int(_env_float("TOPAS_FAKE_SEED", 0, 0)))
        self.token = int(_env_float("TOPAS_FAKE_TOKEN", DEFAULT_TOKEN, 0)) % self.vocab_size
        self.forwards = 0
        self.model_time_s = 0.0  # profile seconds, before scale and noise

    def iteration_time(self, prefill: int, decode: int, kv: int) -> float:
        """Seconds one forward sleeps: the profile's iteration time, scaled, with noise."""
        t = iteration_s(self.cost, prefill, decode, kv)
        self.model_time_s += t
        if self.noise:
            t *= math.exp(self.rng.gauss(-0.5 * self.noise**2, self.noise))  # mean 1
        return t * self.time_scale

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        input_embeds: torch.Tensor | None = None,
        get_embedding: bool = False,
        **kwargs,  # type: ignore[no-untyped-def]
    ) -> LogitsProcessorOutput:
        rows, prefill, decode, kv = batch_cost(forward_batch)
        if rows:
            time.sleep(self.iteration_time(prefill, decode, kv))
        self.forwards += 1
        logits = torch.zeros(rows, self.vocab_size, dtype=torch.float32, device=input_ids.device)
        logits[:, self.token] = 100.0
        return LogitsProcessorOutput(next_token_logits=logits)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for _ in weights:  # no weights: --load-format dummy never calls this
            pass


EntryClass = TopasFakeForCausalLM
