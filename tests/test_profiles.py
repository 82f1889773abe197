"""The server profiles' own numbers: KV sizes, swap times, SGLang's KV budget, the fits.

How profiles reach instances, generators and the command line is tested in
test_profile_plumbing.py; every number checked here is explained in docs/profiles.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_analysis

from topas.profiles import (
    A100_80GB_MIB,
    GIB,
    H100_80GB_MIB,
    H200_MIB,
    LLAMA_3_8B,
    LLAMA_3_8B_H100,
    PCIE_GEN4_X16,
    PCIE_GEN5_X16,
    PROFILES,
    QWEN2_5_32B,
    ProfileError,
    get_profile,
    sglang_gpu_defaults,
    sglang_kv_tokens,
)
from topas.timing import DEFAULT_LINEAR

ROOT = Path(__file__).resolve().parents[1]
COEFFICIENTS = ("base_s", "prefill_token_s", "decode_seq_s", "kv_token_s")


ft = load_analysis("fit_timing")


# ---------------------------------------------------------------------------- model shapes


def test_kv_bytes_per_token_by_hand():
    # K and V x layers x KV heads x head dim x 2 bytes (bf16)
    assert LLAMA_3_8B.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert QWEN2_5_32B.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2 == 256 * 1024


def test_qwen_parameter_count_from_its_config():
    h, inter, kv = 5120, 27648, 8 * 128
    attention = h * h + h + 2 * (h * kv + kv) + h * h  # q (bias), k and v (bias), o
    per_layer = attention + 3 * h * inter + 2 * h  # gate, up, down; two RMSNorms
    total = 64 * per_layer + 2 * 152064 * h + h  # embedding, untied LM head, final norm
    assert QWEN2_5_32B.params == total == 32_763_876_352
    assert QWEN2_5_32B.weight_bytes == 2 * total
    assert QWEN2_5_32B.weight_bytes / GIB == pytest.approx(61.03, abs=0.01)


def test_profile_shapes_match_the_fit_shapes():
    pairs = [(LLAMA_3_8B, ft.LLAMA3_8B), (QWEN2_5_32B, ft.QWEN25_32B)]
    for model, shape in pairs:
        for field in ("layers", "hidden", "mlp", "q_heads", "kv_heads", "head_dim", "vocab"):
            assert getattr(model, field) == getattr(shape, field), (model.name, field)
        assert model.kv_bytes_per_token == shape.kv_bytes_per_token()


# ---------------------------------------------------------------------------- host tiers


def test_swap_times_by_hand():
    qwen = get_profile("qwen2.5-32b/a100-80gb")
    assert qwen.host is PCIE_GEN4_X16 and qwen.host.bytes_per_s == 26e9
    assert qwen.swap_s(8192) == pytest.approx(8192 * 262144 / 26e9, rel=1e-15)
    assert qwen.swap_s(8192) == pytest.approx(0.0826, abs=1e-4)  # 2 GiB over 26 GB/s
    assert qwen.swap_tokens_per_s == pytest.approx(26e9 / 262144, rel=1e-15)
    llama = get_profile("llama-3-8b/h100")
    assert llama.host is PCIE_GEN5_X16 and llama.host.bytes_per_s == 55e9
    assert llama.swap_s(8192) == pytest.approx(8192 * 131072 / 55e9, rel=1e-15)
    assert llama.swap_tokens_per_s == pytest.approx(419_617, abs=1)
    # The profile's swap rate is what an instance's host load carries.
    assert qwen.host_load().tokens_per_s == qwen.swap_tokens_per_s
    assert qwen.record()["swap_bytes_per_s"] == 26e9


def test_host_tiers_are_measured_figures_below_the_link_rate():
    # Raw rate of x16: 16 GT/s (Gen4) or 32 GT/s (Gen5) per lane, 128b/130b encoding.
    gen4_raw = 16e9 * 16 * 128 / 130 / 8
    gen5_raw = 32e9 * 16 * 128 / 130 / 8
    assert 0.75 * gen4_raw < PCIE_GEN4_X16.bytes_per_s < gen4_raw
    assert 0.75 * gen5_raw < PCIE_GEN5_X16.bytes_per_s < gen5_raw
    for tier in (PCIE_GEN4_X16, PCIE_GEN5_X16):
        assert tier.overlaps_compute and tier.free_eviction


# ---------------------------------------------------------------------------- SGLang defaults


def test_sglang_defaults_by_hand():
    # A100-80GB (81920 MiB): chunk 8192, CUDA graphs up to 256, and kept out of the pool
    # 512 + 1.5*8192 + 2*256 + 1024/8 = 13440 MiB -> (81920 - 13440) / 81920 = 0.836.
    assert 512 + 1.5 * 8192 + 2 * 256 + 1024 / 8 == 13440
    assert sglang_gpu_defaults(A100_80GB_MIB) == (8192, 256, 0.836)
    assert sglang_gpu_defaults(H100_80GB_MIB)[0] == 8192
    assert sglang_gpu_defaults(H200_MIB)[0] == 8192
    assert sglang_gpu_defaults(40960)[:2] == (4096, 32)  # A100-40GB class
    assert sglang_gpu_defaults(24576)[:2] == (2048, 16)  # 24 GB class
    assert sglang_gpu_defaults(192 * 1024)[:2] == (16384, 512)  # B200 class
    # Above 60 GiB at least 10 GiB stay out of the static pool.
    assert sglang_gpu_defaults(65536, tp_size=1)[2] == round((65536 - 13440) / 65536, 3)


def test_qwen_kv_budget_is_sglangs_from_the_documented_numbers():
    prof = get_profile("qwen2.5-32b/a100-80gb")
    # docs/profiles.md, "KV budget": free memory SGLang measures before loading (79.15 GiB
    # CUDA-visible less 0.5 GiB context), mem_fraction_static 0.836, bf16 weights,
    # 0.1 GiB of load-time buffers, 256 KiB per token.
    expected = sglang_kv_tokens(
        gpu_bytes=(79.15 - 0.5) * GIB,
        mem_fraction_static=0.836,
        weight_bytes=2 * 32_763_876_352,
        other_bytes=0.1 * GIB,
        kv_bytes_per_token=262144,
    )
    assert prof.kv_capacity_tokens == expected
    # (78.65 * 0.836 - 61.027 - 0.1) GiB = 4.624 GiB = 18,939 tokens of 256 KiB. The older
    # default mem_fraction_static of 0.88 would give about 33K (docs/profiles.md).
    assert 15_000 <= prof.kv_capacity_tokens <= 25_000
    assert prof.kv_capacity_tokens == 18_939


def test_sglang_kv_tokens_refuses_a_model_that_does_not_fit():
    with pytest.raises(ProfileError, match="no memory"):
        sglang_kv_tokens(40 * GIB, 0.836, QWEN2_5_32B.weight_bytes, 0, 262144)


def test_chunks_and_movements():
    assert get_profile("llama-3-8b/h100").chunk_tokens == 2048  # the project's historical
    assert get_profile("llama-3-8b/h200").chunk_tokens == 8192  # SGLang's default
    assert get_profile("qwen2.5-32b/a100-80gb").chunk_tokens == 8192  # SGLang's default
    assert get_profile("qwen2.5-32b/a100-80gb").movement == "swap"
    assert get_profile("llama-3-8b/h100").movement == "recompute"
    assert get_profile("llama-3-8b/h200").movement == "recompute"
    assert get_profile("llama-3-8b/h100").kv_capacity_tokens is None
    assert get_profile("llama-3-8b/h200").kv_capacity_tokens is None


# ---------------------------------------------------------------------------- names


def test_unknown_profile_names_the_valid_ones():
    with pytest.raises(ProfileError) as err:
        get_profile("nope")
    message = str(err.value)
    assert "'nope'" in message
    for name in PROFILES:
        assert name in message


def test_every_profile_has_a_fit_and_vice_versa():
    assert set(ft.FITS) == set(PROFILES)
    assert ft.DEFAULT_PROFILE == LLAMA_3_8B_H100.name


# ---------------------------------------------------------------------------- the fits


def test_h100_stays_exactly_the_default():
    prof = get_profile("llama-3-8b/h100")
    assert prof.cost is DEFAULT_LINEAR
    assert prof.cost == DEFAULT_LINEAR


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_the_fit_reproduces_the_stored_coefficients(name):
    result = ft.fit(profile=name)
    assert result["profile"] == name
    cost = get_profile(name).cost
    for key in COEFFICIENTS:
        assert result[key] == pytest.approx(getattr(cost, key), rel=1e-9, abs=0), key


def test_h200_coefficients_are_the_compare_refit():
    git = load_analysis("gpu_iteration_times")
    import json

    points = json.loads((ROOT / "analysis/data/h200_iteration_times_a.json").read_text())["points"]
    refit = git.refit(points)
    cost = get_profile("llama-3-8b/h200").cost
    for key in COEFFICIENTS:
        assert getattr(cost, key) == pytest.approx(refit[key], rel=1e-9)
    # docs/calibration.md, "Check on a GPU": 0.00704, 2.82e-05, 1.96e-05, 3.12e-08
    assert (round(cost.base_s, 5), round(cost.kv_token_s * 1e8, 2)) == (0.00704, 3.12)
    assert (round(cost.prefill_token_s * 1e5, 2), round(cost.decode_seq_s * 1e5, 2)) == (
        2.82,
        1.96,
    )


def test_qwen_kv_token_s_by_hand():
    cost = get_profile("qwen2.5-32b/a100-80gb").cost
    assert cost.kv_token_s == pytest.approx(262144 / (0.85 * 2.039e12), rel=1e-12)
