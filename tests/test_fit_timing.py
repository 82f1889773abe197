"""Tests of analysis/fit_timing.py: the calibration of the iteration-time model."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import load_analysis

SCRIPT = Path(__file__).resolve().parents[1] / "analysis" / "fit_timing.py"


ft = load_analysis("fit_timing")

# Tolerances the fitted four-term model must meet against the measured (shape-scaled) T(n).
# The measured curve is a staircase (GEMM tile/wave quantisation) that no straight line
# follows exactly; these bounds are ~1.2-1.5x the residuals of the committed fit.
DECODE_MAX_REL, DECODE_RMS_REL = 0.20, 0.10
PREFILL_MAX_REL, PREFILL_RMS_REL = 0.30, 0.08
CROSS_MAX_REL, CROSS_RMS_REL = 0.30, 0.15


REPO = SCRIPT.parents[1]


@pytest.fixture(scope="module")
def real_fit():
    return ft.fit(ft.DEFAULT_DATA_DIR)


@pytest.fixture(scope="module")
def qwen_fit():
    return ft.fit(profile="qwen2.5-32b/a100-80gb")


# ----------------------------------------------------------------------------------------
# The data live in the repository


def test_profile_data_are_in_the_repository():
    assert ft.DEFAULT_DATA_DIR == REPO / "analysis" / "data" / "vidur-profiles"
    for name in (ft.H100_FILE, ft.A100_FILE, ft.A100_34B_FILE, ft.H100_34B_FILE):
        assert (ft.DEFAULT_DATA_DIR / name).is_file(), name
    assert "MIT License" in (ft.DEFAULT_DATA_DIR / "LICENSE").read_text()
    readme = (ft.DEFAULT_DATA_DIR / "README.md").read_text()
    assert "microsoft/vidur" in readme and "7d47513" in readme


# ----------------------------------------------------------------------------------------
# On the measured data: llama-3-8b/h100


def test_parameters_positive_and_physical(real_fit):
    r = real_fit
    assert 2e-3 < r["base_s"] < 12e-3
    assert 5e-6 < r["prefill_token_s"] < 1e-4
    assert 5e-6 < r["decode_seq_s"] < 1e-4
    assert 3e-8 < r["kv_token_s"] < 6e-8
    for key in ("base_s", "prefill_token_s", "decode_seq_s", "kv_token_s"):
        assert isinstance(r[key], float) and r[key] > 0


def test_parameters_respect_hardware_limits(real_fit):
    r = real_fit
    # A decode step reads every layer weight and the LM head at least once: it cannot be
    # faster than those bytes at peak HBM bandwidth (15.0 GB / 3.35 TB/s).
    assert r["base_s"] > r["sanity"]["weights_read_at_peak_bw_s"]
    # Prefill cannot beat dense BF16 peak: 2 FLOPs per weight per token.
    assert r["sanity"]["prefill_implied_flops"] < ft.H100_BF16_FLOPS
    # KV: 128 KiB per token over an achievable fraction of 3.35 TB/s.
    assert r["kv"]["bytes_per_token"] == 131072
    assert r["kv_token_s"] == pytest.approx(131072 / (0.85 * 3.35e12), rel=1e-12)


def test_model_reproduces_measured_curve(real_fit):
    r = real_fit
    n = np.array(r["curves"]["n"])
    td = np.array(r["curves"]["decode_s"])
    tp = np.array(r["curves"]["prefill_s"])
    dec = n <= ft.DECODE_MAX_N
    pre = n >= ft.PREFILL_MIN_N
    res_d = (r["base_s"] + r["decode_seq_s"] * n[dec]) / td[dec] - 1
    res_p = (r["base_s"] + r["prefill_token_s"] * n[pre]) / tp[pre] - 1
    assert np.max(np.abs(res_d)) < DECODE_MAX_REL
    assert np.sqrt(np.mean(res_d**2)) < DECODE_RMS_REL
    assert np.max(np.abs(res_p)) < PREFILL_MAX_REL
    assert np.sqrt(np.mean(res_p**2)) < PREFILL_RMS_REL
    # The reported residuals are the ones recomputed here.
    assert r["residuals"]["decode"]["max_abs_rel"] == pytest.approx(np.max(np.abs(res_d)))
    assert r["residuals"]["prefill"]["max_abs_rel"] == pytest.approx(np.max(np.abs(res_p)))
    # No systematic bias over either region.
    assert abs(np.mean(res_d)) < 0.03 and abs(np.mean(res_p)) < 0.03


def test_measured_curve_assembly(real_fit):
    """Spot-check T(n) at n=1 against a hand sum of the H100 CSV row (ms)."""
    r = real_fit
    # H100 Llama-2-7B, n=1 medians: emb .002, ln .004, qkv .038, rope .004, o .016,
    # ln .004, up .064, act .006, down .038, add .001.
    i3 = 14336 / 11008
    layer = 0.004 + 0.5 * 0.038 + 0.625 * 0.004 + 0.016 + 0.004
    layer += i3 * (0.064 + 0.006 + 0.038) + 0.001
    lm = 128256 / 22016 * 0.064
    expected_ms = 0.002 + 32 * layer + lm
    assert r["curves"]["n"][0] == 1
    assert r["curves"]["decode_s"][0] == pytest.approx(expected_ms * 1e-3, rel=1e-9)


def test_cross_check_agrees(real_fit):
    cc = real_fit["cross_check"]
    for region in ("decode_region", "prefill_region"):
        assert cc[region]["max_abs_rel"] < CROSS_MAX_REL
        assert cc[region]["rms_rel"] < CROSS_RMS_REL
    # H100 vs A100: ~1.5-1.7x on memory-bound GEMMs, ~3x compute-bound (989 vs 312 TFLOP/s).
    assert 1.3 < 1 / cc["speed_ratio_gemm"]["n=1"] < 1.9
    assert 2.5 < 1 / cc["speed_ratio_gemm"]["compute_bound_median"] < 3.5
    assert cc["extrapolation"]["n_range"][1] == 32768


def test_prefill_attention_estimate(real_fit):
    pa = real_fit["prefill_attention"]
    assert pa["pair_flops"] == 4 * 32 * 128 * 32
    at8k = pa["by_prompt_length"]["8192"]
    # Attention is a minority of an 8K prefill, and the KV-read term does not cover it.
    assert 0.05 < at8k["attention_share_of_total"] < 0.35
    assert at8k["kv_term_covers_fraction"] < 0.05


def test_cli_writes_outputs(tmp_path, real_fit):
    out = tmp_path / "out"
    assert ft.main(["--data-dir", str(ft.DEFAULT_DATA_DIR), "--out", str(out)]) == 0
    for name in ("fit.json", "fit.png", "summary.md"):
        assert (out / name).is_file()
    saved = json.loads((out / "fit.json").read_text())
    for key in ("base_s", "prefill_token_s", "decode_seq_s", "kv_token_s"):
        assert saved[key] == real_fit[key]
    assert repr(real_fit["base_s"]) in (out / "summary.md").read_text()


def test_default_profile_is_the_h100_fit(real_fit):
    assert real_fit["profile"] == ft.DEFAULT_PROFILE == "llama-3-8b/h100"
    again = ft.fit(profile="llama-3-8b/h100")
    for key in ("base_s", "prefill_token_s", "decode_seq_s", "kv_token_s"):
        assert again[key] == real_fit[key]


@pytest.mark.parametrize("name", ["llama-3-8b/h200", "qwen2.5-32b/a100-80gb"])
def test_cli_profile_writes_outputs(tmp_path, name):
    out = tmp_path / "out"
    assert ft.main(["--profile", name, "--out", str(out)]) == 0
    saved = json.loads((out / "fit.json").read_text())
    assert saved["profile"] == name
    for fname in ("fit.json", "fit.png", "summary.md"):
        assert (out / fname).is_file()
    text = (out / "summary.md").read_text()
    assert repr(saved["base_s"]) in text and f"--profile {name}" in text


def test_output_folder_is_named_after_the_profile():
    assert ft.profile_dirname("qwen2.5-32b/a100-80gb") == "qwen2.5-32b_a100-80gb"
    assert ft.profile_dirname("llama-3-8b/h100") == "llama-3-8b_h100"


def test_unknown_profile_is_a_one_line_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--profile", "nope", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "unknown profile 'nope'" in proc.stderr
    for name in ft.FITS:
        assert name in proc.stderr
    assert not (tmp_path / "o").exists()
    with pytest.raises(ft.DataError, match="valid: "):
        ft.fit(profile="nope")


# ----------------------------------------------------------------------------------------
# qwen2.5-32b/a100-80gb: A100 CodeLlama-34B profile scaled to Qwen2.5-32B

# CodeLlama-34B -> Qwen2.5-32B, by hand (FLOPs = weight bytes for each GEMM).
QWEN_RATIO = {
    "emb": 5120 / 8192,
    "input_layernorm": 5120 / 8192,
    "attn_pre_proj": (5120 * (40 + 16) * 128) / (8192 * (64 + 16) * 128),
    "attn_rope": (40 + 8) / (64 + 8),
    "attn_post_proj": (5120 * 5120) / (8192 * 8192),
    "post_attention_layernorm": 5120 / 8192,
    "mlp_up_proj": (5120 * 2 * 27648) / (8192 * 2 * 22016),
    "mlp_act": 27648 / 22016,
    "mlp_down_proj": (27648 * 5120) / (22016 * 8192),
    "add": 5120 / 8192,
}
QWEN_LM = (5120 * 152064) / (8192 * 2 * 22016)


def test_qwen_scaling_ratios_by_hand(qwen_fit):
    ratios = qwen_fit["scaling"]["op_ratios_target_over_profiled"]
    for op, r in QWEN_RATIO.items():
        assert ratios[op] == pytest.approx(r, rel=1e-12), op
    assert qwen_fit["scaling"]["lm_head_over_profiled_up_proj"] == pytest.approx(QWEN_LM)
    # The constant ratios stay within a few percent of a full A100 roofline ratio.
    for dev in qwen_fit["scaling"]["roofline_ratio_max_deviation"].values():
        assert dev < 0.05


def test_qwen_curve_assembly_by_hand(qwen_fit):
    """T(1) from the A100 CodeLlama-34B row at n = 1 (medians, ms), scaled by hand."""
    row = {
        "emb": 0.003,
        "input_layernorm": 0.008,
        "attn_pre_proj": 0.1105,
        "attn_rope": 0.007,
        "attn_post_proj": 0.0925,
        "post_attention_layernorm": 0.008,
        "mlp_up_proj": 0.447,
        "mlp_act": 0.017,
        "mlp_down_proj": 0.2275,
        "add": 0.002,
    }
    layer = sum(QWEN_RATIO[op] * row[op] for op in ft.LAYER_OPS)
    expected_ms = QWEN_RATIO["emb"] * row["emb"] + 64 * layer + QWEN_LM * row["mlp_up_proj"]
    assert qwen_fit["curves"]["n"][0] == 1
    assert qwen_fit["curves"]["decode_s"][0] == pytest.approx(expected_ms * 1e-3, rel=1e-9)


def test_qwen_fit_is_physical(qwen_fit):
    r, s = qwen_fit, qwen_fit["sanity"]
    # A decode step reads ~64 GB of weights: not faster than 2.039 TB/s allows.
    assert r["base_s"] > s["weights_read_at_peak_bw_s"] > 0.03
    assert 0.6 < s["base_implied_bw_fraction"] < 0.95
    # Prefill below dense BF16 peak, in the usual 50-85% of it.
    assert 0.5 < s["prefill_implied_flops_fraction"] < 0.85
    assert r["kv"]["bytes_per_token"] == 262144
    assert r["kv_token_s"] == pytest.approx(262144 / (0.85 * 2.039e12), rel=1e-12)
    for key in ("decode", "prefill"):
        assert r["residuals"][key]["max_abs_rel"] < 0.30
        assert r["residuals"][key]["rms_rel"] < 0.12
    assert abs(r["residuals"]["prefill"]["mean_rel"]) < 0.03


def test_qwen_cross_check_against_the_h100_profile(qwen_fit):
    cc = qwen_fit["cross_check"]
    assert cc["datasheet"]["hbm_bandwidth_ratio"] == pytest.approx(3.35 / 2.039)
    assert cc["datasheet"]["bf16_flops_ratio"] == pytest.approx(989.4 / 312)
    g = cc["speedup_all_gemms"]
    # The A100 is 1.6-2x slower on memory-bound GEMMs and ~3x on compute-bound ones,
    # within 20% of the datasheet ratios.
    assert 1.4 < g["memory_bound_median"] < 2.2
    assert 2.5 < g["compute_bound_median"] < 3.5
    assert abs(cc["memory_bound_vs_bandwidth_ratio"]) < 0.2
    assert abs(cc["compute_bound_vs_flops_ratio"]) < 0.2
    # The A100's coefficients are larger than the H100's by about those ratios.
    ratio = cc["coefficient_ratio_primary_over_other"]
    assert 1.3 < ratio["base_s"] < 2.2
    assert 2.5 < ratio["prefill_token_s"] < 3.5


# ----------------------------------------------------------------------------------------
# llama-3-8b/h200: the refit of whole measured iterations


def test_h200_refit_runs_agree():
    r = ft.fit(profile="llama-3-8b/h200")
    assert r["coefficients_from"] == "h200_iteration_times_a.json"
    assert set(r["runs"]) == {"h200_iteration_times_a.json", "h200_iteration_times_b.json"}
    for key, spread in r["run_spread_max_rel"].items():
        assert spread < 0.02, key
    for run in r["runs"].values():
        assert run["points"] == 31
        assert run["stored_coefficients_error"]["rms_rel"] < 0.2


def test_h200_missing_measurements_are_an_error(tmp_path):
    with pytest.raises(ft.DataError, match="not found"):
        ft.fit(tmp_path, profile="llama-3-8b/h200")


# ----------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("make_dir", [False, True])
def test_missing_data_is_a_one_line_error(tmp_path, make_dir):
    data = tmp_path / "profiles"
    if make_dir:
        data.mkdir()  # the directory exists, the CSV files do not
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--data-dir", str(data), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "not found" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_wrong_shape_is_rejected(tmp_path):
    _write_profiles(tmp_path, {op: (1.0, 0.0) for op in ft.OPS}, n_expanded_h100=14336)
    with pytest.raises(ft.DataError, match="n_expanded_embd"):
        ft.fit(tmp_path)


def test_unreadable_value_is_rejected(tmp_path):
    _write_profiles(tmp_path, {op: (1.0, 0.0) for op in ft.OPS})
    path = tmp_path / ft.H100_FILE
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows[3]["time_stats.mlp_up_proj.median"] = "n/a"
    _write_csv(path, rows)
    with pytest.raises(ft.DataError, match="unreadable value"):
        ft.fit(tmp_path)


# ----------------------------------------------------------------------------------------
# Hand check on synthetic, exactly linear data

H100_N = [1, 2, 4, 8, *range(16, 257, 16), *range(512, 4097, 256)]
A100_EXTRA_N = [6144, 8192]
COLUMNS = [f"time_stats.{op}.{s}" for op in ft.OPS for s in ("min", "max", "mean", "median", "std")]
COLUMNS += ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp"]
COLUMNS += ["num_tokens", "num_tensor_parallel_workers"]

# Hand-derived Llama-3-8B / Llama-2-7B ratios (FLOPs = weight bytes for each GEMM).
HAND_RATIO = {
    "emb": 1.0,
    "input_layernorm": 1.0,
    "attn_pre_proj": (4096 * 6144) / (4096 * 12288),
    "attn_rope": (32 + 8) / (32 + 32),
    "attn_post_proj": 1.0,
    "post_attention_layernorm": 1.0,
    "mlp_up_proj": (4096 * 2 * 14336) / (4096 * 2 * 11008),
    "mlp_act": 14336 / 11008,
    "mlp_down_proj": (14336 * 4096) / (11008 * 4096),
    "add": 1.0,
}
HAND_LM = (4096 * 128256) / (4096 * 2 * 11008)
A100_SLOWDOWN = 2.5  # synthetic A100 = 2.5x slower than the scaled H100, every op


def _write_csv(path, rows):
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)


def _row(times_ms, n, tp, shape):
    row = {}
    for op, t in times_ms.items():
        for stat in ("min", "max", "mean", "median", "std"):
            row[f"time_stats.{op}.{stat}"] = repr(t if stat != "std" else 0.0)
    row.update(shape)
    row["num_tokens"] = n
    row["num_tensor_parallel_workers"] = tp
    return row


def _write_profiles(tmp_path, coef, n_expanded_h100=11008):
    """H100 file with op(n) = a + b*n ms; A100 file = A100_SLOWDOWN x the scaled H100."""
    h_shape = {
        "n_head": 32,
        "n_kv_head": 32,
        "n_embd": 4096,
        "n_expanded_embd": n_expanded_h100,
        "vocab_size": 32768,
        "use_gated_mlp": True,
    }
    a_shape = dict(h_shape, n_kv_head=8, n_expanded_embd=14336, vocab_size=128256)

    def h100_ms(n):
        return {op: a + b * n for op, (a, b) in coef.items()}

    h_rows = [_row(h100_ms(n), n, 1, h_shape) for n in H100_N]
    # Rows at TP=2 must be ignored: give them absurd times.
    h_rows += [_row({op: 1e6 for op in ft.OPS}, n, 2, h_shape) for n in (1, 512)]
    a_rows = []
    for n in H100_N + A100_EXTRA_N:
        t = {op: A100_SLOWDOWN * HAND_RATIO[op] * v for op, v in h100_ms(n).items()}
        a_rows.append(_row(t, n, 1, a_shape))
    _write_csv(tmp_path / ft.H100_FILE, h_rows)
    _write_csv(tmp_path / ft.A100_FILE, a_rows)


def _hand_lines(coef):
    """Intercept and slope (seconds) of the layer stack + emb, and the up_proj line (ms)."""
    a = coef["emb"][0] + 32 * sum(HAND_RATIO[op] * coef[op][0] for op in ft.LAYER_OPS)
    b = coef["emb"][1] + 32 * sum(HAND_RATIO[op] * coef[op][1] for op in ft.LAYER_OPS)
    return a * 1e-3, b * 1e-3, coef["mlp_up_proj"][0] * 1e-3, coef["mlp_up_proj"][1] * 1e-3


SYNTH = {
    "emb": (0.002, 2.5e-5),
    "input_layernorm": (0.004, 1.6e-5),
    "attn_pre_proj": (0.030, 1.4e-4),
    "attn_rope": (0.004, 2.0e-5),
    "attn_post_proj": (0.012, 4.7e-5),
    "post_attention_layernorm": (0.004, 1.6e-5),
    "mlp_up_proj": (0.050, 2.4e-4),
    "mlp_act": (0.005, 3.4e-5),
    "mlp_down_proj": (0.030, 1.1e-4),
    "add": (0.001, 7.0e-6),
}


def test_synthetic_linear_profile_is_fitted_back_exactly(tmp_path):
    _write_profiles(tmp_path, SYNTH)
    r = ft.fit(tmp_path)
    a, b, up_a, up_b = _hand_lines(SYNTH)
    # Decode batch of n sequences: layers + emb + LM head over n rows.
    assert r["base_s"] == pytest.approx(a + HAND_LM * up_a, rel=1e-9)
    assert r["decode_seq_s"] == pytest.approx(b + HAND_LM * up_b, rel=1e-9)
    assert r["residuals"]["decode"]["max_abs_rel"] < 1e-9
    # Prefill chunk of n tokens: LM head over one row only.
    free = r["prefill_free_line"]
    assert free["intercept_s"] == pytest.approx(a + HAND_LM * (up_a + up_b), rel=1e-9)
    assert free["slope_s"] == pytest.approx(b, rel=1e-9)
    assert r["residuals"]["prefill_free_line"]["max_abs_rel"] < 1e-9
    # The shared-base prefill slope differs from b only through one LM row (HAND_LM*up_b).
    assert r["prefill_token_s"] == pytest.approx(b, rel=1e-3)
    assert r["kv_token_s"] == pytest.approx(131072 / (0.85 * 3.35e12), rel=1e-12)
    # The cross-check sees the same machine: exact agreement, and the ratio is 1/2.5.
    cc = r["cross_check"]
    assert cc["decode_region"]["max_abs_rel"] < 1e-9
    assert cc["prefill_region"]["max_abs_rel"] < 1e-9
    assert cc["speed_ratio_gemm"]["compute_bound_median"] == pytest.approx(1 / A100_SLOWDOWN)


def test_synthetic_shared_base_prefill_slope_exact(tmp_path):
    """With a flat up_proj the prefill line has base_s as intercept: all four exact."""
    coef = dict(SYNTH, mlp_up_proj=(0.050, 0.0))
    _write_profiles(tmp_path, coef)
    r = ft.fit(tmp_path)
    a, b, up_a, _ = _hand_lines(coef)
    assert r["base_s"] == pytest.approx(a + HAND_LM * up_a, rel=1e-9)
    assert r["decode_seq_s"] == pytest.approx(b, rel=1e-9)
    assert r["prefill_token_s"] == pytest.approx(b, rel=1e-9)
    assert r["residuals"]["prefill"]["max_abs_rel"] < 1e-9
    # Extrapolation to the A100-only n is exact too.
    ext = r["cross_check"]["extrapolation"]
    assert ext["n_range"] == [6144, 8192]
    assert ext["model_vs_a100_derived"]["max_abs_rel"] < 1e-9


def test_synthetic_scaled_profile_is_fitted_back_exactly(tmp_path):
    """Exactly linear A100 CodeLlama-34B data: the Qwen2.5-32B coefficients by hand."""
    shape = {
        "n_head": 64,
        "n_kv_head": 8,
        "n_embd": 8192,
        "n_expanded_embd": 22016,
        "vocab_size": 32768,
        "use_gated_mlp": True,
    }
    coef = dict(SYNTH, mlp_up_proj=(0.050, 0.0))  # flat up_proj: every line is exact

    def ms(n):
        return {op: a + b * n for op, (a, b) in coef.items()}

    a100 = [_row(ms(n), n, 1, shape) for n in H100_N]
    h100 = [_row({op: t / 2.5 for op, t in ms(n).items()}, n, 1, shape) for n in H100_N]
    _write_csv(tmp_path / ft.A100_34B_FILE, a100)
    _write_csv(tmp_path / ft.H100_34B_FILE, h100)
    r = ft.fit(tmp_path, profile="qwen2.5-32b/a100-80gb")
    a = QWEN_RATIO["emb"] * coef["emb"][0]
    a += 64 * sum(QWEN_RATIO[op] * coef[op][0] for op in ft.LAYER_OPS)
    b = QWEN_RATIO["emb"] * coef["emb"][1]
    b += 64 * sum(QWEN_RATIO[op] * coef[op][1] for op in ft.LAYER_OPS)
    lm = QWEN_LM * coef["mlp_up_proj"][0]
    assert r["base_s"] == pytest.approx((a + lm) * 1e-3, rel=1e-9)
    assert r["decode_seq_s"] == pytest.approx(b * 1e-3, rel=1e-9)
    assert r["prefill_token_s"] == pytest.approx(b * 1e-3, rel=1e-9)
    assert r["residuals"]["decode"]["max_abs_rel"] < 1e-9
    assert r["residuals"]["prefill"]["max_abs_rel"] < 1e-9
    cc = r["cross_check"]
    for region in ("n=1", "memory_bound_median", "compute_bound_median"):
        assert cc["speedup_all_gemms"][region] == pytest.approx(2.5)
    for key, ratio in cc["coefficient_ratio_primary_over_other"].items():
        assert ratio == pytest.approx(2.5), key
