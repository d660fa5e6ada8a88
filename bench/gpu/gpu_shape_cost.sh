#!/usr/bin/env bash
# What a prompt length never seen before costs on the GPU (bench/shape_cost.py), with MLX's CUDA
# graphs on and off, on the matrix's vision, hybrid and dense shapes; then the vision probe's
# served one-stream leg with graphs off (gpu_vision_probe.sh, STAGES=0 PEER=0). $OUT:
# shape_cost.jsonl, probe-graphs-off/. Setup as gpu_matrix.sh's. Knobs: CLASSES (vision,hybrid,
# dense), TOKENS (352 4500).
set -uo pipefail
source "$(dirname "$0")/vision_env.sh"
classes="${CLASSES:-vision,hybrid,dense}"
python3 bench/matrix.py --out "$OUT/made" --classes "$classes" --make-only > "$OUT/make.txt" 2>&1
for c in ${classes//,/ }; do
  for t in ${TOKENS:-352 4500}; do
    for graphs in 1 0; do
      MLX_USE_CUDA_GRAPHS=$graphs timeout 120 python3 bench/shape_cost.py \
        "${MODELS:-/root/models}/matrix-$c" --tokens "$t" --out "$OUT/shape_cost.jsonl" 2>&1 | tail -n 1
    done
  done
done
[ "${PROBE:-1}" = 1 ] && MLX_USE_CUDA_GRAPHS=0 OUT="$OUT/probe-graphs-off" STAGES=0 PEER=0 SPY_S=12 \
  bash bench/gpu/gpu_vision_probe.sh > "$OUT/probe.txt" 2>&1
tail -n 2 "$OUT"/probe-graphs-off/bench-c*.txt 2>/dev/null
