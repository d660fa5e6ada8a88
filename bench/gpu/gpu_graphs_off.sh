#!/usr/bin/env bash
# A served model with MLX's CUDA graphs on and off, alternated (issue 41 point 4; run FP2 gave
# the hybrid's first 4,500-token prompt 857-891 ms with graphs off against 1,363-1,504 on, and
# its warm one 397-484 against 515-606): each leg starts `mlxd start` on MODEL with the leg's
# environment, times a first LONG-token prompt after ready and a second of the same length (no
# prefix hit), then `mlxd bench run` at LEVELS (PROMPT-token prompts, OUTPUT tokens), and stops.
# One line a leg in $OUT/graphs.txt, each level's JSON beside it. The "on" leg names graphs on
# outright: a hybrid's worker starts without them otherwise (daemon.worker_command.model_env).
#   MODEL=/root/models/matrix-hybrid ROUNDS=2 bash bench/gpu/gpu_graphs_off.sh
#   knobs: LONG=4500 LEVELS="1 16" PROMPT=128 OUTPUT=128 PORT=8700 MLXD_ARGS READY_S=300
# MODEL must be made first: a hybrid's maker imports mlx-vlm, which only .gpuP's peers bring
# (`gpu_matrix.sh`'s make:hybrid after `install_peers.sh`); a lease without them lost its last
# five minutes to a daemon that never served a missing model (run FP3).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f /root/mlx-env.sh ] && source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}" OUT="${OUT:-$PWD/out}" PORT="${PORT:-8700}"; mkdir -p "$OUT"
[ -f "${MODEL:?}/config.json" ] || { echo "no model at $MODEL: make it first (above)" >&2; exit 1; }
ttft() {  # URL SEED: one LONG-token prompt's time to its first token, ms (first_prompt.py's)
  "$PY" -c "import random, sys; sys.path.insert(0, 'bench'); from first_prompt import _ttft
try: print(round(_ttft(sys.argv[1], 'bench', int(sys.argv[3]), random.Random(int(sys.argv[2]))) * 1e3))
except AssertionError as e: print('error', str(e)[:80])" "$1" "$2" "${LONG:-4500}"
}
leg() {  # NAME ROUND ENV: one start of the daemon, its two long prompts and its levels
  local url="http://127.0.0.1:$PORT" first warm line
  # shellcheck disable=SC2086  # the leg's environment and MLXD_ARGS, words
  env $3 "$PY" -m mlxd start --model "bench=$MODEL" --port "$PORT" --log-level warning \
    --max-num-seqs 128 ${MLXD_ARGS:-} >> "$OUT/mlxd.log" 2>&1 &
  local server=$!
  for _ in $(seq $(( ${READY_S:-300} * 2 ))); do curl -sf "$url/health" > /dev/null && break; sleep 0.5; done
  curl -sf "$url/health" > /dev/null || { echo "$1 round $2: not ready in ${READY_S:-300} s" | tee -a "$OUT/graphs.txt"
    kill "$server"; exit 1; }
  first=$(ttft "$url" "$2"); warm=$(ttft "$url" $(( $2 + 100 )))
  line="$1 round $2: first $first ms, warm $warm ms"
  for c in ${LEVELS:-1 16}; do
    "$PY" -m mlxd bench run --url "$url" --model bench --prompt-tokens "${PROMPT:-128}" \
      --max-tokens "${OUTPUT:-128}" --concurrency "$c" --json "$OUT/$1-$2-c$c.json" > "$OUT/$1-$2-c$c.log" 2>&1
    line="$line, c$c $("$PY" -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(f\"{r['output_tok_s']:.1f} tok/s (itl p50 {r['itl_p50_ms']:.2f} ms, failed {r['failed']})\")" "$OUT/$1-$2-c$c.json" 2>/dev/null)"
  done
  echo "$line" | tee -a "$OUT/graphs.txt"
  kill "$server"; wait "$server" 2> /dev/null; PORT=$(( PORT + 1 ))
}
for r in $(seq "${ROUNDS:-2}"); do
  if [ $(( r % 2 )) = 1 ]; then leg on "$r" MLX_USE_CUDA_GRAPHS=1; leg off "$r" MLX_USE_CUDA_GRAPHS=0
  else leg off "$r" MLX_USE_CUDA_GRAPHS=0; leg on "$r" MLX_USE_CUDA_GRAPHS=1; fi
done
