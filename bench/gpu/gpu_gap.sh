#!/usr/bin/env bash
# Where the HTTP path loses to the in-process engine at one concurrency, on the GPU machine, in
# one run. ROUNDS alternated rounds of LEGS, each on the same model and workload:
#   engine   `mlxd bench engine`: the engine in-process (its decode step p50 in the JSON)
#   loaded   the same, while bench/bench_gateway.py runs the real gateway and client beside
#            it at the same token rate (no model): does their CPU slow the engine's steps?
#   http     the daemon over HTTP, then its worker's own decode step p50 (`mlxd worker stats`)
#   http1    the same with the load from one client process (--client-procs 1)
#   smallkv  the same with --kv-cache-gb SMALL_KV (a pool as small as the engine bench's)
#   nowarm   the same with --warmup-s 0 (no warm-up at start, as the engine bench has none:
#            does what the warm-up leaves behind, e.g. in MLX's caches, slow later steps?)
#   graphs, enginegraphs  http and engine with MLX_CUDA_GRAPH_CACHE_SIZE=GRAPH_CACHE (1000;
#            MLX 0.32 caches 400 CUDA graphs, cut at 100 ops on an H100/H200 and 20 on other
#            GPUs, mlx/backend/cuda/device.cpp): does re-instantiating evicted ones cost a step?
#   ops, engineops  http and engine with MLX_MAX_OPS_PER_BUFFER=OPS (200; MLX's default on an
#            H100/H200 100): fewer, larger CUDA graphs a step
#   enginecap  the engine with MLX's buffer cache capped at CAP_GB (1), as a served worker caps
#            its own (`footprint.buffer_cache_bytes`; MLX's default on a GPU is its memory
#            limit): do freed buffers go back to the device and come again each step?
# Served legs also give the gateway's own mean TTFT over the level (from /metrics).
# Results: $OUT/gap.txt (one line per leg and round) and the JSON of every leg.
#   bash bench/gpu/gpu_gap.sh            (after .gpuB/install.sh; knobs below)
#   CONC=64 OUTPUT=256 PROMPT=128 ROUNDS=2 SMALL_KV=6 SIZE=qwen3-0.6b DTYPE=bfloat16 (or MODEL=DIR)
#   LEGS="engine loaded http smallkv" STEP_MS=8 (the synthetic worker's step in `loaded`)
#   SPY=1 (after the timed rounds, one more round "spy" of the same legs under py-spy: the
#   engine legs whole, a served worker through its measured level, SPY_S=6 s; SPY_NATIVE=1: C
#   frames too; `bench/stack_summary.py` of them in $OUT/spy.txt; py-spy's wheel is in .gpuP/,
#   staged by bench/gpu/stage_peers.sh). The spied round's figures are no timing: py-spy
#   --native at 200 Hz made the engine's dense step 42 ms against 8.6 served (run RP1).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f /root/mlx-env.sh ] && source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
PY="${PY:-python3}"
CONC="${CONC:-64}"; OUTPUT="${OUTPUT:-256}"; PROMPT="${PROMPT:-128}"; ROUNDS="${ROUNDS:-2}"
SMALL_KV="${SMALL_KV:-6}"; SIZE="${SIZE:-qwen3-0.6b}"; DTYPE="${DTYPE:-bfloat16}"
STEP_MS="${STEP_MS:-8}"; LEGS=" ${LEGS:-engine loaded http http1 smallkv} "
MODELS="${MODELS:-/root/models}"; OUT="${OUT:-$PWD/out}"; PORT="${PORT:-8300}"
mkdir -p "$OUT" "$MODELS"
M="${MODEL:-$MODELS/$SIZE-$DTYPE}"  # MODEL: a model directory of any shape instead
ARCH="${SIZE%%-*}"; case "$SIZE" in tiny|small|deep) ARCH=qwen3 ;; esac
[ -f "$M/config.json" ] || "$PY" -m mlxd make-model --arch "$ARCH" --size "$SIZE" \
  --dtype "$DTYPE" --out "$M" --force >&2 || exit 1
{ nproc; lscpu | grep -E "Model name|Thread|Core|Socket|MHz" ; } > "$OUT/cpu.txt" 2>&1
SERVER=""; LOAD=""
stop() {
  for p in $SERVER $LOAD; do kill -TERM "$p" 2>/dev/null; done
  for p in $SERVER $LOAD; do wait "$p" 2>/dev/null; done
  SERVER=""; LOAD=""
}
trap stop EXIT
want() { [[ "$LEGS" == *" $1 "* ]]; }
# row LEG ROUND JSON [STEP_P50]: one line of gap.txt from a bench JSON
row() {
  "$PY" - "$@" <<'EOF' | tee -a "$OUT/gap.txt"
import json, sys
leg, rnd, path = sys.argv[1:4]
rows = json.load(open(path))
rows = rows["rows"] if isinstance(rows, dict) else rows
r = [x for x in rows if x.get("concurrency") == int(__import__("os").environ["CONC"])][-1]
step = sys.argv[4] if len(sys.argv) > 4 else r.get("step_p50_ms", "?")
print(f"{leg:8} round {rnd}  tok/s {r['output_tok_s']:8.1f}  itl p50 {r['itl_p50_ms']:6.2f} ms"
      f"  ttft p50 {r['ttft_p50_ms']:7.1f} ms  step p50 {step} ms  failed {r.get('failed', 0)}")
EOF
}
export CONC
SPYBIN=/root/pyspy/bin/py-spy  # SPY=1: py-spy from its wheel in .gpuP/ (stage_peers.sh)
if [ "${SPY:-0}" = 1 ] && [ ! -x "$SPYBIN" ]; then
  "$PY" -m pip install -q --no-index --target /root/pyspy "$(ls .gpu*/py_spy-*.whl | head -1)" || SPY=0
