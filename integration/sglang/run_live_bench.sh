#!/usr/bin/env bash
# Live bench on the CPU: the real SGLang 0.5.23 server (HTTP server, scheduler event loops,
# radix cache, PrefillAdder, retract_decode, chunked prefill) with only the model replaced
# by topas_sglang.fake_model, which takes a server profile's iteration time per forward.
# TOPAS and SGLang's own lpm and lru policies (topas-greedy on request), overlap scheduler
# on and off, beside the simulator's JCTs on the same instances (seeds 20 and 21, reporting
# seeds). About 25 minutes on two cores; --quick (part of `make test`) about two.
#
#   integration/sglang/run_live_bench.sh [--quick] [live_bench.py options...]
#
# Needs the environment with SGLang and the plugin: `make install-sglang` (.venv-sglang) or
# pip install ".[sglang]". Writes results/live_bench/ unless --out says otherwise.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-$HERE/../../.venv-sglang/bin/python}
[[ -x "$PY" ]] || PY=python
exec "$PY" "$HERE/live_bench.py" "$@"
