#!/usr/bin/env bash
# Hybrids and sliding windows on the GPU machine (issue #18): a Qwen3.5-0.8B-shaped model
# (SHAPE=qwen3_5-0.8b) or a Gemma-3-1B-shaped one (SHAPE=gemma3-1b), random weights, bf16
# (bench/make_shaped.py), served by this mlxd (attention in the block pool: recurrent state by
# row, worker/runners/hybrid.py; window layers in slabs, worker/runners/window.py), by an earlier
# mlxd checkout in $BEFORE (the model's own caches and whole-cache snapshots) and by
# mlx_lm.server, one after the other on one machine. Per server: TTFT of a shared
# $PREFIX-token system prompt cold vs hit at 1 and 8 streams (`mlxd bench run --scenario
# shared-prefix`), then decode tok/s at $LEVELS streams (128-token prompts, 128 tokens out).
# Run after `bash .gpuB/install.sh b`. Usage (SERVERS picks and orders them):
#   [SHAPE=qwen3_5-0.8b] [BEFORE=.before] [SERVERS="after before mlx_lm"] [PREFIX=4000] \
#     [LEVELS=1,8,32] bash bench/gpu/gpu_hybrid.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source /root/mlx-env.sh  # mlx and mlx-lm come on PYTHONPATH: extend it, never replace it
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
PREFIX=${PREFIX:-4000}; LEVELS=${LEVELS:-1,8,32}; BEFORE=${BEFORE:-.before}
SHAPE=${SHAPE:-qwen3_5-0.8b}; M=/root/$SHAPE
[ -f "$M/config.json" ] || PYTHONPATH="$PWD:${PYTHONPATH:-}" python3 bench/make_shaped.py "$SHAPE" "$M" \
  --dtype bfloat16 > /dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
PORT=8200
SERVER=""
stop() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; SERVER=""; }
trap stop EXIT
up() {  # up URL: wait for the server (at most 120 s)
  for _ in $(seq 240); do curl -sf "$1" > /dev/null && return 0; sleep 0.5; done
  echo "server did not start"; return 1
}
bench() {  # bench NAME BOUND_S MODEL [ARGS...]
  local name=$1 bound=$2 model=$3; shift 3
  echo "== $name ($(date -u +%H:%M:%S))"
  timeout -k 5 "$bound" python3 -m mlxd bench run --url "http://127.0.0.1:$PORT" --model "$model" \
    --timeout 300 --json "$OUT/$name.json" "$@" 2>&1 | grep -v "^\s*$" | tail -12
}
legs() {  # legs TAG MODEL [ARGS...]: shared prefix, then throughput
  local tag=$1 model=$2; shift 2
  # the first CUDA kernel builds of a fresh machine (a 2,048-token chunk's: 44 s once) land here
  bench "$tag-prime" 100 "$model" --prompt-tokens 4096 --max-tokens 32 --concurrency 1 "$@" \
    > /dev/null
  bench "$tag-prefix" 200 "$model" --scenario shared-prefix --prefix-tokens "$PREFIX" \
    --concurrency 1,8 --max-tokens 16 "$@"
  bench "$tag-decode" 120 "$model" --prompt-tokens 128 --max-tokens 128 --concurrency "$LEVELS" "$@"
}
for server in ${SERVERS:-after before mlx_lm}; do
  PORT=$((PORT + 1))
  case $server in
    after|before)
      src=$PWD; [ "$server" = before ] && src=$(cd "$BEFORE" && pwd)
      # from its own directory: `python -m` puts the working directory first on the path
      (cd "$src" && PYTHONPATH="$src:${PYTHONPATH:-}" MLXD_HOME="/root/home-$server" exec python3 -m mlxd start \
        --model "q=$M" --port "$PORT" --max-num-seqs 64 --kv-cache-gb 16 --max-memory 40GB \
        --log-level warning > "$OUT/$server.log" 2>&1) &
      SERVER=$!
      up "http://127.0.0.1:$PORT/v1/models" && legs "$server" q
      curl -s "http://127.0.0.1:$PORT/metrics" | grep -i "prefix\|cached" | head -8
      ;;
    mlx_lm)
      python3 -m mlx_lm.server --model "$M" --port "$PORT" --decode-concurrency 64 \
        --log-level WARNING > "$OUT/mlx_lm.log" 2>&1 &
      SERVER=$!
      up "http://127.0.0.1:$PORT/v1/models" && legs mlx_lm "$M" --text-prompts-from "$M"
      ;;
  esac
  stop
done
tail -n 5 "$OUT"/*.log 2>/dev/null
