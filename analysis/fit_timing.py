"""Calibrate the iteration-time model of the simulator, one server profile at a time.

The calibrated model (DESIGN.md, "Calibrated model") prices one engine iteration as

    base_s + prefill_token_s*prefill_tokens + decode_seq_s*decode_seqs + kv_token_s*kv_tokens_read

with four coefficients per server profile (``topas.profiles``: a model shape on a GPU).
This script reproduces each profile's coefficients from measured data kept in the project:

* ``llama-3-8b/h100`` (the default): Vidur's public H100 operator profile of the
  Llama-2-7B shape, scaled per operator to Llama-3-8B, plus an LM-head estimate;
  cross-checked against Vidur's A100 Llama-3-8B profile (docs/calibration.md);
* ``llama-3-8b/h200``: the least-squares refit of whole iterations measured on an H200
  (``analysis/data/h200_iteration_times_{a,b}.json``, the refit that
  ``analysis/gpu_iteration_times.py compare`` computes);
* ``qwen2.5-32b/a100-80gb``: Vidur's A100 profile of the CodeLlama-34B shape, scaled per
  operator to Qwen2.5-32B, plus an LM-head estimate; cross-checked against Vidur's H100
  profile of the same shape (docs/profiles.md).

Usage::

    python analysis/fit_timing.py [--profile NAME] [--data-dir DIR] [--out DIR]

Writes ``fit.json``, ``fit.png`` and ``summary.md`` to the output folder (default
``results/timing_fit/<profile, "/" replaced by "_">`` under the repository root) and prints
the parameters. ``fit(data_dir, profile=NAME)`` returns the same numbers as a dict for
tests and other scripts. The Vidur files are in ``analysis/data/vidur-profiles`` (see its
README); ``--data-dir`` points the script elsewhere.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
ANALYSIS_DIR = REPO_ROOT / "analysis"
DEFAULT_DATA_DIR = ANALYSIS_DIR / "data" / "vidur-profiles"  # Vidur's profiles, in the repo
GPU_DATA_DIR = ANALYSIS_DIR / "data"  # this project's own GPU measurements
DEFAULT_OUT_DIR = REPO_ROOT / "results" / "timing_fit"  # one sub-folder per profile

H100_FILE = "h100-llama-2-7b-mlp.csv"  # H100, Llama-2-7B shape: the primary measurements
A100_FILE = "a100-llama-3-8b-mlp.csv"  # A100, Llama-3-8B shape: the cross-check
A100_34B_FILE = "a100-codellama-34b-mlp.csv"  # A100, CodeLlama-34B shape: Qwen2.5-32B's source
H100_34B_FILE = "h100-codellama-34b-mlp.csv"  # H100, same shape: its cross-check
SOURCE = "microsoft/vidur data/profiling/compute/, commit 7d47513 (MIT)"

# Operators in the Vidur MLP profile, in file order. ``emb`` is the token-embedding gather,
# once per forward pass; the other nine run once per transformer layer (Vidur's
# ExecutionTime.model_time sums exactly these nine per layer and skips emb and the LM head).
OPS = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
LAYER_OPS = OPS[1:]
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("input_layernorm", "post_attention_layernorm", "add", "attn_rope", "mlp_act")
SAME_SHAPE_ELEMENTWISE = ("input_layernorm", "post_attention_layernorm", "add")

# H100 SXM5 datasheet: 3.35 TB/s HBM3, 989.4 TFLOP/s dense BF16 tensor core.
H100_HBM_BYTES_S = 3.35e12
H100_BF16_FLOPS = 989.4e12
# A100 80GB SXM datasheet: 2,039 GB/s HBM2e, 312 TFLOP/s dense BF16 tensor core.
A100_80GB_HBM_BYTES_S = 2.039e12
A100_BF16_FLOPS = 312e12
# Achievable fraction of peak HBM bandwidth for the decode-attention KV stream. Memory-bound
# decode kernels (FlashInfer, FlashDecoding) are reported at roughly 80-90% of peak; the
# largest memory-bound GEMM in the H100 profile itself reaches ~84% (printed as a check).
KV_BW_FRACTION = 0.85
# Achievable fraction of peak BF16 for prefill attention (head dim 128): FlashAttention-2
# reaches ~35% of H100 peak and FlashAttention-3 up to ~75% (Shah et al. 2024); midpoint.
ATTN_FLOPS_FRACTION = 0.5
BYTES_PER_ELEM = 2  # bf16

# Fit regions (num_tokens): decode batches are small, prefill chunks large.
DECODE_MAX_N = 256
PREFILL_MIN_N = 512
# Running-median window (grid points) for the A100 -> H100 speed ratio in the cross-check.
RATIO_WINDOW = 9


@dataclass(frozen=True)
class Shape:
    """The dimensions of a Llama-style decoder that the operator costs depend on."""

    name: str
    layers: int
    hidden: int
    mlp: int  # intermediate size of the gated MLP (up_proj has 2*mlp outputs)
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    def gemm_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer in one transformer layer."""
        qkv = (self.q_heads + 2 * self.kv_heads) * self.head_dim
        return {
            "attn_pre_proj": (self.hidden, qkv),
            "attn_post_proj": (self.q_heads * self.head_dim, self.hidden),
            "mlp_up_proj": (self.hidden, 2 * self.mlp),
            "mlp_down_proj": (self.mlp, self.hidden),
        }

    def elementwise_size(self) -> dict[str, int]:
        """Elements touched per token by each element-wise operator (read + write)."""
        return {
            "input_layernorm": 2 * self.hidden,
            "post_attention_layernorm": 2 * self.hidden,
            "add": 3 * self.hidden,
            # RoPE rotates q and k in place: read + write of (q_heads + kv_heads) heads.
            "attn_rope": 2 * (self.q_heads + self.kv_heads) * self.head_dim,
            # SiLU-and-mul reads 2*mlp and writes mlp values.
            "mlp_act": 3 * self.mlp,
            # Embedding gather: read one row and write it, whatever the vocabulary size.
            "emb": 2 * self.hidden,
        }

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token over all layers (K and V)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * BYTES_PER_ELEM

    def weight_params(self) -> dict[str, int]:
        """Parameter counts: all layers' linear weights, the LM head, the embedding table."""
        per_layer = sum(k * m for k, m in self.gemm_dims().values())
        return {
            "layers": self.layers * per_layer,
            "lm_head": self.hidden * self.vocab,
            "embedding": self.hidden * self.vocab,
            "norms": self.layers * 2 * self.hidden + self.hidden,
        }

    def describe(self) -> str:
        return (
            f"{self.name} (GQA {self.q_heads}q/{self.kv_heads}kv, head {self.head_dim}, "
            f"MLP {self.mlp}, vocab {self.vocab}, bf16)"
        )


