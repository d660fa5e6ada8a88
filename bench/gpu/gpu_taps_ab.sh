#!/usr/bin/env bash
# A hybrid's short convolutions as served (TapsConv1d: shifted multiply-adds,
# runners/short_conv.py) against MLX's conv1d (for_serving without ``as_taps``), alternated on one
# GPU (run TA1): the first long prompt after a fresh start against the same length warm
# (bench/first_prompt.py), then in-process decode at 1 and 16 rows (`mlxd bench engine`). The
# conv1d tree is a copy of this one with that one call left out. Results in $OUT:
# first-VARIANT-ROUND.json, engine-VARIANT-ROUND.json, ab.txt (each run's lines in order).
#   MODEL=/root/models/matrix-hybrid bash bench/gpu/gpu_taps_ab.sh
#   knobs: ROUNDS=3 (first-prompt rounds) ENGINE_ROUNDS=2 LONG=4500 WARMUP_S=20
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f /root/mlx-env.sh ] && source /root/mlx-env.sh
PY="${PY:-python3}"; OUT="${OUT:-$PWD/out}"; LONG="${LONG:-4500}"
MODEL="${MODEL:?a model directory}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)  # absolute: each run starts in its tree
conv=$(mktemp -d)/tree
mkdir -p "$conv" && cp -r mlxd bench "$conv/"  # the code only, not staged wheels
sed -i 's/convs=short_conv.as_taps(model),/convs=[],/' "$conv/mlxd/worker/runners/served.py"
grep -q "convs=\[\]," "$conv/mlxd/worker/runners/served.py" ||
  { echo "conv1d tree not made" >&2; exit 1; }
tree() { [ "$1" = taps ] && echo "$PWD" || echo "$conv"; }
run() {  # VARIANT ARGS...: python in VARIANT's tree
  local dir; dir=$(tree "$1"); shift
  (cd "$dir" && PYTHONPATH=$dir:${PYTHONPATH:-} "$PY" "$@")
}
order() { [ $(($1 % 2)) = 1 ] && echo "taps conv" || echo "conv taps"; }  # ROUND: turned each round
for r in $(seq "${ROUNDS:-3}"); do
  for v in $(order "$r"); do
    run "$v" bench/first_prompt.py --model "$MODEL" --on-only --runs 1 --tokens "$LONG" \
      --warmup-s "${WARMUP_S:-20}" --json "$OUT/first-$v-$r.json" 2>&1 |
      sed "s/^/first $v $r: /" >> "$OUT/ab.txt"
  done
done
for r in $(seq "${ENGINE_ROUNDS:-2}"); do
  for v in $(order "$r"); do
    run "$v" -m mlxd bench engine --model "$MODEL" --no-compare-mlx-lm --speculate off \
      --concurrency 1,16 --prompt-tokens 128 --max-tokens 128 --json "$OUT/engine-$v-$r.json" 2>&1 |
      tail -4 | sed "s/^/engine $v $r: /" >> "$OUT/ab.txt"
  done
done
echo done >> "$OUT/ab.txt"
