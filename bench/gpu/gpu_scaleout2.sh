#!/usr/bin/env bash
# Scale-out on TWO GPUs of one host (issue #23; nvidia-h100-x2 / nvidia-h200-x2). For each model
# shape (random weights, made here): one worker on one GPU vs 2 replicas (one per GPU, placed by
# mlxd.gpus) at 64 and 128 streams, and a 2-rank tensor-parallel group over NCCL (one rank per
# GPU) at 1 and 64 streams, all through HTTP with `mlxd bench run`; greedy outputs of the group
# compared with one GPU's; then the multi-turn prefix hit rate of 1 vs 2 replicas (cache-aware,
# round robin; bench/bench_replicas.sh). Prints a summary; JSON under $OUT.
# Run after `bash .gpuB/install.sh b`. Usage:
#   [MULTI_TURN=1] [ONE_LEVELS=1,64,128] [TWO_LEVELS=64,128] [RUNS=1: measured runs a level] [LEGS="one two tp"; "greedy": only the greedy comparison; "kill": 2 replicas at
#   64 streams, replica 1's worker SIGKILLed 15 s in (failover scenario), then the time until it
#   is ready again] [SIZES="qwen3-0.6b llama-3.2-3b"; "qwen3-32b": its shape in 4 bits, made by
#   bench/make_shaped.py] [DTYPE=bfloat16] bash bench/gpu/gpu_scaleout2.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHON=python3
export OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (the device notes)
DTYPE="${DTYPE:-bfloat16}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
ls /proc/driver/nvidia/gpus | tee -a "$OUT/gpu.txt"
PORT=8126
# 40 GB: decode's read view (a fifth) then grows to 128 rows x 520 columns of a 112 KiB-a-token
# shape; at 16 GB it held 170 columns and 128 streams ran on the slower gathered path (run Z).
# --warmup-s 0: each level of `mlxd bench run` warms itself; a start's warm-up would only cost time.
COMMON="--kv-cache-gb ${KV_GB:-40} --max-num-seqs 128 --max-queued 1024 --log-level warning --warmup-s 0"
up() {  # NAME MODEL, then `mlxd start` options; leaves $daemon running
  local name="$1" model="$2"; shift 2
  # shellcheck disable=SC2086  # COMMON is a list of options
  MLXD_HOME="/root/home-$name" python3 -m mlxd start --model "bench=$model" --port "$PORT" \
    $COMMON "$@" > "$OUT/daemon-$name.log" 2>&1 &
  daemon=$!
  for _ in $(seq 600); do  # until healthy, or the daemon says its worker failed
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    grep -q " failed: " "$OUT/daemon-$name.log" && { echo "$name failed to start" | tee -a "$OUT/failures.txt"; break; }
    sleep 0.5
  done
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tr '\n' ' ' \
    | sed "s/^/$name GPU memory: /" | tee -a "$OUT/placement.txt"; echo | tee -a "$OUT/placement.txt"
}
down() { kill -TERM "$daemon"; wait "$daemon" || true; }
bench() {  # NAME LEVELS
  python3 -m mlxd bench run --url "http://127.0.0.1:$PORT" --model bench --concurrency "$2" \
    --prompt-tokens 128 --max-tokens 256 --runs "${RUNS:-1}" --label "$1" --json "$OUT/tp-$1.json" \
    > "$OUT/tp-$1.txt" 2>&1 \
    || echo "$1 failed" | tee -a "$OUT/failures.txt"
}
greedy() {  # NAME: 8 greedy completions with top-2 log-probabilities, to $OUT/greedy-NAME.json
  python3 bench/group_parity.py fetch "http://127.0.0.1:$PORT" "$OUT/greedy-$1.json" \
    || echo "$1 greedy failed" | tee -a "$OUT/failures.txt"
}
make() {  # SIZE MODEL: a real shape, random weights
  case $1 in
    qwen3-32b) python3 bench/make_shaped.py "$1" "$2" --dtype "$DTYPE" --quantize 4 > /dev/null ;;
    *) python3 -m mlxd make-model --arch "${1%%-*}" --size "$1" --dtype "$DTYPE" --out "$2" > /dev/null ;;
  esac
}
replicas() {  # NAME PYTHON-EXPRESSION over `rows` (the replicas of `mlxd ps --json`)
  MLXD_HOME="/root/home-$1" python3 -m mlxd ps --url "http://127.0.0.1:$PORT" --json \
    | python3 -c "import json, sys; rows = json.load(sys.stdin)['models'][0]['replicas']; $2"
}
kill_leg() {  # NAME: SIGKILL replica 1 under 64 streams; then how long until it serves again
  python3 -m mlxd bench run --url "http://127.0.0.1:$PORT" --model bench --scenario failover \
    --kill-pid "$(replicas "$1" "print(rows[1]['pid'])")" --kill-after 15 --duration 40 --concurrency 64 \
    --json "$OUT/kill-$1.json" > "$OUT/kill-$1.txt" 2>&1 || echo "$1 kill leg failed" | tee -a "$OUT/failures.txt"
  local t0=$SECONDS
  until replicas "$1" "sys.exit(0 if all(r['state'] == 'ready' for r in rows) else 1)"; do
    [ $((SECONDS - t0)) -gt 120 ] && { echo "$1: replica not back in 120 s" | tee -a "$OUT/failures.txt"; break; }
    sleep 0.5
  done
  echo "$1: both replicas ready $((SECONDS - t0)) s after the leg" | tee -a "$OUT/kill-$1.txt"
  bench "$1-after" 64
}
for SIZE in ${SIZES:-qwen3-0.6b llama-3.2-3b}; do
  MODEL="/root/models/$SIZE-$DTYPE"
  [ -d "$MODEL" ] || make "$SIZE" "$MODEL"
  for leg in ${LEGS:-one two tp}; do
    case $leg in
      one) up "$SIZE-one" "$MODEL"; greedy "$SIZE-one"; bench "$SIZE-one" "${ONE_LEVELS:-1,64,128}"; down ;;
      two) up "$SIZE-two" "$MODEL" --replicas 2; bench "$SIZE-two" "${TWO_LEVELS:-64,128}"; down ;;
      kill) up "$SIZE-kill" "$MODEL" --replicas 2; kill_leg "$SIZE-kill"; down ;;
      tp) up "$SIZE-tp" "$MODEL" --group-size 2 --distributed nccl; greedy "$SIZE-tp"
          bench "$SIZE-tp" 1,64; down ;;
      greedy) up "$SIZE-one" "$MODEL"; greedy "$SIZE-one"; down
          up "$SIZE-tp" "$MODEL" --group-size 2 --distributed nccl; greedy "$SIZE-tp"; down ;;
    esac
  done