# Hugging Face configs. Vocabulary sizes of the profiled shapes do not affect any measured
# operator (Vidur's files list 32768 for both; the LM head is estimated, not measured).
LLAMA2_7B = Shape("Llama-2-7B", 32, 4096, 11008, 32, 32, 128, 32000)
LLAMA3_8B = Shape("Llama-3-8B", 32, 4096, 14336, 32, 8, 128, 128256)
CODELLAMA_34B = Shape("CodeLlama-34B", 48, 8192, 22016, 64, 8, 128, 32000)
# Qwen/Qwen2.5-32B-Instruct config.json: hidden 5120, intermediate 27648, 64 layers,
# 40 attention heads, 8 KV heads (head dim 5120/40 = 128), vocab 152064, untied LM head.
QWEN25_32B = Shape("Qwen2.5-32B", 64, 5120, 27648, 40, 8, 128, 152064)
# The CSV columns that identify a profile's shape, with the value each file must carry.
SHAPE_COLUMNS = {
    H100_FILE: {"n_embd": 4096, "n_expanded_embd": 11008, "n_head": 32, "n_kv_head": 32},
    A100_FILE: {"n_embd": 4096, "n_expanded_embd": 14336, "n_head": 32, "n_kv_head": 8},
    A100_34B_FILE: {"n_embd": 8192, "n_expanded_embd": 22016, "n_head": 64, "n_kv_head": 8},
    H100_34B_FILE: {"n_embd": 8192, "n_expanded_embd": 22016, "n_head": 64, "n_kv_head": 8},
}


@dataclass(frozen=True)
class Gpu:
    """Datasheet peaks of one GPU: dense BF16 tensor-core FLOP/s and HBM bytes/s."""

    name: str
    hbm_bytes_s: float
    bf16_flops: float


H100 = Gpu("H100 SXM", H100_HBM_BYTES_S, H100_BF16_FLOPS)
A100_80GB = Gpu("A100-SXM4-80GB", A100_80GB_HBM_BYTES_S, A100_BF16_FLOPS)


@dataclass(frozen=True)
class FitSpec:
    """How one server profile's coefficients are reproduced.

    ``kind``: ``"vidur-llama"`` (the H100 Llama-3-8B fit with its A100 cross-check),
    ``"vidur-scaled"`` (one GPU's Vidur profile scaled from ``src`` to ``dst``, checked
    against another GPU's profile of the same shape) or ``"gpu-refit"`` (least squares
    on whole measured iterations, ``runs``; the first run gives the coefficients).
    """

    name: str
    kind: str
    hardware: str
    primary_file: str = ""
    check_file: str = ""
    src: Shape | None = None
    dst: Shape | None = None
    gpu: Gpu | None = None
    check_gpu: Gpu | None = None
    runs: tuple[str, ...] = ()


FITS: dict[str, FitSpec] = {
    spec.name: spec
    for spec in (
        FitSpec(
            "llama-3-8b/h100",
            "vidur-llama",
            "1x H100 SXM (TP=1)",
            primary_file=H100_FILE,
            check_file=A100_FILE,
            src=LLAMA2_7B,
            dst=LLAMA3_8B,
            gpu=H100,
        ),
        FitSpec(
            "llama-3-8b/h200",
            "gpu-refit",
            "1x H200 (TP=1), plain-PyTorch harness",
            runs=("h200_iteration_times_a.json", "h200_iteration_times_b.json"),
        ),
        FitSpec(
            "qwen2.5-32b/a100-80gb",
            "vidur-scaled",
            "1x A100-SXM4-80GB (TP=1)",
            primary_file=A100_34B_FILE,
            check_file=H100_34B_FILE,
            src=CODELLAMA_34B,
            dst=QWEN25_32B,
            gpu=A100_80GB,
            check_gpu=H100,
        ),
    )
}
DEFAULT_PROFILE = "llama-3-8b/h100"


def profile_dirname(name: str) -> str:
    """Output sub-folder of a profile: its name with ``/`` replaced by ``_``."""
    return name.replace("/", "_")


class DataError(Exception):
    """The profile data are missing or not what this script expects."""


class UnknownProfile(DataError):
    """A profile name this script cannot fit."""


def get_spec(name: str) -> FitSpec:
    try:
        return FITS[name]
    except (KeyError, TypeError):
        raise UnknownProfile(f"unknown profile {name!r} (valid: {', '.join(FITS)})") from None


@dataclass(frozen=True)
class Profile:
    """TP=1 operator medians of one CSV, in seconds, one row per distinct num_tokens."""

    path: Path
    n: np.ndarray  # num_tokens, ascending
    ops: dict[str, np.ndarray]  # op -> median seconds at each n


def load_profile(path: Path) -> Profile:
    """Read a Vidur MLP profile: TP=1 rows, median columns, duplicate n averaged, ms -> s."""
    if not path.is_file():
        raise DataError(f"profile file not found: {path}")
    expect = SHAPE_COLUMNS.get(path.name, {})
    by_n: dict[int, list[list[float]]] = {}
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        need = ["num_tokens", "num_tensor_parallel_workers", *expect]
        need += [f"time_stats.{op}.median" for op in OPS]
        missing = [c for c in need if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"{path}: missing columns {', '.join(missing)}")
        for line, row in enumerate(reader, start=2):
            try:
                if int(float(row["num_tensor_parallel_workers"])) != 1:
                    continue
                shape = {col: int(float(row[col])) for col in expect}
                n = int(float(row["num_tokens"]))
                times = [float(row[f"time_stats.{op}.median"]) for op in OPS]
            except (TypeError, ValueError) as exc:
                raise DataError(f"{path}:{line}: unreadable value ({exc})") from None
            for col, want in expect.items():
                if shape[col] != want:
                    raise DataError(f"{path}: {col}={shape[col]}, expected {want}")
            by_n.setdefault(n, []).append(times)
    if len(by_n) < 4:
        raise DataError(f"{path}: fewer than 4 distinct num_tokens at TP=1")
    n = np.array(sorted(by_n), dtype=float)
    med = np.array([np.mean(by_n[int(k)], axis=0) for k in n]) * 1e-3
    return Profile(path, n, {op: med[:, i] for i, op in enumerate(OPS)})


# ----------------------------------------------------------------------------------------
# Shape scaling


def op_ratios(src: Shape, dst: Shape) -> dict[str, float]:
    """Per-operator time ratio dst/src, one constant per operator.

    A GEMM of n tokens through a (k x m) weight does 2nkm FLOPs and reads 2km weight bytes,
    so its FLOP ratio (compute-bound regime) and weight-byte ratio (memory-bound regime)
    between two shapes are the same number k'm'/(km): one constant covers both regimes.
    Element-wise operators scale with the elements they touch per token.
    """
    ratios = {}
    sg, dg = src.gemm_dims(), dst.gemm_dims()
    for op in GEMM_OPS:
        ratios[op] = (dg[op][0] * dg[op][1]) / (sg[op][0] * sg[op][1])
    se, de = src.elementwise_size(), dst.elementwise_size()
    for op in (*ELEMENTWISE_OPS, "emb"):
        ratios[op] = de[op] / se[op]
    return ratios