fi
SPYING=0  # 1 in the spied round only: the timed rounds run without py-spy
spy() {  # NAME: py-spy's prefix for a leg's command, in the spied round
  [ "$SPYING" = 1 ] && echo "$SPYBIN record -r 200 -f raw -o $OUT/$1-spy.txt" \
    "$([ "${SPY_NATIVE:-0}" = 1 ] && echo --native)" --
}
engine() {  # engine NAME ROUND
  # shellcheck disable=SC2046,SC2086  # LEG_ENV and spy add words to the command
  env ${LEG_ENV:-} $(spy "$1-$2") "$PY" -m mlxd bench engine --model "$M" --concurrency "$CONC" ${ENGINE_ARGS:-} \
    --prompt-tokens "$PROMPT" --max-tokens "$OUTPUT" --no-compare-mlx-lm --json "$OUT/$1-$2.json" \
    > "$OUT/$1-$2.log" 2>&1 && row "$1" "$2" "$OUT/$1-$2.json"
}
# ttft_sum URL: "sum count" of the gateway's TTFT histogram
ttft_sum() {
  curl -sf "$1/metrics" | awk '/^mlxd_time_to_first_token_seconds_sum/ {s=$2} /^mlxd_time_to_first_token_seconds_count/ {c=$2} END {print s+0, c+0}'
}
served() {  # served NAME ROUND CLIENT_PROCS [MLXD START OPTIONS]
  local name=$1 rnd=$2 procs=$3 url before after; shift 3; PORT=$(( PORT + 1 )); url="http://127.0.0.1:$PORT"
  # shellcheck disable=SC2086  # LEG_ENV: the leg's environment, words
  env ${LEG_ENV:-} "$PY" -m mlxd start --model "bench=$M" --port "$PORT" --log-level warning --max-num-seqs 128 \
    --max-queued 1024 "$@" >> "$OUT/mlxd.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 240); do curl -sf "$url/health" >/dev/null && break; sleep 0.5; done
  # prime at the measured concurrency only, so the worker's recent steps are mostly its rows
  "$PY" -m mlxd bench run --url "$url" --model bench --prompt-tokens "$PROMPT" --max-tokens 80 \
    --concurrency "$CONC" --warmup-tokens 0 --json /tmp/prime.json > /dev/null 2>&1
  "$PY" -m mlxd bench run --url "$url" --model bench --prompt-tokens "$PROMPT" \
    --max-tokens 16 --concurrency "$CONC" --warmup-tokens 0 --client-procs "$procs" \
    --json /tmp/warm.json > /dev/null 2>&1  # the level's own warm-up, outside the TTFT sums
  before=$(ttft_sum "$url")
  if [ "$SPYING" = 1 ]; then  # the worker's stacks through the measured level
    # shellcheck disable=SC2046  # SPY_NATIVE=1 adds one option: C frames (CUDA's calls) too
    "$SPYBIN" record -p "$(pgrep -n -f 'mlxd worker serve')" -r 200 -d "${SPY_S:-6}" -f raw \
      $([ "${SPY_NATIVE:-0}" = 1 ] && echo --native) \
      -o "$OUT/$name-$rnd-spy.txt" > "$OUT/$name-$rnd-spy.log" 2>&1 &
  fi
  "$PY" -m mlxd bench run --url "$url" --model bench --prompt-tokens "$PROMPT" \
    --max-tokens "$OUTPUT" --concurrency "$CONC" --timeout 120 --json "$OUT/$name-$rnd.json" \
    --warmup-tokens 0 --client-procs "$procs" > "$OUT/$name-$rnd.log" 2>&1
  after=$(ttft_sum "$url")
  echo "$before $after" | awk '{n=$4-$2; if (n>0) printf "         gateway TTFT mean %.1f ms over %d requests\n", ($3-$1)/n*1000, n}' >> "$OUT/gap.txt"
  "$PY" -m mlxd worker stats bench --url "$url" --json > "$OUT/$name-$rnd-stats.json" 2>&1
  # its memory: the buffer cache, its cap and how often the engine emptied it when full
  "$PY" -m mlxd worker status bench --url "$url" --json > "$OUT/$name-$rnd-status.json" 2>&1
  local step
  step=$("$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); print(f\"{s['decode_step']['p50_ms']:.2f} (rows {s['decode_rows_mean']:.1f})\")" "$OUT/$name-$rnd-stats.json" 2>/dev/null)
  row "$name" "$rnd" "$OUT/$name-$rnd.json" "${step:-?}"
  stop
}
for rnd in $(seq "$ROUNDS") $([ "${SPY:-0}" = 1 ] && echo spy); do
  [ "$rnd" = spy ] && SPYING=1 && echo "the spied round (py-spy attached: no timing)" >> "$OUT/gap.txt"
  want engine && engine engine "$rnd"
  if want loaded; then
    "$PY" bench/bench_gateway.py "$CONC" 100000 "$STEP_MS" 1 completions > "$OUT/load-$rnd.log" 2>&1 &
    LOAD=$!
    sleep 8
    kill -0 "$LOAD" 2>/dev/null && echo "         (the synthetic load ran throughout)" >> "$OUT/gap.txt"
    engine loaded "$rnd"
    kill -0 "$LOAD" 2>/dev/null || { echo "         (the synthetic load had stopped)" >> "$OUT/gap.txt"; tail -3 "$OUT/load-$rnd.log" >> "$OUT/gap.txt"; }
    stop
  fi
  want http && served http "$rnd" 0
  want http1 && served http1 "$rnd" 1
  want smallkv && served smallkv "$rnd" 0 --kv-cache-gb "$SMALL_KV"
  want nowarm && served nowarm "$rnd" 0 --warmup-s 0
  graphs="MLX_CUDA_GRAPH_CACHE_SIZE=${GRAPH_CACHE:-1000}"
  want enginegraphs && LEG_ENV=$graphs engine enginegraphs "$rnd"
  want graphs && LEG_ENV=$graphs served graphs "$rnd" 0
  want enginecap && ENGINE_ARGS="--buffer-cache-gb ${CAP_GB:-1}" engine enginecap "$rnd"
  ops="MLX_MAX_OPS_PER_BUFFER=${OPS:-200}"
  want engineops && LEG_ENV=$ops engine engineops "$rnd"
  want ops && LEG_ENV=$ops served ops "$rnd" 0
done
[ "${SPY:-0}" = 1 ] && wait && "$PY" bench/stack_summary.py "$OUT"/*-spy.txt > "$OUT/spy.txt" 2>&1
cat "$OUT/cpu.txt"
