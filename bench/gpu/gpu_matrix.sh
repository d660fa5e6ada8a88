#!/usr/bin/env bash
# The class matrix on one GPU (issue 41 point 1): per class (random weights at real shapes:
# dense Qwen3-0.6B, hybrid Qwen3.5-0.8B, sliding Gemma-3-1B in bf16, MoE Qwen3-30B-A3B in 4 bits)
# mlxd, vllm-mlx (continuous batching, prefix cache), Rapid-MLX, mlx-vlm's server and
# mlx_lm.server in turn (bench/matrix.py): time to healthy, the first ~4.5k-token prompt after
# the start and one warm (TTFT), 1/16/64 streams of 128 in / 128 out from 8 client processes
# (failures counted), a 2000-token shared prefix cold and hit. A server that fails to start or
# dies is recorded as such. $OUT: matrix-CLASS-SERVER.json, matrix.md (the table for
# docs/PERFORMANCE.md), server and bench logs.
#
# Setup: ../shared/gpu/stage.sh (.gpuA/.gpuB) and bench/gpu/stage_peers.sh (.gpuP), installed:
#   run 1 (carry .gpuA): bash .gpuA/install.sh a
#   run 2 (carry .gpuB .gpuP): bash .gpuB/install.sh b && bash .gpuP/install_peers.sh \
#        && MAKE_ONLY=1 CLASSES=dense,hybrid,sliding,moe bash bench/gpu/gpu_matrix.sh
# then one run per class (each fits 600 s: BUDGET_S=540 is shared fairly among the servers,
# at most SERVER_S=100 each; the servers' bounds are in each JSON):
#   CLASSES=dense bash bench/gpu/gpu_matrix.sh
# Knobs: CLASSES SERVERS LEVELS=1,16,64 PROMPT=128 OUTPUT=128 LONG=4500 PREFIX=2000
#   CLIENT_PROCS=8 MAX_SEQS=128 MLXD_ARGS (more `mlxd start` options) MODELS=/root/models
#   PEERS_ROOT=/root/peers MAKE_ONLY=1 (only the models) PYTHON=python3 (mlxd's, the servers')
#   TINY=1 (tiny widths: a CPU check, e.g. with LEVELS=1,4,8 PROMPT=32 OUTPUT=16 LONG=512
#   PREFIX=256 CLIENT_PROCS=2 MAX_SEQS=16)
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f /root/mlx-env.sh ] && source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
export OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"
  "$PY" -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())"
  echo "commit ${MLXD_COMMIT:-$(git log -1 --format=%h 2>/dev/null)}"; date -u
  echo "CLASSES=${CLASSES:-dense} SERVERS=${SERVERS:-all} LEVELS=${LEVELS:-1,16,64}"
} | tee "$OUT/machine.txt"
# shellcheck disable=SC2046  # MAKE_ONLY and TINY (a CPU check) add one option each
"$PY" bench/matrix.py --out "$OUT" --classes "${CLASSES:-dense}" --budget-s "${BUDGET_S:-540}" \
  $([ "${MAKE_ONLY:-0}" = 1 ] && echo --make-only) $([ "${TINY:-0}" = 1 ] && echo --tiny) \
  2>&1 | tee "$OUT/matrix.txt"