def lm_head_ratio(src: Shape, dst: Shape) -> float:
    """LM head (hidden x vocab of ``dst``) time over ``src``'s mlp_up_proj (hidden x 2*mlp)."""
    k, m = src.gemm_dims()["mlp_up_proj"]
    return (dst.hidden * dst.vocab) / (k * m)


def roofline_s(flops: np.ndarray, nbytes: np.ndarray, gpu: Gpu = H100) -> np.ndarray:
    """Roofline time at the GPU's peaks (default H100): max(compute, memory)."""
    return np.maximum(flops / gpu.bf16_flops, nbytes / gpu.hbm_bytes_s)


def gemm_roofline_s(n: np.ndarray, k: int, m: int, gpu: Gpu = H100) -> np.ndarray:
    """Roofline time of an n x k by k x m GEMM in bf16, including activation traffic."""
    return roofline_s(2.0 * n * k * m, BYTES_PER_ELEM * (k * m + n * (k + m)), gpu)


def roofline_ratio_deviation(
    n: np.ndarray, src: Shape, dst: Shape, gpu: Gpu = H100
) -> dict[str, float]:
    """Largest relative gap between the constant GEMM ratio and a full roofline ratio.

    The full roofline also counts activation bytes n*(k+m), which the constant ratio leaves
    out; this reports how much that matters over the measured n.
    """
    const = op_ratios(src, dst)
    sg, dg = src.gemm_dims(), dst.gemm_dims()
    out = {}
    for op in GEMM_OPS:
        r = gemm_roofline_s(n, *dg[op], gpu) / gemm_roofline_s(n, *sg[op], gpu)
        out[op] = float(np.max(np.abs(r / const[op] - 1.0)))
    return out


@dataclass(frozen=True)
class Curves:
    """Iteration time of the linear part of the target shape at each measured n."""

    n: np.ndarray
    decode: np.ndarray  # n sequences decoding one token each: LM head over n rows
    prefill: np.ndarray  # one prompt chunk of n tokens: LM head over its last token only
    layers: np.ndarray  # layers x (sum of per-layer ops)
    emb: np.ndarray
    lm_head_decode: np.ndarray
    lm_head_prefill: float


def scaled_curves(prof: Profile, src: Shape, dst: Shape) -> Curves:
    """Scale operator measurements of the ``src`` shape to ``dst`` and assemble T(n).

    T(n) = emb(n) + dst.layers * sum_op r_op * op(n) + LM head, where the LM head (absent
    from the data) is the measured mlp_up_proj scaled by the vocab x hidden / hidden x 2*mlp
    ratio (the same FLOP = weight-byte argument as the layer GEMMs). A decode batch of n
    sequences computes logits for all n rows; a prefill chunk only for its last token.
    """
    r = op_ratios(src, dst)
    per_layer = sum(r[op] * prof.ops[op] for op in LAYER_OPS)
    layers = dst.layers * per_layer
    emb = r["emb"] * prof.ops["emb"]
    lm = lm_head_ratio(src, dst) * prof.ops["mlp_up_proj"]
    lm_one = float(np.interp(1.0, prof.n, lm))
    return Curves(
        n=prof.n,
        decode=emb + layers + lm,
        prefill=emb + layers + lm_one,
        layers=layers,
        emb=emb,
        lm_head_decode=lm,
        lm_head_prefill=lm_one,
    )


def h100_llama3_curves(h100: Profile) -> Curves:
    """The H100 Llama-2-7B measurements scaled to Llama-3-8B (the default profile)."""
    return scaled_curves(h100, LLAMA2_7B, LLAMA3_8B)


# ----------------------------------------------------------------------------------------
# Fits


