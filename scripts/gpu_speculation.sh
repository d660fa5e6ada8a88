#!/usr/bin/env bash
# Speculative decoding on the GPU machine (issue #20): the real model (SmolLM2-135M-Instruct, the
# tests' GGUF, dequantized and cast to float16) served twice, --speculate ngram and --speculate
# off, and `mlxd bench run` over HTTP on the edit / json / chat scenarios at 1, 16 and 64
# streams, the two servers alternated (off, ngram, off, ngram). Prints tok/s and the ratio
# ngram / off per scenario and level, with the worker's acceptance and tokens per forward.
# Run after `bash .gpuB/install.sh b`. Usage:
#   GGUF=/root/smollm2.gguf [LEVELS=1,16,64] [MAX_TOKENS=256] [REPEATS=2] [SCENARIOS="edit json chat"] \
#     bash scripts/gpu_speculation.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source /root/mlx-env.sh
source scripts/gpu_smollm2.sh
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
git rev-parse --short HEAD >> "$OUT/gpu.txt" 2>/dev/null || true
pids=()
for mode in ngram off; do
  port=$([ $mode = ngram ] && echo 8123 || echo 8124)
  MLXD_HOME="/root/home-spec-$mode" python3 -m mlxd start --model "smol=$F16" --port "$port" \
    --speculate "$mode" --max-num-seqs 64 --log-level warning > "$OUT/spec-$mode.log" 2>&1 &
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
      MLXD_HOME="/root/home-spec-$mode" python3 -m mlxd bench run --url "http://127.0.0.1:$port" \
        --model smol --scenario "$scenario" --endpoint chat --concurrency "${LEVELS:-1,16,64}" \
        --max-tokens "${MAX_TOKENS:-256}" --json "$OUT/spec-$scenario-$mode-$rep.json" > /dev/null
    done
  done
done
python3 - "$OUT" <<'EOF'
import json, sys, glob, collections
out = sys.argv[1]
tps = collections.defaultdict(list)
extra = {}
for path in glob.glob(f"{out}/spec-*-*-*.json"):
    scenario, mode, _ = path.rsplit("/", 1)[1][5:-5].rsplit("-", 2)
    for row in json.load(open(path))["rows"]:
        tps[(scenario, row["concurrency"], mode)].append(row["output_tok_s"])
        if mode == "ngram":
            extra[(scenario, row["concurrency"])] = (row.get("spec_acceptance"), row.get("tokens_per_forward"))
print(f"{'scenario':8} {'conc':>4} {'off tok/s':>10} {'ngram tok/s':>12} {'ratio':>6} {'accept':>7} {'tok/fwd':>7}")
for (scenario, conc) in sorted(extra):
    off = sum(tps[(scenario, conc, "off")]) / len(tps[(scenario, conc, "off")])
    on = sum(tps[(scenario, conc, "ngram")]) / len(tps[(scenario, conc, "ngram")])
    acc, tpf = extra[(scenario, conc)]
    print(f"{scenario:8} {conc:>4} {off:>10.1f} {on:>12.1f} {on / off:>6.2f} {acc or 0:>7.2f} {tpf or 0:>7.2f}")
EOF
