"""Tests of analysis/gpu_iteration_times.py's comparison (the measuring half needs a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_analysis

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "analysis" / "gpu_iteration_times.py"
DATA = ROOT / "analysis" / "data" / "h200_iteration_times_a.json"

git = load_analysis("gpu_iteration_times")

TRUE = dict(base_s=0.005, prefill_token_s=2.5e-5, decode_seq_s=1.5e-5, kv_token_s=3e-8)


def _point(prefill, decode, kv, coef=TRUE):
    p = dict(kind="x", prefill_tokens=prefill, decode_seqs=decode, kv_tokens=kv)
    p["median_ms"] = git._predict(coef, p) * 1e3
    return p


def test_refit_recovers_exact_linear_points():
    points = [_point(0, b, b * c) for b in (1, 8, 64) for c in (256, 4096)]
    points += [_point(n, 0, ctx) for n in (512, 2048) for ctx in (0, 8192)]
    fitted = git.refit(points)
    for name, value in TRUE.items():
        assert fitted[name] == pytest.approx(value, rel=1e-6)
    assert max(abs(e) for e in git.prediction_errors(fitted, points)) < 1e-9


def test_bandwidth_scaling_touches_only_memory_terms():
    # at 85% of the H100's 3350 GB/s the scale is exactly 1; at twice that, a half
    same = git._scaled_default(TRUE, 3350.0 * 0.85)
    assert same == pytest.approx(TRUE)
    half = git._scaled_default(TRUE, 2 * 3350.0 * 0.85)
    assert half["base_s"] == pytest.approx(TRUE["base_s"] / 2)
    assert half["kv_token_s"] == pytest.approx(TRUE["kv_token_s"] / 2)
    assert half["prefill_token_s"] == TRUE["prefill_token_s"]
    assert git._scaled_default(TRUE, None) == TRUE


def test_compare_on_the_committed_h200_measurements(tmp_path):
    out = tmp_path / "cmp"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "compare", str(DATA), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    fit = json.loads((out / "fit.json").read_text())
    # the KV slope measured on the H200 matches the bandwidth-scaled default (docs)
    refit = fit["models"]["refit"]["kv_token_s"]
    scaled = fit["models"]["default, bandwidth-scaled"]["kv_token_s"]
    assert refit == pytest.approx(scaled, rel=0.1)
    assert {"summary.md", "fit.png"} <= {p.name for p in out.iterdir()}


def test_compare_bad_file_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "compare", str(bad), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and str(bad) in run.stderr
    assert not (tmp_path / "o").exists()
