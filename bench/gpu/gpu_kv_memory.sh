#!/usr/bin/env bash
# Issue 21's memory figures on the GPU machine: a worker's RSS / MLX active / KV reserved at
# start, under 16 streams and 60 s after (bench/kv_memory.py), and the TTFT of a 4k-token
# shared prefix cold / from memory / from the disk tier (bench/prefix_ttft.py), for the
# built-in model and the real one (SmolLM2-135M-Instruct, the tests' GGUF, as float16).
# Run after `bash .gpuB/install.sh b`. Usage:
#   GGUF=/root/smollm2.gguf bash bench/gpu/gpu_kv_memory.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source /root/mlx-env.sh
source bench/gpu/gpu_smollm2.sh
export MLXD_HOME="${MLXD_HOME:-/root/home-kv}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
git rev-parse --short HEAD >> "$OUT/gpu.txt" 2>/dev/null || true
for spec in builtin "smol=$F16"; do
  tag="${spec%%=*}"; model=(); [ "$spec" = builtin ] || model=(--model "$spec")
  python3 bench/kv_memory.py "${model[@]}" --streams 16 --after 60 --json "$OUT/mem-$tag.json" \
    2>&1 | tee "$OUT/mem-$tag.txt"
  python3 bench/kv_memory.py "${model[@]}" --streams 0 --json "$OUT/mem-$tag-prealloc.json" \
    -- --kv-chunk-mb 1000000 2>&1 | tee "$OUT/mem-$tag-prealloc.txt"
  python3 bench/prefix_ttft.py "${model[@]}" --prefix-tokens 4096 --repeats 5 \
    --json "$OUT/ttft-$tag.json" 2>&1 | tee "$OUT/ttft-$tag.txt"
done
