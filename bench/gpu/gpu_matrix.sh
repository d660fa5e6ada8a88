#!/usr/bin/env bash
# The class matrix on one GPU (issue 41 point 1): per class (random weights at real shapes:
# dense Qwen3-0.6B, hybrid Qwen3.5-0.8B, sliding Gemma-3-1B in bf16, MoE Qwen3-30B-A3B in 4 bits)
# mlxd, vllm-mlx (continuous batching, prefix cache), Rapid-MLX, mlx-vlm's server and
# mlx_lm.server in turn (bench/matrix.py): time to healthy, the first ~4.5k-token prompt after
# the start and one warm (TTFT), 1/16/64 streams of 128 in / 128 out from 8 client processes
# (failures counted), a 2000-token shared prefix cold and hit. A server that fails to start or
# dies is recorded as such. $OUT: matrix-CLASS-SERVER.json, matrix.md (the table for
# docs/PERFORMANCE.md), server and bench logs.
#
# Setup: ../shared/gpu/stage.sh (.gpuA/.gpuB) and bench/gpu/stage_peers.sh (.gpuP), installed:
#   run 1 (carry .gpuA): bash .gpuA/install.sh a
#   run 2 (carry .gpuB .gpuP): bash .gpuB/install.sh b && bash .gpuP/install_peers.sh \
#        && MAKE_ONLY=1 CLASSES=dense,hybrid,sliding,moe bash bench/gpu/gpu_matrix.sh
# then one run per class (each fits 600 s: BUDGET_S=540 is shared fairly among the servers,
# at most SERVER_S=100 each; the servers' bounds are in each JSON):
#   CLASSES=dense bash bench/gpu/gpu_matrix.sh
# Several GPUs: LANES="0:vision,dense,sliding 1:rows,hybrid,moe" runs each lane's items in turn on
# its GPU (CUDA_VISIBLE_DEVICES), the lanes side by side, each with its own ports and
# $OUT/laneN/ (a class: matrix.py; "rows": gpu_rows.sh's step time by rows, ROWS=16,24,32,48,64,
# on the Qwen3-0.6B shape; "prof": bench/step_profile.py at PROF_ROWS="16 64" on the dense class's
# model, made by another lane); each lane makes its models first. Then $OUT/all/matrix.md joins them.
# A run longer than one command: DETACH=1 starts it in its own session writing to $RUN_DIR
# (/root/matrix-out) and returns; a later command, COLLECT=1, waits up to WAIT_S (580) for it,
# joins the table from whatever has finished, and copies matrix.md and a tarball of the run to
# $OUT (run it again if it was not done).
# Knobs: CLASSES SERVERS LEVELS=1,16,64 PROMPT=128 OUTPUT=128 LONG=4500 PREFIX=2000
#   CLIENT_PROCS=8 MAX_SEQS=128 MLXD_ARGS (more `mlxd start` options) MODELS=/root/models
#   PEERS_ROOT=/root/peers MAKE_ONLY=1 (only the models) PYTHON=python3 (mlxd's, the servers')
#   TINY=1 (tiny widths: a CPU check, e.g. with LEVELS=1,4,8 PROMPT=32 OUTPUT=16 LONG=512
#   PREFIX=256 CLIENT_PROCS=2 MAX_SEQS=16)
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f /root/mlx-env.sh ] && source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
export OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
RUN_DIR="${RUN_DIR:-/root/matrix-out}"
join_tables() {  # DIR: every lane's JSON in DIR/all, and the table of them
  mkdir -p "$1/all"; cp "$1"/lane*/matrix-*.json "$1/all/" 2>/dev/null
  "$PY" bench/matrix.py --out "$1/all" --table-only > /dev/null 2>&1
}
if [ "${COLLECT:-0}" = 1 ]; then
  for _ in $(seq "${WAIT_S:-580}"); do [ -f "$RUN_DIR/done" ] && break; sleep 1; done
  join_tables "$RUN_DIR"; mkdir -p "$OUT"
  [ -f "$RUN_DIR/done" ] || echo "not done yet: what has finished so far"
  tar czf "$OUT/matrix-run.tgz" -C "$RUN_DIR" . && cp "$RUN_DIR/all/matrix.md" "$OUT/" 2>/dev/null
  cat "$RUN_DIR/all/matrix.md" 2>/dev/null; tail -3 "$RUN_DIR"/lane*.txt 2>/dev/null
  exit 0
