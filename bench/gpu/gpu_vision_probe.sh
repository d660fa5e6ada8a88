#!/usr/bin/env bash
# Where an image request's time goes on the GPU (issue 39): the Qwen3.5-0.8B VLM shape's stages
# in-process (bench/vision_stages.py), then mlxd serving it with py-spy sampling the worker
# through 1 and 16 image streams, then mlx-vlm's server on the same load (bench/matrix.py).
# $OUT: stages.json, bench-c1.txt, bench-c16.txt, pyspy-c*.txt (raw stacks), metrics.txt,
# mlxd.log, matrix-vision-*.json.
# Setup as gpu_matrix.sh's (.gpuA, .gpuB, .gpuP installed; py-spy's wheel in .gpuP: pip install
# --target /root/pyspy). Knobs: MLXD_ARGS, LEVELS (of the peer: 1,16), SERVER_S (120), STAGES=0 (no in-process
# stages), PEER=0 (no mlx-vlm leg).
set -uo pipefail
source "$(dirname "$0")/vision_env.sh"
SPY="${SPY:-/root/pyspy/bin/py-spy}"
M="${MODELS:-/root/models}/matrix-vision"
python3 bench/matrix.py --out "$OUT" --classes vision --make-only > "$OUT/make.txt" 2>&1
[ "${STAGES:-1}" = 1 ] && timeout 240 python3 bench/vision_stages.py "$M" --out "$OUT/stages.json" \
  > "$OUT/stages.txt" 2>&1
python3 -m mlxd start --model v="$M" --port 8590 ${MLXD_ARGS:-} > "$OUT/mlxd.log" 2>&1 &
daemon=$!
wait_ready 8590 120
worker=$(pgrep -f "mlxd worker serve" | head -1)
load() {  # NAME LEVEL REQUESTS: one bench level with the worker sampled
  [ -x "$SPY" ] && "$SPY" record -p "$worker" -d "${SPY_S:-25}" -r 200 -f raw --threads --nonblocking \
    -o "$OUT/pyspy-$1.txt" > "$OUT/pyspy-$1.log" 2>&1 &
  local spy=$!
  python3 -m mlxd bench run --url http://127.0.0.1:8590 --endpoint chat --image-size 448 \
    --concurrency "$2" --requests-per-level "$3" --prompt-tokens 128 --max-tokens 128 \
    --client-procs 8 --seed "$4" > "$OUT/bench-$1.txt" 2>&1
  wait $spy 2>/dev/null
}
load c1 1 4 11
load c16 16 16 22
curl -s localhost:8590/metrics > "$OUT/metrics.txt"
kill -INT $daemon; wait $daemon
tail -n 3 "$OUT"/bench-c*.txt; tail -n 14 "$OUT/stages.txt"
(cd "$OUT" && tar czf probe.tgz pyspy-* metrics.txt mlxd.log stages.* 2>/dev/null \
  && rm -f pyspy-* metrics.txt mlxd.log)  # one file back, not many
[ "${PEER:-1}" = 1 ] && LEVELS="${LEVELS:-1,16}" python3 bench/matrix.py --out "$OUT" --classes vision --servers mlx-vlm \
  --server-s "${SERVER_S:-120}" > "$OUT/matrix.txt" 2>&1
tail -5 "$OUT/matrix.txt"