def fit_line_rel(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least squares a + b*x ~ y minimising the squared *relative* residuals."""
    a_mat = np.column_stack([1.0 / y, x / y])
    (a, b), *_ = np.linalg.lstsq(a_mat, np.ones_like(y), rcond=None)
    return float(a), float(b)


def fit_slope_rel(x: np.ndarray, y: np.ndarray, intercept: float) -> float:
    """Least squares slope b of intercept + b*x ~ y (relative residuals), intercept fixed."""
    u = x / y
    v = (y - intercept) / y
    return float(np.dot(u, v) / np.dot(u, u))


def rel_residuals(x: np.ndarray, y: np.ndarray, a: float, b: float) -> np.ndarray:
    return (a + b * x) / y - 1.0


def residual_stats(res: np.ndarray) -> dict[str, float]:
    return {
        "max_abs_rel": float(np.max(np.abs(res))),
        "rms_rel": float(np.sqrt(np.mean(res**2))),
        "mean_rel": float(np.mean(res)),
    }


# ----------------------------------------------------------------------------------------
# Cross-check against the A100 Llama-3-8B profile


def running_median(x: np.ndarray, window: int) -> np.ndarray:
    half = window // 2
    return np.array([np.median(x[max(0, i - half) : i + half + 1]) for i in range(len(x))])


def cross_check(h100: Profile, a100: Profile, curves: Curves, params: dict) -> dict:
    """Estimate the same T(n) from the A100 Llama-3-8B data times measured H100/A100 ratios.

    The speed ratio is measured on operators of identical shape in both files: the 4096x4096
    output projection for GEMMs and the two RMSNorms plus the residual add for element-wise
    operators, per n (running median over neighbouring n to damp the 1 us timer resolution).
    Beyond the H100 grid (n > max H100 n) the compute-bound ratio, the median over the top
    quarter of the H100 grid, extrapolates the A100 data to 32K tokens.
    """
    common = np.intersect1d(h100.n, a100.n)
    hi = np.searchsorted(h100.n, common)
    ai = np.searchsorted(a100.n, common)
    gemm_r = running_median(
        h100.ops["attn_post_proj"][hi] / a100.ops["attn_post_proj"][ai], RATIO_WINDOW
    )
    h_el = sum(h100.ops[op][hi] for op in SAME_SHAPE_ELEMENTWISE)
    a_el = sum(a100.ops[op][ai] for op in SAME_SHAPE_ELEMENTWISE)
    elem_r = running_median(h_el / a_el, RATIO_WINDOW)

    top = common >= common[-1] * 0.5
    gemm_r_big = float(np.median(gemm_r[top]))
    elem_r_big = float(np.median(elem_r[top]))
    gemm_all = np.where(a100.n <= common[-1], np.interp(a100.n, common, gemm_r), gemm_r_big)
    elem_all = np.where(a100.n <= common[-1], np.interp(a100.n, common, elem_r), elem_r_big)

    layer = sum(a100.ops[op] * gemm_all for op in GEMM_OPS)
    layer = layer + sum(a100.ops[op] * elem_all for op in ELEMENTWISE_OPS)
    layers = LLAMA3_8B.layers * layer
    emb = a100.ops["emb"] * elem_all
    lm = lm_head_ratio(LLAMA3_8B, LLAMA3_8B) * a100.ops["mlp_up_proj"] * gemm_all
    lm_one = float(np.interp(1.0, a100.n, lm))
    est_decode = emb + layers + lm
    est_prefill = emb + layers + lm_one

    sel = np.isin(a100.n, common)
    dec = common <= DECODE_MAX_N
    pre = common >= PREFILL_MIN_N
    ci = np.searchsorted(curves.n, common)
    d_diff = curves.decode[ci] / est_decode[sel] - 1.0
    p_diff = curves.prefill[ci] / est_prefill[sel] - 1.0
    bands = {
        "memory_bound_n_le_128": residual_stats(d_diff[common <= 128]),
        "knee_128_lt_n_lt_1024": residual_stats(p_diff[(common > 128) & (common < 1024)]),
        "compute_bound_n_ge_1024": residual_stats(p_diff[common >= 1024]),
    }

    beyond = a100.n > common[-1]
    ext = {}
    if np.any(beyond):
        res = rel_residuals(
            a100.n[beyond], est_prefill[beyond], params["base_s"], params["prefill_token_s"]
        )
        ext = {
            "n_range": [int(a100.n[beyond][0]), int(a100.n[beyond][-1])],
            "model_vs_a100_derived": residual_stats(res),
        }

    def at(n_val: int) -> dict[str, float]:
        i = int(np.searchsorted(common, n_val))
        j = int(np.searchsorted(a100.n, n_val))
        return {
            "primary_decode_s": float(curves.decode[ci[i]]),
            "a100_derived_decode_s": float(est_decode[j]),
            "primary_prefill_s": float(curves.prefill[ci[i]]),
            "a100_derived_prefill_s": float(est_prefill[j]),
        }

    points = {str(k): at(k) for k in (1, 64, 256, 1024, 4096) if k in set(common.astype(int))}
    return {
        "method": (
            "A100 Llama-3-8B op medians x per-n H100/A100 speed ratio measured on same-shape "
            "ops (attn_post_proj for GEMMs; layernorms+add for element-wise ops)"
        ),
        "speed_ratio_gemm": {
            "n=1": float(gemm_r[0]),
            f"n={int(common[-1])}": float(gemm_r[-1]),
            "compute_bound_median": gemm_r_big,
        },
        "speed_ratio_elementwise_compute_bound_median": elem_r_big,
        "decode_region": residual_stats(d_diff[dec]),
        "prefill_region": residual_stats(p_diff[pre]),
        "bands": bands,
        "all_common_n": {
            "decode": residual_stats(d_diff),
            "prefill": residual_stats(p_diff),
        },
        "points": points,
        "extrapolation": ext,
        "_curves": {
            "n": a100.n.tolist(),
            "decode_s": est_decode.tolist(),
            "prefill_s": est_prefill.tolist(),
        },
    }


# ----------------------------------------------------------------------------------------
# Cross-check of a scaled profile against another GPU's profile of the same shape

MEMORY_BOUND_MAX_N = 16  # GEMMs of these shapes are weight-read bound up to here
COMPUTE_BOUND_MIN_N = 2048  # ... and compute bound from here


def gpu_ratio_check(
    primary: Profile, other: Profile, curves: Curves, spec: FitSpec, params: dict
) -> dict:
    """The speed ratio between two GPUs measured on the *same* shape, against the datasheets.

    Per GEMM and per n, speed-up = primary time / other time (for the Qwen profile:
    A100 / H100). A memory-bound GEMM (n <= 16: the weights are read once) should speed up
    by the HBM bandwidth ratio, a compute-bound one (n >= 2048) by the dense BF16 peak
    ratio. The other GPU's data, scaled to the target shape exactly as the primary's,
    give its own T(n) and four coefficients, compared with the primary's.
    """
    src, dst, gpu, og = spec.src, spec.dst, spec.gpu, spec.check_gpu
    assert src is not None and dst is not None and gpu is not None and og is not None
    common = np.intersect1d(primary.n, other.n)
    pi = np.searchsorted(primary.n, common)
    oi = np.searchsorted(other.n, common)
    mem = common <= MEMORY_BOUND_MAX_N
    comp = common >= COMPUTE_BOUND_MIN_N
    if not (mem.any() and comp.any()):
        raise DataError(f"{other.path}: no memory-bound or compute-bound n in common")

    def speedups(t_primary: np.ndarray, t_other: np.ndarray) -> dict[str, float]:
        r = t_primary / t_other
        return {
            "n=1": float(r[0]),
            "memory_bound_median": float(np.median(r[mem])),
            "compute_bound_median": float(np.median(r[comp])),
        }

    per_op = {op: speedups(primary.ops[op][pi], other.ops[op][oi]) for op in GEMM_OPS}
    gemms = speedups(
        sum(primary.ops[op][pi] for op in GEMM_OPS), sum(other.ops[op][oi] for op in GEMM_OPS)
    )
    elementwise = speedups(
        sum(primary.ops[op][pi] for op in ELEMENTWISE_OPS),
        sum(other.ops[op][oi] for op in ELEMENTWISE_OPS),
    )
    oc = scaled_curves(other, src, dst)
    ci = np.searchsorted(curves.n, common)
    whole = {
        "decode": speedups(curves.decode[ci], oc.decode[oi]),
        "prefill": speedups(curves.prefill[ci], oc.prefill[oi]),
    }
    bw_ratio = og.hbm_bytes_s / gpu.hbm_bytes_s
    flops_ratio = og.bf16_flops / gpu.bf16_flops

    # The other GPU's own four coefficients, by the same method.
    on = oc.n
    dec, pre = on <= DECODE_MAX_N, on >= PREFILL_MIN_N
    o_base, o_decode = fit_line_rel(on[dec], oc.decode[dec])
    o_prefill = fit_slope_rel(on[pre], oc.prefill[pre], o_base)
    other_params = {
        "base_s": o_base,
        "prefill_token_s": o_prefill,
        "decode_seq_s": o_decode,
    }
    return {
        "method": (
            f"{gpu.name} / {og.name} time ratio on the same profiled shape ({src.name}), "
            "per GEMM and for the whole scaled T(n), against the datasheet ratios"
        ),
        "primary_gpu": gpu.name,
        "other_gpu": og.name,
        "datasheet": {
            "hbm_bandwidth_ratio": bw_ratio,
            "bf16_flops_ratio": flops_ratio,
        },
        "speedup_gemm": per_op,
        "speedup_all_gemms": gemms,
        "speedup_elementwise": elementwise,
        "speedup_whole_iteration": whole,
        "memory_bound_vs_bandwidth_ratio": gemms["memory_bound_median"] / bw_ratio - 1.0,
        "compute_bound_vs_flops_ratio": gemms["compute_bound_median"] / flops_ratio - 1.0,
        "other_gpu_fit": other_params,
        "coefficient_ratio_primary_over_other": {
            k: params[k] / other_params[k] for k in ("base_s", "prefill_token_s", "decode_seq_s")
        },
        "_curves": {
            "n": oc.n.tolist(),
            "decode_s": oc.decode.tolist(),
            "prefill_s": oc.prefill.tolist(),
        },
    }


# ----------------------------------------------------------------------------------------
# Attention


def kv_token_s(
    kv_bw_fraction: float = KV_BW_FRACTION, shape: Shape = LLAMA3_8B, gpu: Gpu = H100
) -> float:
    """Seconds to stream one token's KV (all layers) at the achievable HBM bandwidth."""
    return shape.kv_bytes_per_token() / (kv_bw_fraction * gpu.hbm_bytes_s)


def prefill_attention(
    params: dict, attn_flops_fraction: float, shape: Shape = LLAMA3_8B, gpu: Gpu = H100
) -> dict:
    """Prefill attention compute, which the four-term model does not carry, at a few lengths.

    A query attending to one key costs 4*q_heads*head_dim FLOPs per layer (QK^T and PV).
    A prompt of L tokens prefilled from scratch (causal) has L(L+1)/2 query-key pairs.
    """
    s = shape
    pair_flops = 4 * s.q_heads * s.head_dim * s.layers
    pair_s = pair_flops / (attn_flops_fraction * gpu.bf16_flops)
    rows = {}
    for length in (2048, 8192, 32768):
        pairs = length * (length + 1) / 2
        attn = pairs * pair_s
        linear = params["base_s"] + params["prefill_token_s"] * length
        kv_term = params["kv_token_s"] * length
        attn_flops = pairs * pair_flops
        linear_flops = 2.0 * length * s.weight_params()["layers"]
        rows[str(length)] = {
            "attention_s": attn,
            "linear_s": linear,
            "attention_share_of_total": attn / (attn + linear),
            "attention_flops_share": attn_flops / (attn_flops + linear_flops),
            "kv_term_s": kv_term,
            "kv_term_covers_fraction": kv_term / attn,
            "per_token_fold_in_s": pair_s * (length + 1) / 2,
        }
    return {
        "pair_flops": pair_flops,
        "attn_flops_fraction": attn_flops_fraction,
        "pair_s": pair_s,
        "by_prompt_length": rows,
    }


# ----------------------------------------------------------------------------------------
# The fit


def fit(
    data_dir: Path | str | None = None,
    *,
    profile: str = DEFAULT_PROFILE,
    kv_bw_fraction: float = KV_BW_FRACTION,
    attn_flops_fraction: float = ATTN_FLOPS_FRACTION,
) -> dict:
    """Fit the four coefficients of ``profile`` from the data in ``data_dir``; seconds.

    ``data_dir`` defaults to the profile's folder in the repository
    (``analysis/data/vidur-profiles`` for the Vidur-based fits, ``analysis/data`` for the
    H200 refit). Returns a JSON-serialisable dict with ``base_s``, ``prefill_token_s``,
    ``decode_seq_s``, ``kv_token_s`` and diagnostics (residuals, cross-check, sanity
    numbers, curves). Raises DataError when the profile is unknown or the data are
    missing or malformed.
    """
    spec = get_spec(profile)
    if data_dir is None:
        data_dir = GPU_DATA_DIR if spec.kind == "gpu-refit" else DEFAULT_DATA_DIR
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"data directory not found: {data_dir}")
    if spec.kind == "gpu-refit":
        out = _fit_gpu_refit(spec, data_dir)
    else:
        out = _fit_vidur(spec, data_dir, kv_bw_fraction, attn_flops_fraction)
    out["profile"] = spec.name
    return out


