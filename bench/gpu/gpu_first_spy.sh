#!/usr/bin/env bash
# What a worker's first long prompt after a start pays for that the next one does not (issue 41
# point 4: on an H200 the hybrid's first 4,500-token prompt took 1,930 ms against 661 warm, run
# MX2), in C frames: py-spy --native on the served worker through the first prompt, then
# through a second of the same length (no prefix hit), each to raw stacks, then
# bench/stack_summary.py of both (what only the first has: JIT compiles, attention plans, graph
# instantiations, matmul heuristics). Results in $OUT: first.txt, warm.txt (stacks), spy.txt
# (the summary), ttft.txt (each prompt's TTFT under py-spy: not a timing, run RP1's hybrid took
# 14.3 s against 1.9 s unspied in MX2; gpu_matrix.sh's class items time the first prompt).
#   MODEL=/root/models/matrix-hybrid bash bench/gpu/gpu_first_spy.sh
#   knobs: LONG=4500 PORT=8950 SPY_S=15 (each recording's bound) MLXD_ARGS (more `mlxd start`
#   options); py-spy's wheel is in .gpuP/, staged by bench/gpu/stage_peers.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f /root/mlx-env.sh ] && source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
PY="${PY:-python3}"; OUT="${OUT:-$PWD/out}"; PORT="${PORT:-8950}"; LONG="${LONG:-4500}"
SPYBIN="${SPYBIN:-/root/pyspy/bin/py-spy}"
mkdir -p "$OUT"
[ -x "$SPYBIN" ] || "$PY" -m pip install -q --no-index --target /root/pyspy \
  "$(ls .gpu*/py_spy-*.whl | head -1)" || { echo "no py-spy" >&2; exit 1; }
url="http://127.0.0.1:$PORT"
# shellcheck disable=SC2086  # MLXD_ARGS: more options, words
"$PY" -m mlxd start --model "bench=${MODEL:?a model directory}" --port "$PORT" \
  --log-level warning ${MLXD_ARGS:-} > "$OUT/mlxd.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 600); do curl -sf "$url/health" > /dev/null && break; sleep 0.5; done
worker=$(pgrep -n -f "mlxd worker serve")
prompt() {  # NAME SEED: one LONG-token prompt under py-spy (native), its TTFT to ttft.txt
  "$SPYBIN" record -p "$worker" --native -r 200 -d "${SPY_S:-15}" -f raw -o "$OUT/$1.txt" \
    > "$OUT/$1-spy.log" 2>&1 &
  local spy=$!
  sleep 1  # py-spy attached
  "$PY" -m mlxd bench run --url "$url" --model bench --endpoint completions --concurrency 1 \
    --prompt-tokens "$LONG" --max-tokens 2 --warmup-tokens 0 --seed "$2" \
    --json "$OUT/$1.json" > "$OUT/$1.log" 2>&1
  "$PY" -c "import json, sys; r = json.load(open(sys.argv[1]))['rows'][0]; \
print(sys.argv[2], 'TTFT', round(r['ttft_p50_ms']), 'ms under py-spy')" "$OUT/$1.json" "$1" | tee -a "$OUT/ttft.txt"
  wait "$spy"
}
prompt first 101
prompt warm 202
"$PY" bench/stack_summary.py "$OUT/first.txt" "$OUT/warm.txt" --top 40 > "$OUT/spy.txt" 2>&1
