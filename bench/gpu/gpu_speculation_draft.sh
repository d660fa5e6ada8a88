#!/usr/bin/env bash
# Speculation with a draft model on the GPU machine (issue #20): a Qwen3-0.6B-shaped target
# (random weights, float16, seed 0) served with --speculate off and with --speculate draft and
# each draft: "q4" (the target's weights quantized to 4 bits: same vocabulary, close logits, so
# drafts are often right) and "small" (a 4-layer, 256-wide Qwen3 with the same 151,936-token
# vocabulary and other random weights: drafts almost never right, so it measures what drafting
# costs). `mlxd bench run` over HTTP on edit / json / chat at 1, 16 and 64 streams, the servers
# alternated; prints tok/s, the ratio to off, acceptance and tokens per forward. `auto` is off
# on CUDA (docs/decisions/0004): `draft` is explicit. Run after `bash .gpuB/install.sh b`:
#   [LEVELS=1,16,64] [MAX_TOKENS=256] [REPEATS=2] [DRAFTS="q4 small"] bash bench/gpu/gpu_speculation_draft.sh
# Every daemon gets an 8 GB KV pool and a 20 GB budget (which caps MLX's buffer cache): daemons
# sharing one GPU otherwise each size themselves to it, and one's cache ran the other out of
# memory (stop 31: max_num_seqs halved to 8, 0.13x at 64 streams).
set -euo pipefail
cd "$(dirname "$0")/../.."
source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
M=/root/models; mkdir -p "$M"
[ -d "$M/qwen06" ] || python3 -m mlxd make-model --size qwen3-0.6b --dtype float16 --out "$M/qwen06"
[ -d "$M/qwen06-q4" ] || python3 -m mlxd make-model --size qwen3-0.6b --dtype float16 --quantize 4 \
  --out "$M/qwen06-q4"
[ -d "$M/qwen-small" ] || python3 -c "from pathlib import Path; from mlxd.models import maker, presets
c = {**presets.model_config('qwen3', 'qwen3-0.6b'), 'hidden_size': 256, 'num_hidden_layers': 4,
     'num_attention_heads': 4, 'num_key_value_heads': 2, 'head_dim': 64, 'intermediate_size': 768}
maker.write_model(Path('$M/qwen-small'), c, dtype='float16', seed=1)"
declare -A DRAFT=([q4]="$M/qwen06-q4" [small]="$M/qwen-small")
MODES="off ${DRAFTS:-q4 small}"
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
git rev-parse --short HEAD >> "$OUT/gpu.txt" 2>/dev/null || true
pids=(); port=8130
declare -A PORT
for mode in $MODES; do
  PORT[$mode]=$port
  extra=(--speculate off)
  [ "$mode" = off ] || extra=(--speculate draft --draft-model "${DRAFT[$mode]}")
  MLXD_HOME="/root/home-draft-$mode" python3 -m mlxd start --model "qwen=$M/qwen06" --port "$port" \
    "${extra[@]}" --max-num-seqs 64 --kv-cache-gb 8 --max-memory 20GB --log-level warning > "$OUT/draft-$mode.log" 2>&1 &
  pids+=($!); port=$((port + 1))
done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for mode in $MODES; do
  for _ in $(seq 480); do curl -sf "http://127.0.0.1:${PORT[$mode]}/v1/models" >/dev/null && break; sleep 0.5; done
done
for rep in $(seq "${REPEATS:-2}"); do
  for scenario in edit json chat; do
    for mode in $MODES; do
      MLXD_HOME="/root/home-draft-$mode" python3 -m mlxd bench run --url "http://127.0.0.1:${PORT[$mode]}" \
        --model qwen --scenario "$scenario" --endpoint chat --concurrency "${LEVELS:-1,16,64}" \
        --max-tokens "${MAX_TOKENS:-256}" --json "$OUT/draft-$scenario-$mode-$rep.json" > /dev/null
    done
  done
done
python3 - "$OUT" $MODES <<'EOF'
import collections, glob, json, sys
out, modes = sys.argv[1], sys.argv[2:]
tps, extra = collections.defaultdict(list), {}
for path in glob.glob(f"{out}/draft-*-*-*.json"):
    scenario, mode, _ = path.rsplit("/", 1)[1][6:-5].rsplit("-", 2)
    for row in json.load(open(path))["rows"]:
        tps[(scenario, row["concurrency"], mode)].append(row["output_tok_s"])
        extra[(scenario, row["concurrency"], mode)] = (row.get("spec_acceptance") or 0,
                                                       row.get("tokens_per_forward") or 0)
mean = lambda xs: sum(xs) / len(xs)
print(f"{'scenario':8} {'conc':>4} {'draft':>6} {'off tok/s':>10} {'tok/s':>8} {'ratio':>6} {'accept':>7} {'tok/fwd':>7}")
for scenario, conc in sorted({(s, c) for s, c, _ in tps}):
    off = mean(tps[(scenario, conc, "off")])
    for mode in modes[1:]:
        on = mean(tps[(scenario, conc, mode)])
        acc, tpf = extra[(scenario, conc, mode)]
        print(f"{scenario:8} {conc:>4} {mode:>6} {off:>10.1f} {on:>8.1f} {on / off:>6.2f} {acc:>7.2f} {tpf:>7.2f}")
EOF
# What drafting costs per step by batch size (one batched draft forward per draft position).
for d in $MODES; do
  [ "$d" = off ] || python3 bench/draft_cost.py "${DRAFT[$d]}" --rows 1,16,64 --k 4 --prompt 512 \
    --steps 10 2>&1 | grep "^rows" | sed "s/^/$d /" | tee -a "$OUT/draft-cost.txt"
done
