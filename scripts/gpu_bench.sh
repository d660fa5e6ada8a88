#!/usr/bin/env bash
# The standard benchmark on the GPU machine (MLX CUDA backend), results as JSON under $OUT.
# Run after `bash .gpuB/install.sh b` (see ../shared/gpu/stage.sh). Usage:
#   bash scripts/gpu_bench.sh [ARCH_SIZE=qwen3-0.6b] [DTYPE=bfloat16] [LEVELS=1,4,16,64]
set -euo pipefail
cd "$(dirname "$0")/.."
source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
SIZE="${1:-qwen3-0.6b}"; DTYPE="${2:-bfloat16}"; LEVELS="${3:-1,4,16,64}"
ARCH="${SIZE%%-*}"
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
MODEL="/root/models/$SIZE-$DTYPE"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())" | tee -a "$OUT/gpu.txt"
[ -d "$MODEL" ] || python3 -m mlxd make-model --arch "$ARCH" --size "$SIZE" --dtype "$DTYPE" --out "$MODEL"
python3 -m mlxd bench engine --model "$MODEL" --concurrency "$LEVELS" --prompt-tokens 128 \
  --max-tokens 256 --json "$OUT/engine-$SIZE.json" 2>&1 | tee "$OUT/engine-$SIZE.txt"
PORT=8123
python3 -m mlxd start --model "bench=$MODEL" --port "$PORT" --log-level warning \
  --max-num-seqs 128 --max-queued 1024 > "$OUT/daemon.log" 2>&1 &
DAEMON=$!
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.5; done
python3 -m mlxd bench run --url "http://127.0.0.1:$PORT" --model bench --concurrency "$LEVELS" \
  --prompt-tokens 128 --max-tokens 256 --json "$OUT/http-$SIZE.json" 2>&1 | tee "$OUT/http-$SIZE.txt"
kill -TERM "$DAEMON"; wait "$DAEMON" || true
