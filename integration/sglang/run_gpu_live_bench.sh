#!/usr/bin/env bash
# Live JCT bench of the TOPAS plugin: SGLang 0.5.23 with dummy weights, run once with
# SGLang's own policy (lpm order, LRU eviction) and once with TOPAS, on metagpt-sop and
# one synthetic workload; prints a JCT table.
#
#   integration/sglang/run_gpu_live_bench.sh MODEL_DIR [OUT_DIR]
#
# MODEL_DIR holds only a model's config.json (integration/sglang/models/llama-3-8b ships
# the Llama-3-8B one). Needs one H100/H200-class GPU and an environment with the plugin:
# pip install ".[sglang]" from the repository root. It cannot run in this project's CI
# (no GPU there). Sized by the calibrated model to about 80 s + 55 s of serving per server,
# plus two server starts: under 8 minutes in all.
# Environment: PORT (30000), BASE_POLICY (lpm), SOP_TASKS (8), SYN_WORKLOAD (fanout),
# SYN_TASKS (16), SERVER_ARGS (extra sglang.launch_server flags).
set -euo pipefail

MODEL_DIR=${1:-}
OUT=${2:-live-bench}
if [[ -z "$MODEL_DIR" || ! -f "$MODEL_DIR/config.json" ]]; then
    echo "run_gpu_live_bench.sh: ${MODEL_DIR:-MODEL_DIR}/config.json: missing (usage: run_gpu_live_bench.sh MODEL_DIR [OUT_DIR])" >&2
    exit 2
fi
PORT=${PORT:-30000}
BASE_POLICY=${BASE_POLICY:-lpm}
SOP_TASKS=${SOP_TASKS:-8}
SYN_WORKLOAD=${SYN_WORKLOAD:-fanout}
SYN_TASKS=${SYN_TASKS:-16}
PY=${PYTHON:-python}
URL="http://127.0.0.1:$PORT"
mkdir -p "$OUT"

"$PY" -c "import sglang, topas_sglang, sys; sys.exit(sglang.__version__ != topas_sglang.SGLANG_VERSION)" || {
    echo "run_gpu_live_bench.sh: needs sglang==0.5.23 and the plugin: pip install '.[sglang]'" >&2
    exit 2
}

topas generate metagpt-sop --tasks "$SOP_TASKS" --load 1.5 --seed 0 -o "$OUT/metagpt-sop.json"
topas generate "$SYN_WORKLOAD" --tasks "$SYN_TASKS" --load 1.0 --seed 0 -o "$OUT/$SYN_WORKLOAD.json"
WORKLOADS=(metagpt-sop "$SYN_WORKLOAD")
for w in "${WORKLOADS[@]}"; do  # what the calibrated model expects of the same server
    topas simulate "$OUT/$w.json" --policy lpm --timing calibrated --no-progress \
        --out "$OUT/$w-simulated.json" >/dev/null
done

SERVER=""
stop_server() {
    if [[ -n "$SERVER" ]]; then
        kill "$SERVER" 2>/dev/null || true
        wait "$SERVER" 2>/dev/null || true
        SERVER=""
    fi
}
trap stop_server EXIT

start_server() {  # label, extra flags...
    local label=$1
    shift
    # Llama-3-8B's config says 8192 positions; the workloads' prompts need more
    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 "$PY" -m sglang.launch_server \
        --model-path "$MODEL_DIR" --load-format dummy --skip-tokenizer-init \
        --context-length 16384 --port "$PORT" --random-seed 0 \
        --schedule-policy "$BASE_POLICY" "$@" ${SERVER_ARGS:-} \
        >"$OUT/server-$label.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 600); do
        if curl -sf "$URL/health" >/dev/null; then
            return 0
        fi
        if ! kill -0 "$SERVER" 2>/dev/null; then
            echo "run_gpu_live_bench.sh: the $label server exited; see $OUT/server-$label.log" >&2
            exit 1
        fi
        sleep 1
    done
    echo "run_gpu_live_bench.sh: the $label server did not come up in 600 s" >&2
    exit 1
}

for label in sglang topas; do
    if [[ $label == topas ]]; then
        start_server topas --radix-eviction-policy topas
    else
        start_server sglang
    fi
    for w in "${WORKLOADS[@]}"; do
        echo "== $label: $w"
        topas serve-bench "$OUT/$w.json" --url "$URL" --label "$label" --out "$OUT/$w-$label.json"
    done
    stop_server
done

"$PY" - "$OUT" "${WORKLOADS[@]}" <<'PYEOF'
import json, sys
out, workloads = sys.argv[1], sys.argv[2:]
print(f"{'workload':<14}{'run':<12}{'mean JCT':>10}{'p50':>9}{'p99':>9}{'makespan':>10}")
for w in workloads:
    base = None
    for run in ("simulated", "sglang", "topas"):
        s = json.load(open(f"{out}/{w}-{run}.json"))["summary"]
        if run == "sglang":
            base = s
        change = "" if run != "topas" else f"  ({100 * (s['mean_jct'] / base['mean_jct'] - 1):+.1f}% mean, {100 * (s['p99_jct'] / base['p99_jct'] - 1):+.1f}% p99)"
        print(f"{w:<14}{run:<12}{s['mean_jct']:>10.2f}{s['p50_jct']:>9.2f}{s['p99_jct']:>9.2f}{s['makespan']:>10.1f}{change}")
PYEOF
