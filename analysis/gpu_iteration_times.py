"""Measure engine-iteration times of the Llama-3-8B shape on a GPU, and compare them with
the calibrated timing model.

Two sub-commands:

``measure`` (needs torch with CUDA): builds the Llama-3-8B shape (32 layers, hidden 4096,
GQA 32/8 heads, gated MLP 14336, vocabulary 128256) in bf16 with random ("dummy") weights,
in plain PyTorch: embedding, RMSNorm, one fused QKV GEMM, RoPE, scaled-dot-product
attention over a pre-filled KV cache, O projection, fused gate/up GEMM, SiLU-and-mul, down
projection, final norm and the LM head for the last position of each sequence. It times

* decode iterations: ``B`` sequences, one new token each, every sequence attending ``c``
  cached tokens; captured in a CUDA graph (as serving engines run decode) and replayed;
* prefill iterations: one chunk of ``n`` new tokens attending ``c`` cached tokens
  (causal within the chunk when ``c == 0``; the whole context otherwise), also replayed
  from a CUDA graph so that kernel-launch gaps stay out of the figures.

Each point is the median of many replays timed with CUDA events after a warm-up. The JSON
it writes holds every point with the model's inputs (prefill tokens, decode sequences, KV
tokens read), so the comparison needs no GPU.

``compare`` (CPU): reads that JSON, prints and writes (``summary.md``, ``fit.json``,
``fit.png``) the relative error of :data:`topas.timing.DEFAULT_LINEAR` per point, the
same with the memory-bound terms scaled by the measured GPU's bandwidth, and a
least-squares refit of the four coefficients on the measured points.

    python analysis/gpu_iteration_times.py measure --out DIR          # on the GPU machine
    python analysis/gpu_iteration_times.py measure --tiny --device cpu  # smoke test
    python analysis/gpu_iteration_times.py compare analysis/data/h200_iteration_times.json

The attention here is PyTorch's SDPA, not FlashInfer, and there is no paged KV cache: the
numbers describe the shape's GEMM and memory costs, not SGLang's exact kernels.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

LLAMA3_8B = dict(
    hidden=4096,
    layers=32,
    heads=32,
    kv_heads=8,
    head_dim=128,
    mlp=14336,
    vocab=128256,
    rope_theta=500000.0,
)
TINY = dict(
    hidden=256,
    layers=2,
    heads=8,
    kv_heads=2,
    head_dim=32,
    mlp=512,
    vocab=1000,
    rope_theta=10000.0,
)

DECODE_BATCHES = (1, 8, 32, 64, 128, 256)
DECODE_CONTEXTS = (256, 1024, 4096, 16384)
DECODE_MAX_KV_TOKENS = 600_000  # 600K tokens x 128 KiB = 79 GB of KV cache at most
PREFILL_TOKENS = (128, 256, 512, 1024, 2048, 4096, 8192)
PREFILL_CONTEXT_CHUNK = 2048
PREFILL_CONTEXTS = (2048, 8192, 16384, 32768)


# ------------------------------------------------------------------------------ measure


def _model(torch, shape: dict, device: str, dtype):
    """Random weights for every layer; 0.02-scaled normal, like an untrained init."""
    gen = torch.Generator(device=device).manual_seed(0)

    def w(*dims):
        return (torch.randn(*dims, generator=gen, device=device, dtype=torch.float32) * 0.02).to(
            dtype
        )

    h, hd = shape["hidden"], shape["head_dim"]
    qkv = (shape["heads"] + 2 * shape["kv_heads"]) * hd
    layers = [
        dict(
            ln1=torch.ones(h, device=device, dtype=dtype),
            wqkv=w(h, qkv),
            wo=w(shape["heads"] * hd, h),
            ln2=torch.ones(h, device=device, dtype=dtype),
            wgu=w(h, 2 * shape["mlp"]),
            wdown=w(shape["mlp"], h),
        )
        for _ in range(shape["layers"])
    ]
    return dict(
        emb=w(shape["vocab"], h),
        layers=layers,
        norm=torch.ones(h, device=device, dtype=dtype),
        head=w(h, shape["vocab"]),
    )


def _rms(torch, x, weight):
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + 1e-5)).to(x.dtype) * weight


def _rope(torch, x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _forward(torch, shape, model, tokens, cache, ctx: int):
    """One iteration: ``tokens`` [B, n] new tokens after ``ctx`` cached ones per sequence.

    ``cache`` is a list of (K, V) tensors [B, kv_heads, ctx + n, head_dim]; the new keys
    and values are written into positions ctx..ctx+n-1.
    """
    F = torch.nn.functional
    B, n = tokens.shape
    H, KV, hd = shape["heads"], shape["kv_heads"], shape["head_dim"]
    group = H // KV
    pos = torch.arange(ctx, ctx + n, device=tokens.device, dtype=torch.float32)
    inv = 1.0 / (
        shape["rope_theta"]
        ** (torch.arange(0, hd, 2, device=tokens.device, dtype=torch.float32) / hd)
    )
    ang = torch.outer(pos, inv)
    cos, sin = ang.cos().to(model["emb"].dtype), ang.sin().to(model["emb"].dtype)
    x = model["emb"][tokens]
    for layer, (kc, vc) in zip(model["layers"], cache, strict=True):
        r = _rms(torch, x, layer["ln1"])
        qkv = r @ layer["wqkv"]
        q, k, v = qkv.split((H * hd, KV * hd, KV * hd), dim=-1)
        q = _rope(torch, q.view(B, n, H, hd), cos[:, None], sin[:, None])
        k = _rope(torch, k.view(B, n, KV, hd), cos[:, None], sin[:, None])
        kc[:, :, ctx : ctx + n] = k.transpose(1, 2)
        vc[:, :, ctx : ctx + n] = v.view(B, n, KV, hd).transpose(1, 2)
        if ctx == 0:
            # causal prefill: grouped-query attention through SDPA
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), kc, vc, is_causal=True, enable_gqa=True
            )
            o = o.transpose(1, 2).reshape(B, n, H * hd)
        else:
            # decode / chunk after context: the `group` query heads sharing a KV head
            # attend the whole context as one query block (no mask needed)
            qg = q.view(B, n, KV, group, hd).permute(0, 2, 1, 3, 4).reshape(B, KV, n * group, hd)
            o = F.scaled_dot_product_attention(qg, kc, vc)
            o = o.view(B, KV, n, group, hd).permute(0, 2, 1, 3, 4).reshape(B, n, H * hd)
        x = x + o @ layer["wo"]
        r = _rms(torch, x, layer["ln2"])
        gate, up = (r @ layer["wgu"]).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ layer["wdown"]
    last = _rms(torch, x[:, -1], model["norm"])
    return last @ model["head"]


def _cache(torch, shape, batch, length, device, dtype):
    return [
        (
            torch.randn(
                batch, shape["kv_heads"], length, shape["head_dim"], device=device, dtype=dtype
            ),
            torch.randn(
                batch, shape["kv_heads"], length, shape["head_dim"], device=device, dtype=dtype
            ),
        )
        for _ in range(shape["layers"])
    ]


def _time_ms(torch, fn, device: str, warmup: int, reps: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def _graph_times(torch, step, device, reps):
    """Median-ready times of ``step``: CUDA-graph replays on a GPU, eager calls on a CPU."""
    if device != "cuda":
        return _time_ms(torch, step, device, warmup=1, reps=reps)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    times = _time_ms(torch, graph.replay, device, warmup=5, reps=reps)
    del graph
    return times


def _iteration_times(torch, shape, model, batch, new_tokens, ctx, device, dtype, reps):
    """Times of one iteration: ``batch`` sequences of ``new_tokens`` after ``ctx`` cached."""
    cache = _cache(torch, shape, batch, ctx + new_tokens, device, dtype)
    tokens = torch.randint(0, shape["vocab"], (batch, new_tokens), device=device)
    return _graph_times(
        torch, lambda: _forward(torch, shape, model, tokens, cache, ctx), device, reps
    )


def _point(kind, prefill, decode, kv, times_ms):
    return dict(
        kind=kind,
        prefill_tokens=prefill,
        decode_seqs=decode,
        kv_tokens=kv,
        median_ms=statistics.median(times_ms),
        min_ms=min(times_ms),
        max_ms=max(times_ms),
        reps=len(times_ms),
    )


def _bandwidth_gbs(torch, device) -> float | None:
    """Device-to-device copy of 2 GiB, bytes read plus written, median of 10."""
    if device != "cuda":
        return None
    src = torch.empty(1 << 30, dtype=torch.int16, device=device).random_()
    dst = torch.empty_like(src)
    times = _time_ms(torch, lambda: dst.copy_(src), device, warmup=3, reps=10)
    return 2 * src.numel() * 2 / (statistics.median(times) * 1e-3) / 1e9


def measure(args) -> int:
    import torch

    device, dtype = args.device, torch.bfloat16
    if device == "cuda" and not torch.cuda.is_available():
        print("error: measure: no CUDA device", file=sys.stderr)
        return 2
    shape = TINY if args.tiny else LLAMA3_8B
    torch.manual_seed(0)
    with torch.inference_mode():
        model = _model(torch, shape, device, dtype)
        meta = dict(
            shape="tiny" if args.tiny else "llama-3-8b",
            model=shape,
            torch=torch.__version__,
            device=device,
            gpu=torch.cuda.get_device_name() if device == "cuda" else None,
            copy_bandwidth_gbs=_bandwidth_gbs(torch, device),
            attention="torch SDPA (GQA grouped as one query block for decode/chunks)",
            replay="CUDA graph replay" if device == "cuda" else "eager",
            weights="random normal(0, 0.02), bf16",
        )
        points = []
        batches = DECODE_BATCHES[:3] if args.tiny else DECODE_BATCHES
        contexts = DECODE_CONTEXTS[:2] if args.tiny else DECODE_CONTEXTS
        for ctx in contexts:
            for batch in batches:
                if batch * ctx > DECODE_MAX_KV_TOKENS:
                    continue
                times = _iteration_times(
                    torch, shape, model, batch, 1, ctx, device, dtype, args.reps
                )
                points.append(_point("decode", 0, batch, batch * ctx, times))
                _report(points[-1])
        for n in PREFILL_TOKENS[:3] if args.tiny else PREFILL_TOKENS:
            times = _iteration_times(torch, shape, model, 1, n, 0, device, dtype, args.reps)
            # the simulator counts a chunk's KV read as the context before the chunk
            points.append(_point("prefill", n, 0, 0, times))
            _report(points[-1])
        for ctx in PREFILL_CONTEXTS[:1] if args.tiny else PREFILL_CONTEXTS:
            n = PREFILL_CONTEXT_CHUNK
            times = _iteration_times(torch, shape, model, 1, n, ctx, device, dtype, args.reps)
            points.append(_point("prefill", n, 0, ctx, times))
            _report(points[-1])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / args.name).write_text(json.dumps(dict(meta=meta, points=points), indent=1) + "\n")
    print(f"wrote {out / args.name} ({len(points)} points)")
    return 0


def _report(p) -> None:
    print(
        f"{p['kind']:8s} prefill={p['prefill_tokens']:6d} decode={p['decode_seqs']:4d} "
        f"kv={p['kv_tokens']:10d}  median {p['median_ms']:8.3f} ms "
        f"(min {p['min_ms']:.3f}, max {p['max_ms']:.3f})",
        flush=True,
    )


# ------------------------------------------------------------------------------ compare


H100_BANDWIDTH_GBS = 3350.0
"""H100 SXM datasheet HBM3 bandwidth; DEFAULT_LINEAR's memory terms assume 85% of it."""


