"""Server profiles: one model shape on one GPU, as data.

A :class:`ServerProfile` holds what the simulator needs to know about a serving engine:
the calibrated iteration-cost coefficients, the KV bytes per token of the model, the KV
budget (or ``None``: sized per workload), the prefill chunk, and the host tier that
prefixes are swapped to and from. ``PROFILES`` maps names such as
``"qwen2.5-32b/a100-80gb"`` to profiles; :func:`get_profile` looks one up with a one-line
error. Every number and its source is in ``docs/profiles.md``; the cost coefficients are
reproduced by ``python analysis/fit_timing.py --profile NAME``.

Prefix movement by swap follows the paper: moving ``l`` tokens of prefix costs
``mu * l / B_swap`` seconds, ``mu`` the KV bytes per token and ``B_swap`` the host link's
measured bandwidth, so a profile's :attr:`ServerProfile.swap_tokens_per_s` is
``B_swap / mu`` and :meth:`ServerProfile.host_load` the instance's ``HostLoad``.

This module imports only :mod:`topas.instance` and :mod:`topas.timing`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from topas.errors import InputError
from topas.instance import (
    HostLoad,
    Instance,
    LinearCost,
    PrefixLoad,
    ProfileRecord,
    RecomputeLoad,
    ServerSpec,
)
from topas.timing import DEFAULT_LINEAR

GIB = 1 << 30
MOVEMENTS = ("recompute", "swap")
"""How an absent prefix becomes resident: prefill it again, or copy it from host memory."""


class ProfileError(InputError):
    """An unknown profile name or a profile with impossible numbers."""


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape (from its Hugging Face ``config.json``)."""

    name: str
    layers: int
    hidden: int
    mlp: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    params: float  # parameter count, embeddings and LM head included
    dtype_bytes: int = 2  # bf16

    @property
    def kv_bytes_per_token(self) -> int:
        """``mu``: K and V of every layer: ``2 * layers * kv_heads * head_dim * dtype``."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes


@dataclass(frozen=True)
class HostTier:
    """The host memory tier behind the GPU's KV cache (SGLang's HiCache).

    ``bytes_per_s`` is ``B_swap``, the measured host-to-device copy bandwidth of the
    link. ``overlaps_compute``: a transfer runs beside the GPU's iterations (on a copy
    stream), so only the stages waiting for the prefix wait. ``free_eviction``: the host
    copy is written through when the prefix is first computed, so dropping the GPU copy
    costs nothing. The simulator implements exactly these two choices (both true for
    every profile here) and refuses others.
    """

    link: str
    bytes_per_s: float
    overlaps_compute: bool = True
    free_eviction: bool = True

    def __post_init__(self) -> None:
        if not (
            isinstance(self.bytes_per_s, int | float)
            and math.isfinite(self.bytes_per_s)
            and self.bytes_per_s > 0
        ):
            raise ProfileError(
                f"host tier {self.link!r}: bandwidth must be > 0, got {self.bytes_per_s!r}"
            )
        if not (self.overlaps_compute and self.free_eviction):
            raise ProfileError(
                "host tier: only overlapping transfers and free (write-through) evictions "
                "are modelled"
            )


@dataclass(frozen=True)
class ServerProfile:
    """A model on a GPU: everything the simulator's timing and memory need.

    ``kv_capacity_tokens=None`` means the GPU's KV budget is not the binding number for
    the workloads run on this profile: each family sizes its KV share itself (the
    ``prefix_share`` rule of ``docs/workloads.md``), as the project's default always has.
    """

    name: str
    model: ModelShape
    gpu: str
    cost: LinearCost
    chunk_tokens: int
    host: HostTier
    kv_capacity_tokens: int | None
    movement: str  # default prefix movement: "recompute" or "swap"
    description: str

    @property
    def swap_tokens_per_s(self) -> float:
        """``B_swap / mu``: prefix tokens moved per second over the host link."""
        return self.host.bytes_per_s / self.model.kv_bytes_per_token

    def swap_s(self, tokens: int) -> float:
        """``mu * l / B_swap``: the time to move ``tokens`` of prefix to or from the host."""
        return tokens * self.model.kv_bytes_per_token / self.host.bytes_per_s

    def with_swap(self, bytes_per_s: float) -> ServerProfile:
        """This profile over a host link of ``bytes_per_s`` (a ``--swap-gbps`` override)."""
        return replace(self, host=replace(self.host, bytes_per_s=float(bytes_per_s)))

    def host_load(self) -> HostLoad:
        return HostLoad(tokens_per_s=self.swap_tokens_per_s)

    def prefix_load(self, movement: str | None = None) -> PrefixLoad:
        """The instance's prefix-load model for ``movement`` (default: the profile's)."""
        movement = self.movement if movement is None else movement
        check_movement(movement)
        return self.host_load() if movement == "swap" else RecomputeLoad()

    def record(self) -> dict[str, Any]:
        """What an instance records of its profile (``server.profile``, docs/formats.md)."""
        return {
            "name": self.name,
            "kv_bytes_per_token": self.model.kv_bytes_per_token,
            "swap_bytes_per_s": self.host.bytes_per_s,
        }

    def retime(self, server: ServerSpec, movement: str | None = None) -> ServerSpec:
        """``server`` with this profile's cost model, chunk, prefix movement and record.

        The KV budget, batch limit and mixed-chunk setting stay: they belong to the
        problem. Without ``movement`` a server that swaps keeps swapping (at this
        profile's rate) and one that recomputes keeps recomputing.
        """
        if movement is None:
            movement = "swap" if isinstance(server.prefix_load, HostLoad) else "recompute"
        return replace(
            server,
            cost_model=self.cost,
            chunk_tokens=self.chunk_tokens,
            prefix_load=self.prefix_load(movement),
            profile=ProfileRecord(**self.record()),
        )


def check_movement(movement: str) -> None:
    if movement not in MOVEMENTS:
        raise ProfileError(f"unknown prefix movement {movement!r} (valid: {', '.join(MOVEMENTS)})")


def retime_instance(
    instance: Instance, profile: str | None, swap_bytes_per_s: float | None = None
) -> Instance:
    """``instance`` with its server re-timed: cost model, chunk and swap rate of ``profile``
    (default: the profile it records, else the project's), at ``swap_bytes_per_s`` if given.

    The KV budget, the agents and the tasks stay: they are the problem; the profile is how
    fast the server solves it. A server that recomputes prefixes keeps recomputing.
    """
    server = instance.server
    name = profile or (server.profile.name if server.profile else None) or DEFAULT_PROFILE
    prof = get_profile(name)
    if swap_bytes_per_s is not None:
        prof = prof.with_swap(swap_bytes_per_s)
    return replace(instance, server=prof.retime(server))


def profiles_table(profiles: Iterable[ServerProfile]) -> str:
    """One line per profile: the numbers that set its regime."""
    rows = [("name", "GPU", "KV/token", "KV budget", "chunk", "B_swap", "swap tok/s", "movement")]
    for p in profiles:
        budget = "per workload" if p.kv_capacity_tokens is None else f"{p.kv_capacity_tokens:,}"
        rows.append(
            (
                p.name,
                p.gpu,
                f"{p.model.kv_bytes_per_token // 1024} KiB",
                budget,
                str(p.chunk_tokens),
                f"{p.host.bytes_per_s / 1e9:g} GB/s",
                f"{p.swap_tokens_per_s:,.0f}",
                p.movement,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def describe_profile(p: ServerProfile) -> str:
    """Every number of one profile, for ``topas profiles NAME``."""
    m, c = p.model, p.cost
    budget = (
        "sized per workload (prefix_share rule)"
        if p.kv_capacity_tokens is None
        else f"{p.kv_capacity_tokens} tokens"
    )
    return "\n".join(
        [
            f"{p.name}: {p.description}",
            f"  model      {m.name}: {m.layers} layers, hidden {m.hidden}, MLP {m.mlp}, "
            f"{m.q_heads}/{m.kv_heads} query/KV heads x {m.head_dim}",
            f"  KV/token   {m.kv_bytes_per_token} bytes (mu)",
            f"  GPU        {p.gpu}; KV budget {budget}; chunk {p.chunk_tokens} tokens",
            f"  cost (s)   base {c.base_s:.6g} + prefill_token {c.prefill_token_s:.6g}*P "
            f"+ decode_seq {c.decode_seq_s:.6g}*D + kv_token {c.kv_token_s:.6g}*K",
            f"  host tier  {p.host.link}, B_swap {p.host.bytes_per_s / 1e9:g} GB/s = "
            f"{p.swap_tokens_per_s:,.0f} prefix tokens/s; overlaps compute: "
            f"{'yes' if p.host.overlaps_compute else 'no'}; eviction free (write-through): "
            f"{'yes' if p.host.free_eviction else 'no'}",
            f"  movement   {p.movement} by default",
        ]
    )


def sglang_kv_tokens(
    gpu_bytes: float,
    mem_fraction_static: float,
    weight_bytes: float,
    other_bytes: float,
    kv_bytes_per_token: int,
) -> int:
    """The KV pool SGLang allocates: ``(gpu * mem_fraction_static - weights - other) / mu``.

    SGLang (``model_runner.profile_max_num_token``) takes the memory still free after
    loading the weights and subtracts the share it keeps out of the static pool,
    ``gpu * (1 - mem_fraction_static)``; what remains is divided by the bytes of one
    token's KV. ``gpu_bytes`` is the memory SGLang finds free before loading (the CUDA
    context is already up then); ``other_bytes`` is what loading allocates besides the
    weights (RoPE caches and the like).
    """
    rest = gpu_bytes * mem_fraction_static - weight_bytes - other_bytes
    if rest <= 0:
        raise ProfileError("the weights leave no memory for the KV cache")
    return int(rest // kv_bytes_per_token)


# --------------------------------------------------------------------------- the profiles
# Every number below, with its source, is in docs/profiles.md. The cost coefficients are
# printed by ``python analysis/fit_timing.py --profile NAME`` (the repr of each float) and
# tests/test_profiles.py refits them: change the data or the fit, never these numbers.

MIB = 1 << 20

LLAMA_3_8B = ModelShape(
    name="Llama-3-8B",
    layers=32,
    hidden=4096,
    mlp=14336,
    q_heads=32,
    kv_heads=8,
    head_dim=128,
    vocab=128256,
    params=8_030_261_248,
)
"""meta-llama/Meta-Llama-3-8B config.json; 128 KiB of KV per token in bf16."""

QWEN2_5_32B = ModelShape(
    name="Qwen2.5-32B-Instruct",
    layers=64,
    hidden=5120,
    mlp=27648,
    q_heads=40,
    kv_heads=8,
    head_dim=128,
    vocab=152064,
    params=32_763_876_352,
)
"""Qwen/Qwen2.5-32B-Instruct config.json (untied LM head, QKV bias); 256 KiB of KV per
token in bf16. ``params`` counted from the config: 64 x 487,605,248 per layer plus
2 x 152064 x 5120 (embedding, LM head) plus 5120 (final norm)."""

# ---- host tiers: B_swap is the measured pinned host-to-device copy bandwidth of the link.

PCIE_GEN4_X16 = HostTier(link="PCIe Gen4 x16", bytes_per_s=26e9)
"""A100's host link. nvbandwidth ``host_to_device_memcpy_ce`` (pinned, copy engine):
25.94-26.19 GB/s on the 8-GPU A100 system of nvbandwidth's README; 25.13 GB/s
(SM copy) on an A100-SXM4 (NVIDIA/nvbandwidth#42); 31.5 GB/s is the link's raw rate."""

PCIE_GEN5_X16 = HostTier(link="PCIe Gen5 x16", bytes_per_s=55e9)
"""H100's and H200's host link. nvbandwidth ``host_to_device_memcpy_ce``: 55.28-55.34 GB/s
on 8 Hopper GPUs (H800); 63.0 GB/s is the link's raw rate."""

# ---- SGLang's defaults (v0.5.3, server_args.py, ServerArgs._handle_gpu_memory_settings)


def sglang_gpu_defaults(gpu_mem_mib: float, tp_size: int = 1) -> tuple[int, int, float]:
    """``(chunked_prefill_size, cuda_graph_max_bs, mem_fraction_static)`` SGLang v0.5.3
    picks for a CUDA GPU of ``gpu_mem_mib`` MiB (``nvidia-smi --query-gpu=memory.total``),
    with no speculative decoding, no DP attention and one pipeline stage.

    The chunk and the CUDA-graph batch size are read off the memory class; the memory
    kept out of the static pool is ``512 + 1.5*max(chunk, 2048) + 2*cuda_graph_max_bs +
    1024*tp/8`` MiB, at least 10 GiB above 60 GiB of memory, and
    ``mem_fraction_static = round((gpu - reserved) / gpu, 3)``.
    """
    small = tp_size < 4
    if gpu_mem_mib < 20 * 1024:
        chunk, graph_bs = 2048, 8
    elif gpu_mem_mib < 35 * 1024:
        chunk, graph_bs = 2048, 16 if small else 80
    elif gpu_mem_mib < 60 * 1024:
        chunk, graph_bs = 4096, 32 if small else 160
    elif gpu_mem_mib < 160 * 1024:  # 60-90 GiB (A100/H100 80GB) and 90-160 GiB (H200)
        chunk, graph_bs = 8192, 256 if small else 512
    else:
        chunk, graph_bs = 16384, 512
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp_size / 8 * 1024
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return chunk, graph_bs, round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


# nvidia-smi memory.total of each GPU, in MiB: what SGLang's heuristics read.
A100_80GB_MIB = 81920
H100_80GB_MIB = 81559
H200_MIB = 143771

# ---- the KV budget of Qwen2.5-32B on one A100-80GB, as SGLang v0.5.3 sizes it

A100_80GB_CUDA_BYTES = 79.15 * GIB
"""What CUDA reports as the A100-80GB's total memory (cudaMemGetInfo; PyTorch prints
"total capacity of 79.15 GiB"); ECC and the driver keep the rest of the 80 GiB."""
CUDA_CONTEXT_BYTES = 0.5 * GIB
"""CUDA context, cuBLAS and torch.distributed before SGLang's first measurement (SGLang
logs "Load weight begin. avail mem=78.3-78.8 GB" on 80 GB GPUs)."""
SGLANG_LOAD_EXTRA_BYTES = 0.1 * GIB
"""Buffers besides the weights allocated while the model loads (RoPE caches and the
like: SGLang's "mem usage" at load exceeds the bf16 weights by 0.06-0.13 GiB)."""
QWEN_A100_CHUNK, _QWEN_A100_GRAPH_BS, QWEN_A100_MEM_FRACTION = sglang_gpu_defaults(A100_80GB_MIB)
QWEN_A100_KV_TOKENS = sglang_kv_tokens(
    gpu_bytes=A100_80GB_CUDA_BYTES - CUDA_CONTEXT_BYTES,
    mem_fraction_static=QWEN_A100_MEM_FRACTION,
    weight_bytes=QWEN2_5_32B.weight_bytes,
    other_bytes=SGLANG_LOAD_EXTRA_BYTES,
    kv_bytes_per_token=QWEN2_5_32B.kv_bytes_per_token,
)
"""``max_total_num_tokens`` of ``model_runner.profile_max_num_token``: ``gpu_bytes`` is the
free memory SGLang measures before loading (its ``total_gpu_memory``), the weights and
the load-time buffers are what it no longer finds free after loading."""

# ---- the profiles

LLAMA_3_8B_H100 = ServerProfile(
    name="llama-3-8b/h100",
    model=LLAMA_3_8B,
    gpu="H100 SXM 80GB",
    cost=DEFAULT_LINEAR,
    chunk_tokens=2048,
    host=PCIE_GEN5_X16,
    kv_capacity_tokens=None,
    movement="recompute",
    description="the project's default: Llama-3-8B on one H100, fitted from Vidur's profiles",
)
"""``chunk_tokens`` stays the project's historical 2048 (SGLang v0.5.3 would pick 8192 on
an 80 GB H100: ``sglang_gpu_defaults(H100_80GB_MIB)``), so that existing results keep
their meaning."""

LLAMA_3_8B_H200 = ServerProfile(
    name="llama-3-8b/h200",
    model=LLAMA_3_8B,
    gpu="H200 141GB",
    cost=LinearCost(
        base_s=0.007040902703682986,
        prefill_token_s=2.823241281440566e-05,
        decode_seq_s=1.958174958746523e-05,
        kv_token_s=3.1202909621030137e-08,
    ),
    chunk_tokens=sglang_gpu_defaults(H200_MIB)[0],
    host=PCIE_GEN5_X16,
    kv_capacity_tokens=None,
    movement="recompute",
    description=(
        "Llama-3-8B on one H200: least-squares refit of whole iterations measured on this "
        "project's H200 (plain PyTorch, CUDA graphs)"
    ),
)

QWEN2_5_32B_A100 = ServerProfile(
    name="qwen2.5-32b/a100-80gb",
    model=QWEN2_5_32B,
    gpu="A100-SXM4-80GB",
    cost=LinearCost(
        base_s=0.038553147160156676,
        prefill_token_s=0.00026915267282743774,
        decode_seq_s=0.00017978098318851695,
        kv_token_s=1.5125292098202696e-07,
    ),
    chunk_tokens=QWEN_A100_CHUNK,
    host=PCIE_GEN4_X16,
    kv_capacity_tokens=QWEN_A100_KV_TOKENS,
    movement="swap",
    description=(
        "the TOPAS paper's setting: Qwen2.5-32B-Instruct on one A100-80GB under SGLang "
        "v0.5.3 defaults, fitted from Vidur's A100 CodeLlama-34B profile"
    ),
)

DEFAULT_PROFILE = LLAMA_3_8B_H100.name

PROFILES: dict[str, ServerProfile] = {
    p.name: p for p in (LLAMA_3_8B_H100, LLAMA_3_8B_H200, QWEN2_5_32B_A100)
}


def get_profile(name: str) -> ServerProfile:
    """The profile called ``name``; :class:`ProfileError` naming the valid ones otherwise."""
    try:
        return PROFILES[name]
    except (KeyError, TypeError):
        raise ProfileError(f"unknown profile {name!r} (valid: {', '.join(PROFILES)})") from None
