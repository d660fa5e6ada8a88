#!/usr/bin/env bash
# The standard benchmark suite on the GPU machine (MLX CUDA backend), in ONE run of at most
# 10 minutes: JSON, tables and logs under $OUT. Plots are drawn afterwards, here, from the JSON
# (the GPU machine has no matplotlib): bash bench/gpu/gpu_plots.sh DIR_WITH_THE_JSON
#
# Setup (../shared/gpu/stage.sh, with EXTRA="httptools prometheus_client llguidance" if the
# machine lacks them): run 1 carries .gpuA: `bash .gpuA/install.sh a`; run 2 carries .gpuB:
#   bash .gpuB/install.sh b && bash bench/gpu/gpu_suite.sh
# The repo runs from the copy with PYTHONPATH (no install). Knobs (environment):
#   BUDGET_S=520   the whole suite; each leg gets min(its own bound, what is left)
#   LEVELS=1,4,16,64,128  PROMPT=128  OUTPUT=128  RUNS=1  PREFIXES=500,2000,8000
#   SIZE=qwen3-0.6b DTYPE=bfloat16  (the main model)   MODELS=/root/models  OUT=./out
#   EXTRA_LEGS=1   Llama-3.2-1B bf16 (EXTRA_SIZE) and the 4-bit main model, when time is left
#   PEERS=1        mlx_lm.server legs (0: mlxd only, e.g. to re-measure a change)
#   LEGS="http prefix engine peers extra contiguous zmq paged hit"  the legs to run (default: all)
#   EXTRA_SIZE=llama-3.2-1b  the other bf16 shape of leg 5 (none: only the 4-bit main model)
# Legs, most important first (legs.txt says which ran, their exit codes and seconds):
#   1 mlxd over HTTP: throughput vs concurrency       http-$SIZE-$DTYPE.json
#   2 mlxd over HTTP: shared-prefix TTFT cold vs hit  prefix-$SIZE-$DTYPE.json
#   3 engine in-process (+ mlx-lm BatchGenerator)     engine-$SIZE-$DTYPE.json
#   4 mlx_lm.server, same model and workload          mlx_lm_server-*.json, mlx_lm_server-prefix-*
#   5 Llama-3.2-1B bf16 and $SIZE 4-bit over HTTP     http-llama-3.2-1b-bfloat16.json, http-*-q4.json
#     and, when mlxd has --no-paged-kv, the contiguous cache over HTTP  http-contiguous-*.json
#   6 worker over ZeroMQ alone; engine paged vs contiguous (bench/bench_paged.py)  zmq*.json, paged*.json
#     and where a prefix hit's TTFT goes, in-process (bench/profile_prefix_hit.py)  prefix_hit.json
# A leg cut by its time bound still leaves the levels it finished (JSON "complete": false).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f /root/mlx-env.sh ] && source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
PY="${PY:-python3}"
BUDGET_S="${BUDGET_S:-520}"; LEVELS="${LEVELS:-1,4,16,64,128}"; RUNS="${RUNS:-1}"
PROMPT="${PROMPT:-128}"; OUTPUT="${OUTPUT:-128}"; PREFIXES="${PREFIXES:-500,2000,8000}"
SIZE="${SIZE:-qwen3-0.6b}"; DTYPE="${DTYPE:-bfloat16}"; EXTRA_LEGS="${EXTRA_LEGS:-1}"
MODELS="${MODELS:-/root/models}"; OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT" "$MODELS"
MAX_SEQS="${MAX_SEQS:-128}"; PORT="${PORT:-8123}"
T0=$SECONDS
SERVER=""
LEGS=" ${LEGS:-http prefix engine peers extra contiguous zmq paged hit} "
want() { [[ "$LEGS" == *" $1 "* ]]; }

log() { echo "== $(( SECONDS - T0 ))s $*" | tee -a "$OUT/suite.txt" >&2; }
left() { echo $(( BUDGET_S - (SECONDS - T0) )); }
# bound MAX: seconds a step may take: MAX, or less when the budget runs out
bound() { local l; l=$(left); echo $(( $1 < l ? $1 : l )); }
stop_server() {
  [ -n "$SERVER" ] || return 0
  kill -TERM "$SERVER" 2>/dev/null
  for _ in $(seq 30); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.5; done
  kill -KILL "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; SERVER=""
}
trap stop_server EXIT
wait_up() {  # wait_up URL SECONDS
  local deadline=$(( SECONDS + $2 ))
  while [ $SECONDS -lt $deadline ]; do
    curl -sf "$1" >/dev/null && return 0
    kill -0 "$SERVER" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}
