#!/usr/bin/env bash
# Issue 21's memory figures on the GPU machine: a worker's RSS / MLX active / KV reserved at
# start, under 16 streams and 60 s after (scripts/kv_memory.py), and the TTFT of a 4k-token
# shared prefix cold / from memory / from the disk tier (scripts/prefix_ttft.py), for the
# built-in model and the real one (SmolLM2-135M-Instruct, the tests' GGUF, as float16).
# Run after `bash .gpuB/install.sh b`. Usage:
#   GGUF=/root/smollm2.gguf bash scripts/gpu_kv_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export MLXD_HOME="${MLXD_HOME:-/root/home-kv}"
F32=$(python3 -c "from pathlib import Path; from mlxd.models import gguf
print(gguf.ensure_converted(Path('${GGUF:-/root/smollm2.gguf}'), Path('/root/gguf'), dequantize=True))")
F16=/root/models/smollm2-f16
[ -d "$F16" ] || python3 -c "import sys; sys.path.insert(0, 'scripts'); import fidelity
from pathlib import Path; fidelity.to_float16(Path('$F32'), Path('$F16'))"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
git rev-parse --short HEAD >> "$OUT/gpu.txt" 2>/dev/null || true
for spec in builtin "smol=$F16"; do
  tag="${spec%%=*}"; model=(); [ "$spec" = builtin ] || model=(--model "$spec")
  python3 scripts/kv_memory.py "${model[@]}" --streams 16 --after 60 --json "$OUT/mem-$tag.json" \
    2>&1 | tee "$OUT/mem-$tag.txt"
  python3 scripts/kv_memory.py "${model[@]}" --streams 0 --json "$OUT/mem-$tag-prealloc.json" \
    -- --kv-chunk-mb 1000000 2>&1 | tee "$OUT/mem-$tag-prealloc.txt"
  python3 scripts/prefix_ttft.py "${model[@]}" --prefix-tokens 4096 --repeats 5 \
    --json "$OUT/ttft-$tag.json" 2>&1 | tee "$OUT/ttft-$tag.txt"
done
