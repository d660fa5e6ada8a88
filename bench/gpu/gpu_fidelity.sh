#!/usr/bin/env bash
# Greedy fidelity on the GPU machine: bench/fidelity.py with the real model (SmolLM2-135M-
# Instruct, the tests' GGUF, dequantized and cast to float16) against mlxd and mlx_lm.server,
# and against an earlier mlxd checkout when BEFORE names one (before/after in one run).
# Run after `bash .gpuB/install.sh b`. Usage:
#   GGUF=/root/smollm2.gguf [BEFORE=/path/to/checkout] bash bench/gpu/gpu_fidelity.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source /root/mlx-env.sh
source bench/gpu/gpu_smollm2.sh
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
python3 -c "import mlx.core as mx, mlx_lm; print('mlx', mx.__version__, 'mlx-lm', mlx_lm.__version__)" >> "$OUT/gpu.txt"
git rev-parse --short HEAD >> "$OUT/gpu.txt" 2>/dev/null || true

serve_mlxd() {  # NAME CHECKOUT PORT
  (cd "$2" && PYTHONPATH="$2:$PYTHONPATH" MLXD_HOME="/root/home-$1" python3 -m mlxd start \
    --model "smol=$F16" --port "$3" --log-level warning > "$OUT/$1.log" 2>&1 &)
}
trap 'pkill -f -- "--port 812[345]" || true' EXIT  # the servers below stop with the script
servers=(--server "mlxd=http://127.0.0.1:8123#smol" --server "mlx_lm=http://127.0.0.1:8124#$F16")
serve_mlxd mlxd "$PWD" 8123
python3 -m mlx_lm server --model "$F16" --port 8124 > "$OUT/mlx_lm.log" 2>&1 &
if [ -n "${BEFORE:-}" ]; then
  serve_mlxd before "$BEFORE" 8125
  servers+=(--server "mlxd_before=http://127.0.0.1:8125#smol")
fi
for port in 8123 8124 ${BEFORE:+8125}; do
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break; sleep 0.5; done
done
python3 bench/fidelity.py --model "$F16" "${servers[@]}" --max-tokens "${MAX_TOKENS:-64}" \
  --json "$OUT/fidelity.json" 2>&1 | tail -60
