#!/usr/bin/env bash
# Scale-out on ONE GPU (#22): what sharing one H100 costs. Results (JSON + tables) under $OUT.
#   1. multi-turn chat: 1 replica vs 2 replicas (cache-aware, round robin) sharing the GPU
#      (bench/bench_replicas.sh: prefix hit rate, TTFT per turn);
#   2. throughput: 1 worker vs 2 replicas vs a 2-process worker group (tensor parallel, ring
#      backend over localhost TCP; NCCL refuses two ranks on one GPU), LEVELS concurrency.
# Run after `bash .gpuB/install.sh b` (see ../shared/gpu/stage.sh). Usage:
#   bash bench/gpu/gpu_scaleout.sh [ARCH_SIZE=qwen3-0.6b] [DTYPE=bfloat16] [LEVELS=1,8,32]
set -euo pipefail
cd "$(dirname "$0")/../.."
source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
SIZE="${1:-qwen3-0.6b}"; DTYPE="${2:-bfloat16}"; LEVELS="${3:-1,8,32}"
ARCH="${SIZE%%-*}"
export OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export MLXD_HOME="$OUT/home" PYTHON=python3
MODEL="/root/models/$SIZE-$DTYPE"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
[ -d "$MODEL" ] || python3 -m mlxd make-model --arch "$ARCH" --size "$SIZE" --dtype "$DTYPE" --out "$MODEL"
# Each worker gets its own KV budget: two on one GPU must not each take half of it.
COMMON="--kv-cache-gb 8 --max-num-seqs 64 --max-queued 1024"
START_ARGS="$COMMON" bash bench/bench_replicas.sh "$MODEL" 8 --turns 4 --prompt-tokens 512 \
  --max-tokens 64 --runs 2 || echo "replicas multi-turn failed" | tee -a "$OUT/failures.txt"
PORT=8126
throughput() {  # NAME, then `mlxd start` options
  local name="$1"; shift
  # shellcheck disable=SC2086  # COMMON is a list of options
  python3 -m mlxd start --model "bench=$MODEL" --port "$PORT" --log-level info $COMMON "$@" \
    > "$OUT/daemon-tp-$name.log" 2>&1 &
  local daemon=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.5; done
  python3 -m mlxd bench run --url "http://127.0.0.1:$PORT" --model bench --concurrency "$LEVELS" \
    --prompt-tokens 128 --max-tokens 256 --label "$name" --json "$OUT/throughput-$name.json" \
    2>&1 | tee "$OUT/throughput-$name.txt" || echo "$name failed" | tee -a "$OUT/failures.txt"
  kill -TERM "$daemon"; wait "$daemon" || true
}
throughput one
throughput two-replicas --replicas 2
throughput group-ring --group-size 2 --distributed ring