def _fit_vidur(
    spec: FitSpec, data_dir: Path, kv_bw_fraction: float, attn_flops_fraction: float
) -> dict:
    """A fit of Vidur operator times scaled from ``spec.src`` to ``spec.dst`` on ``spec.gpu``."""
    src, dst, gpu = spec.src, spec.dst, spec.gpu
    assert src is not None and dst is not None and gpu is not None
    primary = load_profile(data_dir / spec.primary_file)
    check = load_profile(data_dir / spec.check_file)
    curves = scaled_curves(primary, src, dst)
    n = curves.n
    if np.any(curves.decode <= 0) or np.any(curves.prefill <= 0):
        raise DataError(f"{primary.path}: non-positive summed operator times")

    dec = n <= DECODE_MAX_N
    pre = n >= PREFILL_MIN_N
    if dec.sum() < 2 or pre.sum() < 2:
        raise DataError(f"{primary.path}: too few points in the decode or prefill region")

    # base_s and decode_seq_s: one line through the decode regime (n <= 256).
    base, decode_slope = fit_line_rel(n[dec], curves.decode[dec])
    # prefill_token_s: slope of the prefill chunks (n >= 512), with the same base_s, so
    # that base_s + prefill_token_s*n is what the simulator charges for a chunk of n.
    prefill_slope = fit_slope_rel(n[pre], curves.prefill[pre], base)
    # Diagnostic: the free two-parameter line through the prefill region.
    free_a, free_b = fit_line_rel(n[pre], curves.prefill[pre])

    params = {
        "base_s": base,
        "prefill_token_s": prefill_slope,
        "decode_seq_s": decode_slope,
        "kv_token_s": kv_token_s(kv_bw_fraction, dst, gpu),
    }

    # Sensitivity: one joint least squares with base_s shared by both regions, and a plain
    # (absolute) least-squares prefill slope, which weights the largest chunks most.
    nd, npf = int(dec.sum()), int(pre.sum())
    a_mat = np.zeros((nd + npf, 3))
    a_mat[:nd, 0] = 1.0 / curves.decode[dec]
    a_mat[:nd, 1] = n[dec] / curves.decode[dec]
    a_mat[nd:, 0] = 1.0 / curves.prefill[pre]
    a_mat[nd:, 2] = n[pre] / curves.prefill[pre]
    joint, *_ = np.linalg.lstsq(a_mat, np.ones(nd + npf), rcond=None)
    abs_slope = float(np.dot(n[pre], curves.prefill[pre] - base) / np.dot(n[pre], n[pre]))

    res_dec = rel_residuals(n[dec], curves.decode[dec], base, decode_slope)
    res_pre = rel_residuals(n[pre], curves.prefill[pre], base, prefill_slope)
    res_free = rel_residuals(n[pre], curves.prefill[pre], free_a, free_b)
    big = n >= 1024
    res_pre_big = rel_residuals(n[big], curves.prefill[big], base, prefill_slope)

    # Sanity numbers for base_s: the weight bytes one decode step must read.
    wp = dst.weight_params()
    all_bytes = BYTES_PER_ELEM * sum(wp.values())
    read_bytes = BYTES_PER_ELEM * (wp["layers"] + wp["lm_head"] + wp["norms"])
    up_k, up_m = src.gemm_dims()["mlp_up_proj"]
    up_bw = BYTES_PER_ELEM * up_k * up_m / float(np.interp(1.0, n, primary.ops["mlp_up_proj"]))
    bw, peak = gpu.hbm_bytes_s, gpu.bf16_flops

    out = dict(params)
    out.update(
        {
            "units": "seconds",
            "model": dst.describe(),
            "hardware": spec.hardware,
            "source": SOURCE,
            "files": {"primary": str(primary.path), "check": str(check.path)},
            "scaled_from": src.describe(),
            "regions": {
                "decode_n": [int(n[dec][0]), int(n[dec][-1])],
                "prefill_n": [int(n[pre][0]), int(n[pre][-1])],
                "decode_points": int(dec.sum()),
                "prefill_points": int(pre.sum()),
            },
            "residuals": {
                "decode": residual_stats(res_dec),
                "prefill": residual_stats(res_pre),
                "prefill_n_ge_1024": residual_stats(res_pre_big),
                "prefill_free_line": residual_stats(res_free),
            },
            "prefill_free_line": {"intercept_s": free_a, "slope_s": free_b},
            "sensitivity": {
                "joint_fit": {
                    "base_s": float(joint[0]),
                    "decode_seq_s": float(joint[1]),
                    "prefill_token_s": float(joint[2]),
                },
                "prefill_token_s_absolute_ls": abs_slope,
                "kv_token_s_at_bw_fraction": {
                    str(f): kv_token_s(f, dst, gpu) for f in (0.8, 0.85, 0.9)
                },
            },
            "scaling": {
                "op_ratios_target_over_profiled": op_ratios(src, dst),
                "lm_head_over_profiled_up_proj": lm_head_ratio(src, dst),
                "roofline_ratio_max_deviation": roofline_ratio_deviation(n, src, dst, gpu),
                "lm_head_one_row_s": curves.lm_head_prefill,
                "emb_n1_s": float(curves.emb[0]),
            },
            "sanity": {
                "weights_total_bytes": all_bytes,
                "weights_total_at_peak_bw_s": all_bytes / bw,
                "weights_read_per_decode_step_bytes": read_bytes,
                "weights_read_at_peak_bw_s": read_bytes / bw,
                "base_implied_bw_bytes_s": read_bytes / base,
                "base_implied_bw_fraction": read_bytes / base / bw,
                "measured_up_proj_n1_bw_bytes_s": up_bw,
                "measured_up_proj_n1_bw_fraction": up_bw / bw,
                "prefill_implied_flops": 2.0 * wp["layers"] / prefill_slope,
                "prefill_implied_flops_fraction": 2.0 * wp["layers"] / prefill_slope / peak,
                "t_decode_n1_s": float(curves.decode[0]),
            },
            "kv": {
                "bytes_per_token": dst.kv_bytes_per_token(),
                "hbm_peak_bytes_s": bw,
                "achievable_fraction": kv_bw_fraction,
            },
            "prefill_attention": prefill_attention(params, attn_flops_fraction, dst, gpu),
        }
    )
    if spec.kind == "vidur-llama":
        cc = cross_check(primary, check, curves, params)
    else:
        assert spec.check_gpu is not None
        cc = gpu_ratio_check(primary, check, curves, spec, params)
    out["cross_check_curves"] = cc.pop("_curves")
    out["cross_check"] = cc
    out["curves"] = {
        "n": n.tolist(),
        "decode_s": curves.decode.tolist(),
        "prefill_s": curves.prefill.tolist(),
    }
    return out