def _predict(coef, p) -> float:
    return (
        coef["base_s"]
        + coef["prefill_token_s"] * p["prefill_tokens"]
        + coef["decode_seq_s"] * p["decode_seqs"]
        + coef["kv_token_s"] * p["kv_tokens"]
    )


def refit(points) -> dict:
    """Relative least squares (each point weighted by 1/measured) of the four terms."""
    import numpy as np

    rows = np.array([[1.0, p["prefill_tokens"], p["decode_seqs"], p["kv_tokens"]] for p in points])
    y = np.array([p["median_ms"] * 1e-3 for p in points])
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(rows * w[:, None], y * w, rcond=None)
    return dict(
        zip(
            ("base_s", "prefill_token_s", "decode_seq_s", "kv_token_s"),
            (float(c) for c in coef),
            strict=True,
        )
    )


def _scaled_default(default: dict, bandwidth_gbs: float | None) -> dict:
    """DEFAULT_LINEAR with its memory-bound terms scaled to the measured bandwidth.

    base_s (reading the weights once) and kv_token_s are memory-bound; the per-token and
    per-sequence GEMM terms are compute-bound and stay (the H200 has the H100's tensor
    cores). The copy bandwidth is compared with the H100's datasheet figure at the same
    85% efficiency the default assumes.
    """
    if not bandwidth_gbs:
        return dict(default)
    ratio = H100_BANDWIDTH_GBS * 0.85 / bandwidth_gbs
    return dict(default, base_s=default["base_s"] * ratio, kv_token_s=default["kv_token_s"] * ratio)


