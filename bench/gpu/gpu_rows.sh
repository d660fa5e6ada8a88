#!/usr/bin/env bash
# Step time by batch rows on the GPU (the plateau seen on two H100s, docs/PERFORMANCE.md issue 23
# section: one worker served Llama-3.2-3B at 3,317 tok/s at both 64 and 128 streams, ITL 16 ->
# 35 ms, where weights and KV reads bound a step near 2-5 ms). In-process engine, speculation
# off, so HTTP and the gateway are out of it; then a long prompt beside streams on a real shape
# (worker/sched/prefill_cost.py). Prints tables; JSON under $OUT.
# Run after `bash .gpuB/install.sh b`. Usage:
#   [SIZES="qwen3-0.6b llama-3.2-3b"] [LEVELS=1,32,64,128] [LONG=1] [KV_GB=16] bash bench/gpu/gpu_rows.sh
# KV_GB sizes pool and view as a daemon with --kv-cache-gb (16: run Z's; the 128 rows then
# outgrow the view, "gathered steps" counts it).
set -euo pipefail
cd "$(dirname "$0")/../.."
source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
export OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
for SIZE in ${SIZES:-qwen3-0.6b llama-3.2-3b}; do
  MODEL="/root/models/$SIZE-bfloat16"
  [ -d "$MODEL" ] || python3 -m mlxd make-model --arch "${SIZE%%-*}" --size "$SIZE" \
    --dtype bfloat16 --out "$MODEL" > /dev/null
  python3 -m mlxd bench engine --model "$MODEL" --no-compare-mlx-lm --speculate off \
    ${KV_GB:+--kv-cache-gb "$KV_GB"} \
    --concurrency "${LEVELS:-1,32,64,128}" --prompt-tokens 128 --max-tokens 256 \
    --json "$OUT/rows-$SIZE.json" 2>&1 | grep -v "warm-up\|run 1/1" | sed "s/^/$SIZE /"
  python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print(sys.argv[2], 'conc', r.get('concurrency'), 'step p50 ms', r.get('step_p50_ms'),
          'rows', r.get('step_rows_mean'), 'tok/s', r.get('output_tok_s'),
          'gathered steps', r.get('gathered_steps'))
" "$OUT/rows-$SIZE.json" "$SIZE"
done
if [ "${LONG:-1}" = 1 ]; then
  timeout -k 5 240 python3 bench/long_prompt_itl.py --size qwen3-0.6b --prompt-tokens 32000 \
    --streams 8 --baseline-s 5 --prefill-chunk 2048 --json "$OUT/long.json" 2>&1 | tail -3
fi