# run NAME MAX_S CMD...: one timed step; skipped when under 15 s are left
run() {
  local name=$1 t s rc; t=$(bound "$2"); shift 2
  if [ "$t" -lt 15 ]; then log "skip $name: budget spent"; echo "$name skipped" >> "$OUT/legs.txt"; return 1; fi
  log "$name (bound ${t}s)"; s=$SECONDS
  timeout -k 5 "$t" "$@" 2>>"$OUT/stderr.txt" | tee -a "$OUT/suite.txt"; rc=${PIPESTATUS[0]}
  echo "$name rc=$rc $(( SECONDS - s ))s" >> "$OUT/legs.txt"
  return "$rc"
}
# model SIZE DTYPE [BITS]: the model's directory, made (random weights, real shape) if missing
model() {
  local arch="${1%%-*}" dir="$MODELS/$1-$2${3:+-q$3}"
  case "$1" in tiny|small) arch=qwen3 ;; esac
  if [ ! -f "$dir/config.json" ]; then
    run "make-model $1 $2${3:+ q$3}" 120 "$PY" -m mlxd make-model --arch "$arch" --size "$1" \
      --dtype "$2" ${3:+--quantize "$3"} --out "$dir" --force >&2 || return 1
  fi
  echo "$dir"
}
# A new port for every server: mlx_lm.server's port may linger in TIME_WAIT, and mlxd before
# commit "start: SO_REUSEADDR" refused such a port.
new_port() { PORT=$(( PORT + 1 )); }
start_mlxd() {  # start_mlxd MODEL_DIR [MLXD START OPTIONS...]
  local m=$1; shift; new_port
  "$PY" -m mlxd start --model "bench=$m" --port "$PORT" --log-level warning \
    --max-num-seqs "$MAX_SEQS" --max-queued 1024 "$@" >> "$OUT/mlxd.log" 2>&1 &
  SERVER=$!
  wait_up "http://127.0.0.1:$PORT/health" "$(bound 120)" || { log "mlxd did not start"; stop_server; return 1; }
}
bench_http() {  # bench_http NAME MAX_S JSON MODEL_NAME [ARGS...]
  local name=$1 max=$2 json=$3 m=$4; shift 4
  run "$name" "$max" "$PY" -m mlxd bench run --url "http://127.0.0.1:$PORT" --model "$m" \
    --prompt-tokens "$PROMPT" --max-tokens "$OUTPUT" --runs "$RUNS" --timeout 120 \
    --json "$OUT/$json" "$@"
}
# prime MODEL_NAME [ARGS...]: one unmeasured request of OUTPUT tokens and a batch of 64, so the
# first CUDA kernel compiles of a fresh machine (26 s seen) land in no measured level: a
# level's own 16-token warm-up does not reach the shapes of longer decodes.
prime() {
  local m=$1; shift
  run "prime $m" 90 "$PY" -m mlxd bench run --url "http://127.0.0.1:$PORT" --model "$m" \
    --prompt-tokens "$PROMPT" --max-tokens "$OUTPUT" --concurrency 1,64 --warmup-tokens 0 \
    --timeout 120 --json /tmp/prime.json "$@" > /dev/null
}
throughput_leg() {  # throughput_leg SIZE DTYPE [BITS]: mlxd over HTTP on one model
  local m tag="$1-$2${3:+-q$3}"
  m=$(model "$@") || return 1
  start_mlxd "$m" || return 1
  prime bench
  bench_http "mlxd http $tag" 150 "http-$tag.json" bench --concurrency "$LEVELS" --label "mlxd $tag"
  stop_server
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi'
  "$PY" -c "import mlx.core as mx, mlx_lm; print('mlx', mx.__version__, mx.default_device(), 'mlx-lm', mlx_lm.__version__)"
  # the device's copy of .git can be stale: the caller passes the commit it runs
  echo "commit ${MLXD_COMMIT:-$(git log -1 --format=%h 2>/dev/null || echo "unknown: set MLXD_COMMIT")}"; date -u
  echo "LEVELS=$LEVELS PROMPT=$PROMPT OUTPUT=$OUTPUT RUNS=$RUNS PREFIXES=$PREFIXES SIZE=$SIZE DTYPE=$DTYPE"
} | tee "$OUT/machine.txt"
: > "$OUT/legs.txt"
TAG="$SIZE-$DTYPE"
M=$(model "$SIZE" "$DTYPE") || { log "cannot make the main model"; exit 1; }