def _gpu_iteration_times():
    """``analysis/gpu_iteration_times.py``, whose ``compare`` refit the H200 profile reuses."""
    path = ANALYSIS_DIR / "gpu_iteration_times.py"
    module_spec = importlib.util.spec_from_file_location("_topas_gpu_iteration_times", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _read_runs(spec: FitSpec, data_dir: Path) -> list[tuple[Path, dict, list[dict]]]:
    runs = []
    for name in spec.runs:
        path = data_dir / name
        if not path.is_file():
            raise DataError(f"measurement file not found: {path}")
        try:
            data = json.loads(path.read_text())
            meta, points = data["meta"], data["points"]
            for p in points:
                for key in ("prefill_tokens", "decode_seqs", "kv_tokens", "median_ms"):
                    float(p[key])
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{path}: unreadable measurements ({exc!r})") from None
        if len(points) < 4:
            raise DataError(f"{path}: fewer than 4 measured points")
        runs.append((path, meta, points))
    return runs


def _fit_gpu_refit(spec: FitSpec, data_dir: Path) -> dict:
    """The least-squares refit of whole measured iterations (first run), with the others
    as a reproducibility check; exactly the refit of ``gpu_iteration_times.py compare``."""
    git = _gpu_iteration_times()
    runs = _read_runs(spec, data_dir)
    (path0, meta0, points0), *others = runs
    params = git.refit(points0)

    def errors(coef: dict, points: list[dict]) -> dict[str, float]:
        return residual_stats(np.array(git.prediction_errors(coef, points)))

    per_run = {}
    for path, meta, points in runs:
        per_run[path.name] = {
            "gpu": meta.get("gpu"),
            "points": len(points),
            "refit": git.refit(points),
            "stored_coefficients_error": errors(params, points),
        }
    pooled = git.refit([p for _, _, pts in runs for p in pts])
    spread = {
        key: max(abs(r["refit"][key] / params[key] - 1.0) for r in per_run.values())
        for key in params
    }
    out = dict(params)
    out.update(
        {
            "units": "seconds",
            "model": LLAMA3_8B.describe(),
            "hardware": spec.hardware,
            "source": (
                "this project's H200 measurements (analysis/gpu_iteration_times.py measure), "
                f"{meta0.get('gpu')}, torch {meta0.get('torch')}; relative least squares "
                "of the four terms as gpu_iteration_times.py compare"
            ),
            "files": {"runs": [str(path) for path, _, _ in runs]},
            "coefficients_from": path0.name,
            "runs": per_run,
            "pooled_refit": pooled,
            "run_spread_max_rel": spread,
            "points": [p for _, _, pts in runs for p in pts],
        }
    )
    return out


# ----------------------------------------------------------------------------------------
# Outputs


def _labels(result: dict) -> dict[str, str]:
    if result["cross_check"].get("other_gpu"):
        cc = result["cross_check"]
        short = cc["primary_gpu"].split("-")[0].split(" ")[0]
        other = cc["other_gpu"].split("-")[0].split(" ")[0]
        model = result["model"].split(" ")[0]
        return {
            "title": f"{model} on {cc['primary_gpu']} (TP=1): measured (scaled) vs fitted",
            "check": f"{other} prefill T(n), same profile scaled (cross-check)",
            "primary": f"{short} scaled",
            "beyond": "",
        }
    return {
        "title": "Llama-3-8B on H100 (TP=1): measured (scaled) vs fitted",
        "check": "A100 Llama-3-8B x H100/A100 ratio",
        "primary": "H100 scaled",
        "beyond": "prefill vs A100-derived (beyond H100 data)",
    }


def plot(result: dict, path: Path) -> None:
    """Measured (scaled) T(n) against the fitted lines, with relative residuals."""
    if "points" in result:  # a refit of whole measured iterations
        git = _gpu_iteration_times()
        coef = {k: result[k] for k in ("base_s", "prefill_token_s", "decode_seq_s", "kv_token_s")}
        git.plot_fit(result["points"], {"stored refit": coef}, path)
        return

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lab = _labels(result)
    n = np.array(result["curves"]["n"])
    td = np.array(result["curves"]["decode_s"])
    tp = np.array(result["curves"]["prefill_s"])
    an = np.array(result["cross_check_curves"]["n"])
    ap = np.array(result["cross_check_curves"]["prefill_s"])
    base, dslope = result["base_s"], result["decode_seq_s"]
    pslope = result["prefill_token_s"]

    fig, (ax, axr) = plt.subplots(
        2, 1, figsize=(7.5, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    ax.loglog(an, ap * 1e3, ".", ms=3, color="0.65", label=lab["check"])
    ax.loglog(
        n, td * 1e3, "o", ms=3, mfc="none", color="C0", label=f"decode T(n), {lab['primary']}"
    )
    ax.loglog(
        n, tp * 1e3, "s", ms=3, mfc="none", color="C1", label=f"prefill T(n), {lab['primary']}"
    )
    xd = np.geomspace(1, DECODE_MAX_N, 100)
    xp = np.geomspace(PREFILL_MIN_N, max(an.max(), n.max()), 100)
    ax.loglog(xd, (base + dslope * xd) * 1e3, "-", color="C0", label="base + decode_seq_s*n")
    ax.loglog(xp, (base + pslope * xp) * 1e3, "-", color="C1", label="base + prefill_token_s*n")
    ax.set_ylabel("iteration time, linear layers (ms)")
    ax.set_title(lab["title"])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)

    dec = n <= DECODE_MAX_N
    pre = n >= PREFILL_MIN_N
    axr.semilogx(
        n[dec], ((base + dslope * n) / td - 1)[dec] * 100, "o", ms=3, color="C0", label="decode"
    )
    axr.semilogx(
        n[pre], ((base + pslope * n) / tp - 1)[pre] * 100, "s", ms=3, color="C1", label="prefill"
    )
    big = an > n.max()
    if lab["beyond"] and big.any():
        axr.semilogx(
            an[big],
            ((base + pslope * an) / ap - 1)[big] * 100,
            ".",
            ms=3,
            color="0.5",
            label=lab["beyond"],
        )
    axr.axhline(0, color="k", lw=0.8)
    axr.legend(fontsize=8)
    axr.set_xlabel("tokens in the iteration (n)")
    axr.set_ylabel("model / measured - 1 (%)")
    axr.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _fmt_pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _reproduce(r: dict) -> str:
    if r["profile"] == DEFAULT_PROFILE:
        return "Reproduce: `python analysis/fit_timing.py`"
    return f"Reproduce: `python analysis/fit_timing.py --profile {r['profile']}`"


def _param_table(r: dict) -> list[str]:
    return [
        "| parameter | value (s) | meaning |",
        "|---|---|---|",
        f"| base_s | {r['base_s']!r} | fixed cost per iteration |",
        f"| prefill_token_s | {r['prefill_token_s']!r} | per prefill token |",
        f"| decode_seq_s | {r['decode_seq_s']!r} | per decoding sequence |",
        f"| kv_token_s | {r['kv_token_s']!r} | per KV token read |",
    ]


def summary_md(r: dict) -> str:
    """A one-page summary of a fit (the dict :func:`fit` returns)."""
    if "runs" in r:
        return _summary_refit(r)
    res, cc, s = r["residuals"], r["cross_check"], r["sanity"]
    pa = r["prefill_attention"]["by_prompt_length"]["8192"]
    hbm = r["kv"]["hbm_peak_bytes_s"]
    lines = [
        f"# Timing-model fit: {r['profile']} ({r['model'].split(' ')[0]}, {r['hardware']})",
        "",
        f"Source: {r['source']}; profiled shape {r['scaled_from']}. Method: "
        "docs/calibration.md, docs/profiles.md.",
        "",
        *_param_table(r),
        "",
        "## Fit residuals (model / measured - 1)",
        "",
        "| region | n | max abs | rms |",
        "|---|---|---|---|",
    ]
    reg = r["regions"]
    for name, key, span in (
        ("decode", "decode", reg["decode_n"]),
        ("prefill", "prefill", reg["prefill_n"]),
        ("prefill, n >= 1024", "prefill_n_ge_1024", [1024, reg["prefill_n"][1]]),
        ("prefill, free line (diagnostic)", "prefill_free_line", reg["prefill_n"]),
    ):
        st = res[key]
        lines.append(
            f"| {name} | {span[0]}-{span[1]} | {_fmt_pct(st['max_abs_rel'])} "
            f"| {_fmt_pct(st['rms_rel'])} |"
        )
    if cc.get("other_gpu"):
        lines += _summary_gpu_ratio(cc)
    else:
        lines += _summary_llama_cross_check(cc)
    lines += [
        "",
        "## Sanity",
        "",
        f"- Weights read per decode step: {s['weights_read_per_decode_step_bytes'] / 1e9:.2f} GB"
        f" -> {s['weights_read_at_peak_bw_s'] * 1e3:.2f} ms at {hbm / 1e12:.3g} TB/s (all "
        f"weights {s['weights_total_bytes'] / 1e9:.2f} GB -> "
        f"{s['weights_total_at_peak_bw_s'] * 1e3:.2f} ms); base_s implies "
        f"{_fmt_pct(s['base_implied_bw_fraction'])} of peak.",
        f"- Measured mlp_up_proj at n=1 streams weights at "
        f"{s['measured_up_proj_n1_bw_bytes_s'] / 1e12:.2f} TB/s "
        f"({_fmt_pct(s['measured_up_proj_n1_bw_fraction'])} of peak); kv_token_s assumes "
        f"{_fmt_pct(r['kv']['achievable_fraction'])} of peak for "
        f"{r['kv']['bytes_per_token']} B of KV per token.",
        f"- prefill_token_s implies {s['prefill_implied_flops'] / 1e12:.0f} TFLOP/s "
        f"({_fmt_pct(s['prefill_implied_flops_fraction'])} of dense BF16 peak).",
        f"- Prefill attention of an 8K prompt: {pa['attention_s'] * 1e3:.1f} ms, "
        f"{_fmt_pct(pa['attention_share_of_total'])} of the chunk; not in the four terms "
        f"(kv term covers {_fmt_pct(pa['kv_term_covers_fraction'])} of it).",
        "",
        _reproduce(r),
        "",
    ]
    return "\n".join(lines)


def _summary_llama_cross_check(cc: dict) -> list[str]:
    lines = [
        "",
        "## Cross-check: A100 Llama-3-8B data x measured H100/A100 speed ratio",
        "",
        "| region | max abs diff | rms diff |",
        "|---|---|---|",
        f"| decode (n <= {DECODE_MAX_N}) | {_fmt_pct(cc['decode_region']['max_abs_rel'])} "
        f"| {_fmt_pct(cc['decode_region']['rms_rel'])} |",
        f"| prefill (n >= {PREFILL_MIN_N}) | {_fmt_pct(cc['prefill_region']['max_abs_rel'])} "
        f"| {_fmt_pct(cc['prefill_region']['rms_rel'])} |",
    ]
    ext = cc["extrapolation"]
    if ext:
        st = ext["model_vs_a100_derived"]
        lines.append(
            f"| fitted model vs A100-derived, n {ext['n_range'][0]}-{ext['n_range'][1]} "
            f"| {_fmt_pct(st['max_abs_rel'])} | {_fmt_pct(st['rms_rel'])} |"
        )
    lines += [
        "",
        f"GEMM speed ratio H100/A100 (attn_post_proj): n=1 "
        f"{1 / cc['speed_ratio_gemm']['n=1']:.2f}x faster, compute-bound "
        f"{1 / cc['speed_ratio_gemm']['compute_bound_median']:.2f}x faster.",
    ]
    return lines


def _summary_gpu_ratio(cc: dict) -> list[str]:
    ds = cc["datasheet"]
    p, o = cc["primary_gpu"], cc["other_gpu"]
    lines = [
        "",
        f"## Cross-check: {o} profile of the same shape ({p} time / {o} time)",
        "",
        f"| operator | n = 1 | memory-bound (n <= {MEMORY_BOUND_MAX_N}) "
        f"| compute-bound (n >= {COMPUTE_BOUND_MIN_N}) |",
        "|---|---|---|---|",
    ]
    rows = [(op, cc["speedup_gemm"][op]) for op in GEMM_OPS]
    rows += [("all four GEMMs", cc["speedup_all_gemms"])]
    rows += [("element-wise ops", cc["speedup_elementwise"])]
    rows += [("whole T(n), decode", cc["speedup_whole_iteration"]["decode"])]
    rows += [("whole T(n), prefill", cc["speedup_whole_iteration"]["prefill"])]
    for name, sp in rows:
        lines.append(
            f"| {name} | {sp['n=1']:.2f}x | {sp['memory_bound_median']:.2f}x "
            f"| {sp['compute_bound_median']:.2f}x |"
        )
    lines += [
        f"| datasheet | | HBM {ds['hbm_bandwidth_ratio']:.2f}x "
        f"| BF16 {ds['bf16_flops_ratio']:.2f}x |",
        "",
        f"Memory-bound GEMMs vs the bandwidth ratio: "
        f"{_fmt_pct(cc['memory_bound_vs_bandwidth_ratio'])}; compute-bound GEMMs vs the "
        f"FLOP ratio: {_fmt_pct(cc['compute_bound_vs_flops_ratio'])}.",
        "",
        f"{o} coefficients by the same method: "
        + ", ".join(f"{k} {v:.4g}" for k, v in cc["other_gpu_fit"].items())
        + f" ({p}/{o}: "
        + ", ".join(f"{k} {v:.2f}x" for k, v in cc["coefficient_ratio_primary_over_other"].items())
        + ").",
    ]
    return lines


def _summary_refit(r: dict) -> str:
    lines = [
        f"# Timing-model fit: {r['profile']} ({r['model'].split(' ')[0]}, {r['hardware']})",
        "",
        f"Source: {r['source']}. Coefficients from `{r['coefficients_from']}`.",
        "",
        *_param_table(r),
        "",
        "## Runs (relative error = predicted / measured - 1)",
        "",
        "| run | points | refit base_s | prefill_token_s | decode_seq_s | kv_token_s "
        "| stored coefficients: rms | max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in r["runs"].items():
        c, e = run["refit"], run["stored_coefficients_error"]
        lines.append(
            f"| {name} | {run['points']} | {c['base_s']:.4g} | {c['prefill_token_s']:.4g} "
            f"| {c['decode_seq_s']:.4g} | {c['kv_token_s']:.4g} | {_fmt_pct(e['rms_rel'])} "
            f"| {_fmt_pct(e['max_abs_rel'])} |"
        )
    c = r["pooled_refit"]
    lines += [
        f"| pooled | | {c['base_s']:.4g} | {c['prefill_token_s']:.4g} "
        f"| {c['decode_seq_s']:.4g} | {c['kv_token_s']:.4g} | | |",
        "",
        "Largest relative spread of a run's refit from the stored coefficients: "
        + ", ".join(f"{k} {_fmt_pct(v)}" for k, v in r["run_spread_max_rel"].items())
        + ".",
        "",
        _reproduce(r),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"server profile to fit (default {DEFAULT_PROFILE}; valid: {', '.join(FITS)})",
    )
    ap.add_argument("--data-dir", type=Path, default=None, help="folder of the measured data")
    ap.add_argument(
        "--out", type=Path, default=None, help="output folder (default results/timing_fit/NAME)"
    )
    args = ap.parse_args(argv)
    try:
        result = fit(args.data_dir, profile=args.profile)
    except DataError as exc:
        print(f"fit_timing: error: {exc}", file=sys.stderr)
        return 2
    out = args.out or DEFAULT_OUT_DIR / profile_dirname(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fit.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out / "fit.png")
    (out / "summary.md").write_text(summary_md(result))
    print(f"profile {result['profile']}: {result['model']}, {result['hardware']}")
    for key in ("base_s", "prefill_token_s", "decode_seq_s", "kv_token_s"):
        print(f"{key} = {result[key]!r}")
    if "residuals" in result:
        res = result["residuals"]
        print(
            f"residuals (max abs rel): decode {_fmt_pct(res['decode']['max_abs_rel'])}, "
            f"prefill {_fmt_pct(res['prefill']['max_abs_rel'])}"
        )
        cc = result["cross_check"]
        if "decode_region" in cc:
            print(
                f"cross-check max diff: decode {_fmt_pct(cc['decode_region']['max_abs_rel'])}, "
                f"prefill {_fmt_pct(cc['prefill_region']['max_abs_rel'])}"
            )
        else:
            g = cc["speedup_all_gemms"]
            ds = cc["datasheet"]
            print(
                f"{cc['primary_gpu']}/{cc['other_gpu']} GEMM time ratio: memory-bound "
                f"{g['memory_bound_median']:.2f}x (HBM {ds['hbm_bandwidth_ratio']:.2f}x), "
                f"compute-bound {g['compute_bound_median']:.2f}x "
                f"(BF16 {ds['bf16_flops_ratio']:.2f}x)"
            )
    else:
        for name, run in result["runs"].items():
            e = run["stored_coefficients_error"]
            print(f"{name}: rms error {_fmt_pct(e['rms_rel'])}, max {_fmt_pct(e['max_abs_rel'])}")
    print(f"wrote {out}/fit.json, fit.png, summary.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