fi
if [ "${DETACH:-0}" = 1 ]; then
  rm -rf "$RUN_DIR"; mkdir -p "$RUN_DIR"
  OUT="$RUN_DIR" DETACH=0 setsid nohup bash "$0" > "$RUN_DIR/run.log" 2>&1 < /dev/null &
  echo "started in its own session: COLLECT=1 bash $0"
  exit 0
fi
lane() {  # GPU ITEMS: a lane's models made, then its items in turn on GPU
  local gpu=$1 items=${2//,/ } classes
  classes=$(echo "$items" | tr ' ' '\n' | grep -v '^rows$' | paste -sd,)
  [ -n "$classes" ] && CUDA_VISIBLE_DEVICES=$gpu "$PY" bench/matrix.py --out "$OUT/lane$gpu" \
    --classes "$classes" --make-only $([ "${TINY:-0}" = 1 ] && echo --tiny) > "$OUT/lane$gpu-make.txt" 2>&1
  for item in $items; do
    if [ "$item" = prof ]; then  # step_profile.py on the dense shape (another lane makes it)
      for r in ${PROF_ROWS:-16 64}; do
        CUDA_VISIBLE_DEVICES=$gpu "$PY" bench/step_profile.py "${MODELS:-/root/models}/matrix-dense" \
          --rows "$r" >> "$OUT/lane$gpu-prof.txt" 2>&1
      done
      continue
    fi
    if [ "$item" = rows ]; then
      CUDA_VISIBLE_DEVICES=$gpu OUT="$OUT/lane$gpu" SIZES=qwen3-0.6b LEVELS="${ROWS:-16,24,32,48,64}" \
        LONG=0 bash bench/gpu/gpu_rows.sh > "$OUT/lane$gpu-rows.txt" 2>&1
      continue
    fi
    CUDA_VISIBLE_DEVICES=$gpu "$PY" bench/matrix.py --out "$OUT/lane$gpu" --classes "$item" \
      --port $((8400 + 100 * gpu)) --budget-s "${BUDGET_S:-540}" $([ "${TINY:-0}" = 1 ] && echo --tiny) \
      >> "$OUT/lane$gpu.txt" 2>&1
  done
}
if [ -n "${LANES:-}" ]; then
  mkdir -p "$OUT"; date -u > "$OUT/started"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > "$OUT/machine.txt" 2>&1
  echo "commit ${MLXD_COMMIT:-$(git log -1 --format=%h 2>/dev/null)} LANES=$LANES" >> "$OUT/machine.txt"
  for spec in $LANES; do lane "${spec%%:*}" "${spec#*:}" & done
  wait; join_tables "$OUT"; date -u > "$OUT/done"; exit 0
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"
  "$PY" -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())"
  echo "commit ${MLXD_COMMIT:-$(git log -1 --format=%h 2>/dev/null)}"; date -u
  echo "CLASSES=${CLASSES:-dense} SERVERS=${SERVERS:-all} LEVELS=${LEVELS:-1,16,64}"
} | tee "$OUT/machine.txt"
# shellcheck disable=SC2046  # MAKE_ONLY and TINY (a CPU check) add one option each
"$PY" bench/matrix.py --out "$OUT" --classes "${CLASSES:-dense}" --budget-s "${BUDGET_S:-540}" \
  $([ "${MAKE_ONLY:-0}" = 1 ] && echo --make-only) $([ "${TINY:-0}" = 1 ] && echo --tiny) \
  2>&1 | tee "$OUT/matrix.txt"