# 1-2: mlxd over HTTP, one daemon for throughput and shared prefix.
if { want http || want prefix; } && start_mlxd "$M"; then
  prime bench
  want http && bench_http "mlxd http $TAG" 150 "http-$TAG.json" bench --concurrency "$LEVELS" \
    --label "mlxd"
  want prefix && bench_http "mlxd prefix $TAG" 90 "prefix-$TAG.json" bench \
    --scenario shared-prefix --prefix-tokens "$PREFIXES" --concurrency 1,8 --max-tokens 16 \
    --label "mlxd"
  stop_server
fi

# 3: the engine in-process, the gateway's cost as a ratio; mlx-lm's BatchGenerator alongside.
want engine && run "engine $TAG" 120 "$PY" -m mlxd bench engine --model "$M" --concurrency "$LEVELS" \
  --prompt-tokens "$PROMPT" --max-tokens "$OUTPUT" --json "$OUT/engine-$TAG.json" --label "mlxd engine"

# 4: mlx-lm's own server, same model, same prompts (as text), same levels.
if want peers && [ "${PEERS:-1}" = 1 ] && [ "$(left)" -gt 60 ]; then
  new_port
  "$PY" -m mlx_lm.server --model "$M" --port "$PORT" --decode-concurrency "$MAX_SEQS" \
    --log-level WARNING >> "$OUT/mlx_lm_server.log" 2>&1 &
  SERVER=$!
  if wait_up "http://127.0.0.1:$PORT/v1/models" "$(bound 120)"; then
    prime "$M" --text-prompts-from "$M"
    bench_http "mlx_lm.server $TAG" 150 "mlx_lm_server-$TAG.json" "$M" --text-prompts-from "$M" \
      --concurrency "$LEVELS" --label "mlx_lm.server"
    bench_http "mlx_lm.server prefix $TAG" 60 "mlx_lm_server-prefix-$TAG.json" "$M" \
      --text-prompts-from "$M" --scenario shared-prefix --prefix-tokens "$PREFIXES" \
      --concurrency 1,8 --max-tokens 16 --label "mlx_lm.server"
  else
    log "mlx_lm.server did not start"
  fi
  stop_server
fi

# 5: other shapes, while time is left.
if want extra && [ "$EXTRA_LEGS" = 1 ]; then
  EXTRA_SIZE="${EXTRA_SIZE:-llama-3.2-1b}"
  [ "$EXTRA_SIZE" != none ] && [ "$(left)" -gt 90 ] && throughput_leg "$EXTRA_SIZE" bfloat16
  [ "$(left)" -gt 60 ] && throughput_leg "$SIZE" "$DTYPE" 4
fi

# 5b: the contiguous KV cache over HTTP, against the paged default (when this mlxd has both).
if want contiguous && [ "$(left)" -gt 60 ] && "$PY" -m mlxd start --help 2>/dev/null | grep -q -- --no-paged-kv; then
  if start_mlxd "$M" --no-paged-kv; then
    prime bench
    bench_http "mlxd http contiguous $TAG" 120 "http-contiguous-$TAG.json" bench \
      --concurrency "$LEVELS" --label "mlxd --no-paged-kv"
    stop_server
  fi
fi

# 6: where the time goes: the worker without the gateway, and the paged cache's decode step.
if want zmq && [ "$(left)" -gt 45 ]; then
  "$PY" -m mlxd worker serve --model "$M" --bind ipc:///tmp/suite.sock --max-num-seqs "$MAX_SEQS" \
    --log-level WARNING >> "$OUT/worker.log" 2>&1 &
  SERVER=$!; sleep 10
  for c in 1 64; do run "zmq c=$c" 40 "$PY" bench/bench_zmq.py ipc:///tmp/suite.sock $c > "$OUT/zmq$c.json"; done
  stop_server
fi
want paged && for b in 16 64; do
  run "paged vs contiguous b=$b" 60 "$PY" bench/bench_paged.py "$M" $b 128 128 32 > "$OUT/paged$b.json"
done
want hit && run "prefix hit in-process" 90 "$PY" bench/profile_prefix_hit.py "$M" 2000 128,16 5 \
  > "$OUT/prefix_hit.json"
log "done in $(( SECONDS - T0 ))s; legs:"; cat "$OUT/legs.txt" >&2
