#!/usr/bin/env bash
# Issue 21 point 2's figures on the GPU machine, for the real model (SmolLM2-135M-Instruct, the
# tests' GGUF, as float16): perplexity over a fixed 2k-token text (the project's docs) with
# float / 8-bit / 4-bit paged KV, decode tok/s at 64 streams in each mode (median of 3,
# alternating), and how many 8k-token contexts a 4 GiB KV budget holds in each
# (bench/kv_bits.py). Run after `bash .gpuB/install.sh b`. Usage:
#   GGUF=/root/smollm2.gguf bash bench/gpu/gpu_kv_bits.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source /root/mlx-env.sh
source bench/gpu/gpu_smollm2.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
git rev-parse --short HEAD >> "$OUT/gpu.txt" 2>/dev/null || true
python3 bench/kv_bits.py "$F16" --tokens 2048 --streams 64 --output 256 --reps 3 \
  --context 8192 --budget-gb 4 --json "$OUT/kv-bits-smol.json" 2>&1 | tee "$OUT/kv-bits-smol.txt"
