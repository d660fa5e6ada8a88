#!/usr/bin/env bash
# Speculative decoding on the GPU machine (issue #20): the real model (SmolLM2-135M-Instruct, the
# tests' GGUF, dequantized and cast to float16) served twice, --speculate ngram and --speculate
# off, and `mlxd bench run` over HTTP on the edit / json / chat scenarios at 1, 16 and 64
# streams, the two servers alternated (off, ngram, off, ngram). Prints tok/s and the ratio
# ngram / off per scenario and level, with the worker's acceptance and tokens per forward.
# Run after `bash .gpuB/install.sh b`. Usage:
#   GGUF=/root/smollm2.gguf [LEVELS=1,16,64] [MAX_TOKENS=256] [REPEATS=2] [SCENARIOS="edit json chat"] \
#     [STEADY=4] bash bench/gpu/gpu_speculation.sh
# STEADY=n: each level sends n times as many requests as it has streams (a stream sends its next
# request when one ends), so the figure is the steady state rather than one wave whose rows all
# start together and end apart (with speculation they end further apart: a closed wave then
# measures its ragged tail, stop 32).
# Every daemon gets an 8 GB KV pool and a 20 GB budget (which caps MLX's buffer cache): daemons
# sharing one GPU otherwise each size themselves to it, and one's cache ran the other out of
# memory (stop 31: max_num_seqs halved to 8, 0.13x at 64 streams).
set -euo pipefail
cd "$(dirname "$0")/../.."
source /root/mlx-env.sh
source bench/gpu/gpu_smollm2.sh
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
git rev-parse --short HEAD >> "$OUT/gpu.txt" 2>/dev/null || true
pids=()
for mode in ngram off; do
  port=$([ $mode = ngram ] && echo 8123 || echo 8124)
  MLXD_HOME="/root/home-spec-$mode" python3 -m mlxd start --model "smol=$F16" --port "$port" \
    --speculate "$mode" --max-num-seqs 64 --kv-cache-gb 8 --max-memory 20GB --log-level warning > "$OUT/spec-$mode.log" 2>&1 &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for port in 8123 8124; do
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break; sleep 0.5; done
done
for rep in $(seq "${REPEATS:-2}"); do
  for scenario in ${SCENARIOS:-edit json chat}; do
    for mode in off ngram; do
      port=$([ $mode = ngram ] && echo 8123 || echo 8124)
      for level in $([ -n "${STEADY:-}" ] && echo "${LEVELS:-1,16,64}" | tr , " " || echo all); do
        args=(--concurrency "${LEVELS:-1,16,64}")
        [ "$level" = all ] || args=(--concurrency "$level" --requests-per-level $((level * STEADY)))
        MLXD_HOME="/root/home-spec-$mode" python3 -m mlxd bench run --url "http://127.0.0.1:$port" \
          --model smol --scenario "$scenario" --endpoint chat "${args[@]}" \
          --max-tokens "${MAX_TOKENS:-256}" --json "$OUT/spec-$scenario-$mode-${rep}x$level.json" \
          > /dev/null
      done
    done
  done
done
python3 bench/spec_table.py "$OUT"
