#!/usr/bin/env bash
# Issue 41's holes in-process on one GPU: where a decode step's time goes for the hybrid at one
# stream (Qwen3.5-0.8B shape, bf16) and the MoE at 16 streams (Qwen3-30B-A3B shape, 4-bit),
# mlxd's engine against mlx-lm's own generate_step / BatchGenerator (bench/step_profile.py:
# tok/s unprofiled, then both under cProfile). Random weights at real dimensions, made here by
# bench/make_shaped.py. Run after `bash .gpuB/install.sh b`. Usage:
#   [LEGS="hybrid1 moe16 moe1"] [MAX_TOKENS=256] bash bench/gpu/gpu_classes.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$OUT/gpu-classes.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/gpu-classes.txt" || true
model() {  # NAME [make_shaped options]: the model's directory, made once
  local dir="/root/models/shaped-$1"
  [ -d "$dir" ] || python3 bench/make_shaped.py "$1" "$dir" "${@:2}" > /dev/null
  echo "$dir"
}
profile() {  # LABEL MODEL ROWS
  timeout -k 5 280 python3 bench/step_profile.py "$2" --rows "$3" \
    --max-tokens "${MAX_TOKENS:-256}" > "$OUT/profile-$1.txt" 2>&1 \
    || echo "$1 failed ($?)" | tee -a "$OUT/failures.txt"
  grep "^== " "$OUT/profile-$1.txt" | cut -c1-400
}
for leg in ${LEGS:-hybrid1 moe16 moe1}; do
  case $leg in
    hybrid1) profile hybrid1 "$(model qwen3_5-0.8b)" 1 ;;
    moe16) profile moe16 "$(model qwen3_moe-30b-a3b --quantize 4)" 16 ;;
    moe1) profile moe1 "$(model qwen3_moe-30b-a3b --quantize 4)" 1 ;;
  esac
done
cat "$OUT/failures.txt" 2>/dev/null || true