done
MODEL="/root/models/qwen3-0.6b-$DTYPE"
if [ "${MULTI_TURN:-1}" = 1 ]; then
  START_ARGS="--kv-cache-gb 16 --max-num-seqs 64" timeout -k 5 300 bash bench/bench_replicas.sh \
    "$MODEL" 8 --turns 4 --prompt-tokens 512 --max-tokens 64 > "$OUT/replicas.txt" 2>&1 \
    || echo "replicas multi-turn failed" | tee -a "$OUT/failures.txt"
fi
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
for path in sorted(glob.glob(f"{out}/tp-*.txt")):
    print("==", os.path.basename(path)); print(open(path).read()[-1500:])
PY
for SIZE in ${SIZES:-qwen3-0.6b llama-3.2-3b}; do  # partings of the group, with their margins
  [ -f "$OUT/greedy-$SIZE-one.json" ] && [ -f "$OUT/greedy-$SIZE-tp.json" ] && echo "greedy $SIZE:" \
    && python3 bench/group_parity.py compare "$OUT/greedy-$SIZE-one.json" "$OUT/greedy-$SIZE-tp.json"
done
tail -n 12 "$OUT"/replicas-*.txt "$OUT"/kill-*.txt 2>/dev/null || true
cat "$OUT/placement.txt" "$OUT/failures.txt" 2>/dev/null || true