def prediction_errors(coef, points) -> list[float]:
    return [_predict(coef, p) / (p["median_ms"] * 1e-3) - 1.0 for p in points]


def compare(args) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from topas.timing import DEFAULT_LINEAR

    path = Path(args.measurements)
    try:
        data = json.loads(path.read_text())
        points, meta = data["points"], data["meta"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    default = {
        k: getattr(DEFAULT_LINEAR, k)
        for k in ("base_s", "prefill_token_s", "decode_seq_s", "kv_token_s")
    }
    models = {
        "default (H100)": default,
        "default, bandwidth-scaled": _scaled_default(default, meta.get("copy_bandwidth_gbs")),
        "refit": refit(points),
    }
    errors = {name: prediction_errors(coef, points) for name, coef in models.items()}
    lines = [
        f"# Measured iteration times vs the calibrated model ({meta.get('gpu')})",
        "",
        f"Source: `{path}`; {meta.get('shape')} shape, torch {meta.get('torch')}, "
        f"{meta.get('attention')}; iterations by {meta.get('replay', meta.get('decode'))}; "
        "weights "
        f"{meta.get('weights')}. Copy bandwidth {meta.get('copy_bandwidth_gbs') or 0:.0f} "
        "GB/s (read + write).",
        "",
        "## Coefficients (seconds)",
        "",
        "| model | base_s | prefill_token_s | decode_seq_s | kv_token_s | "
        "rms rel. error | max abs. rel. error |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, coef in models.items():
        e = errors[name]
        rms = math.sqrt(sum(x * x for x in e) / len(e))
        lines.append(
            f"| {name} | {coef['base_s']:.4g} | {coef['prefill_token_s']:.4g} | "
            f"{coef['decode_seq_s']:.4g} | {coef['kv_token_s']:.4g} | {rms:.1%} | "
            f"{max(abs(x) for x in e):.1%} |"
        )
    lines += [
        "",
        "## Per point (relative error = predicted / measured - 1)",
        "",
        "| kind | prefill | decode | kv tokens | measured (ms) | " + " | ".join(models) + " |",
        "|---|---|---|---|---|" + "---|" * len(models),
    ]
    for i, p in enumerate(points):
        lines.append(
            f"| {p['kind']} | {p['prefill_tokens']} | {p['decode_seqs']} | {p['kv_tokens']} | "
            f"{p['median_ms']:.3f} | " + " | ".join(f"{errors[m][i]:+.1%}" for m in models) + " |"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "fit.json").write_text(
        json.dumps(
            dict(
                source=str(path), meta=meta, models=models, errors={k: v for k, v in errors.items()}
            ),
            indent=1,
        )
        + "\n"
    )
    plot_fit(points, models, out / "fit.png")
    print("\n".join(lines[: len(models) + 8]))
    print(f"wrote {out}/summary.md, fit.json, fit.png")
    return 0


def plot_fit(points, models, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    measured = [p["median_ms"] for p in points]
    for name, coef in models.items():
        ax.scatter(measured, [_predict(coef, p) * 1e3 for p in points], label=name, s=14)
    lo, hi = min(measured) * 0.8, max(measured) * 1.25
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
    for f in (0.85, 1.15):
        ax.plot([lo, hi], [lo * f, hi * f], color="grey", lw=0.5, ls="--")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="measured iteration (ms)",
        ylabel="predicted iteration (ms)",
        title="iteration time: model vs GPU (±15%)",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="time iterations on this machine's GPU")
    m.add_argument("--out", default="results/gpu_timing")
    m.add_argument("--name", default="iteration_times.json")
    m.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    m.add_argument("--tiny", action="store_true", help="a tiny shape, for smoke tests")
    m.add_argument("--reps", type=int, default=30)
    c = sub.add_parser("compare", help="compare measurements with the timing model")
    c.add_argument("measurements")
    c.add_argument("--out", default="results/gpu_timing")
    args = parser.parse_args(argv)
    return measure(args) if args.command == "measure" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
