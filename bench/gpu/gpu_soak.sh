#!/usr/bin/env bash
# The GPU soak (issue 41 point 5): one server per GPU in parallel, each under 32 streams of mixed
# prompt lengths with shared prefixes and client cancellations for DURATION s (bench/soak_peer.py),
# GPU memory (nvidia-smi, per GPU index) and the server processes' RSS sampled every 10 s; a JSON
# per server, a table (soak.md: growth after the first minute, %, failures) and soak.png in $OUT.
# Models (random weights at real shapes) are made first: the hybrid (Qwen3.5-0.8B bf16) and
# the MoE (Qwen3-30B-A3B 4-bit).
#
# Setup: ../shared/gpu/stage.sh (.gpuA/.gpuB) and bench/gpu/stage_peers.sh (.gpuP), installed:
#   bash .gpuA/install.sh a;  bash .gpuB/install.sh b && bash .gpuP/install_peers.sh
# Usage (SET: server:class pairs; a machine with N GPUs runs N at a time; default the four below):
#   [SET="mlxd:hybrid mlxd:moe vllm-mlx:hybrid mlx_lm.server:hybrid"] [DURATION=600] [STREAMS=32]
#   [MLXD_ARGS="--kv-cache-gb 30"] bash bench/gpu/gpu_soak.sh
# A 600 s soak outlives one 600 s command: DETACH=1 starts it in its own session (it survives the
# command) writing to $SOAK_DIR (/root/soak-out) and returns; a later command, COLLECT=1, waits up
# to WAIT_S (580) for it to finish and copies the results to $OUT.
# Without a GPU (a CPU check) the memory measure is the process tree's RSS and 2 run at a time:
#   PYTHON=... MODELS=/tmp/m PEERS_ROOT=/tmp/peers TINY=1 DURATION=60 bash bench/gpu/gpu_soak.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f /root/mlx-env.sh ] && source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export CUDA_DEVICE_ORDER=PCI_BUS_ID  # CUDA's GPU numbers are nvidia-smi's
PY="${PYTHON:-python3}"
OUT="${OUT:-$PWD/out}"; SOAK_DIR="${SOAK_DIR:-/root/soak-out}"
SET="${SET:-mlxd:hybrid mlxd:moe vllm-mlx:hybrid mlx_lm.server:hybrid}"
DURATION="${DURATION:-600}"; STREAMS="${STREAMS:-32}"
MODELS="${MODELS:-/root/models}"; PEERS_ROOT="${PEERS_ROOT:-/root/peers}"
if [ "${COLLECT:-0}" = 1 ]; then
  for _ in $(seq "${WAIT_S:-580}"); do [ -f "$SOAK_DIR/done" ] && break; sleep 1; done
  mkdir -p "$OUT"; cp -r "$SOAK_DIR"/. "$OUT"/; cat "$OUT/soak.md" 2>/dev/null || tail -5 "$OUT/soak.log"
  exit 0
fi
if [ "${DETACH:-0}" = 1 ]; then
  rm -rf "$SOAK_DIR"; mkdir -p "$SOAK_DIR"
  OUT="$SOAK_DIR" DETACH=0 setsid nohup bash "$0" > "$SOAK_DIR/soak.log" 2>&1 < /dev/null &
  echo "soak started in its own session: COLLECT=1 bash $0 (after about $((DURATION + 120)) s)"
  exit 0
fi
mkdir -p "$OUT"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU: RSS only"
  echo "commit ${MLXD_COMMIT:-$(git log -1 --format=%h 2>/dev/null || echo "unknown: set MLXD_COMMIT")}"; date -u
  echo "SET=$SET DURATION=$DURATION STREAMS=$STREAMS"
} | tee "$OUT/machine.txt"
classes=$(for pair in $SET; do echo "${pair#*:}"; done | sort -u | paste -sd,)
# shellcheck disable=SC2046  # TINY adds one option
"$PY" bench/matrix.py --out "$OUT" --make-only --classes "$classes" --models "$MODELS" \
  $([ "${TINY:-0}" = 1 ] && echo --tiny) > "$OUT/make.txt" 2>&1 || { cat "$OUT/make.txt"; exit 1; }
model() { echo "$MODELS/matrix-$1$([ "${TINY:-0}" = 1 ] && echo -tiny)"; }
soak() {  # SLOT SERVER CLASS: one server on GPU SLOT (none without GPUs)
  local slot=$1 server=$2 cls=$3 gpu=()
  [ "$NGPU" -gt 0 ] && gpu=(--gpu "$slot")
  CUDA_VISIBLE_DEVICES=$([ "$NGPU" -gt 0 ] && echo "$slot") "$PY" bench/soak_peer.py --out "$OUT" \
    --server "$server" --model "$(model "$cls")" --label "$server-$cls" --duration "$DURATION" \
    --streams "$STREAMS" --port $((8500 + slot)) --peers-root "$PEERS_ROOT" --python "$PY" \
    ${SOAK_ARGS:-} "${gpu[@]}" > "$OUT/soak-$server-$cls.txt" 2>&1
}
width=$([ "$NGPU" -gt 0 ] && echo "$NGPU" || echo 2)
slot=0
for pair in $SET; do
  soak "$slot" "${pair%%:*}" "${pair#*:}" &
  slot=$((slot + 1))
  if [ "$slot" -ge "$width" ]; then wait; slot=0; fi
done
wait
"$PY" bench/soak_peer.py --out "$OUT" --report
touch "$OUT/done"
