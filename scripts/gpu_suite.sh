#!/usr/bin/env bash
# The standard benchmark suite on the GPU machine (MLX CUDA backend); JSON and logs under $OUT.
# Needs the staged wheels (../shared/gpu/stage.sh, with EXTRA=httptools): run 1 carries .gpuA
# (`bash .gpuA/install.sh a`), run 2 carries .gpuB: `bash .gpuB/install.sh b && bash scripts/gpu_suite.sh`
#   SIZE=qwen3-0.6b DTYPE=bfloat16 LEVELS=1,4,16,64 bash scripts/gpu_suite.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
SIZE="${SIZE:-qwen3-0.6b}"; DTYPE="${DTYPE:-bfloat16}"; LEVELS="${LEVELS:-1,4,16,64}"
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
M="/root/models/$SIZE-$DTYPE"
log() { echo "== $*" | tee -a "$OUT/suite.txt"; }
wait_up() { for _ in $(seq 240); do curl -sf "$1" >/dev/null && return 0; sleep 0.5; done; return 1; }
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -c "import mlx.core as mx, mlx_lm; print('mlx', mx.__version__, mx.default_device(), 'mlx-lm', mlx_lm.__version__)"
  git log -1 --format='commit %h %cd' 2>/dev/null || true; date -u; } | tee "$OUT/machine.txt"
[ -d "$M" ] || python3 -m mlxd make-model --arch "${SIZE%%-*}" --size "$SIZE" --dtype "$DTYPE" --out "$M" 2>/dev/null

log "engine in-process + mlx-lm yardsticks"
python3 -m mlxd bench engine --model "$M" --concurrency "$LEVELS" --json "$OUT/engine.json" 2>/dev/null | tee -a "$OUT/suite.txt"

log "worker over ZeroMQ alone"
python3 -m mlxd worker serve --model "$M" --bind ipc:///tmp/suite.sock --max-num-seqs 128 --log-level WARNING &
W=$!; sleep 10
for c in 1 64; do python3 scripts/bench_zmq.py ipc:///tmp/suite.sock $c > "$OUT/zmq$c.json"; cat "$OUT/zmq$c.json" >> "$OUT/suite.txt"; done
kill $W; wait $W 2>/dev/null

log "mlxd over HTTP"
python3 -m mlxd start --model "bench=$M" --port 8123 --log-level warning --max-num-seqs 128 --max-queued 1024 > "$OUT/mlxd.log" 2>&1 &
D=$!; wait_up http://127.0.0.1:8123/health
python3 -m mlxd bench run --url http://127.0.0.1:8123 --model bench --concurrency "$LEVELS" --json "$OUT/http.json" 2>/dev/null | tee -a "$OUT/suite.txt"
kill -TERM $D; wait $D 2>/dev/null

log "mlx_lm.server over HTTP (same model, same workload)"
python3 -m mlx_lm.server --model "$M" --port 8124 > "$OUT/mlx_lm_server.log" 2>&1 &
S=$!; wait_up http://127.0.0.1:8124/v1/models
python3 -m mlxd bench run --url http://127.0.0.1:8124 --model "$M" --text-prompts-from "$M" --concurrency "$LEVELS" --json "$OUT/mlx_lm_server.json" 2>/dev/null | tee -a "$OUT/suite.txt"
kill $S; wait $S 2>/dev/null

log "decode step: contiguous vs paged cache"
for b in 16 64; do python3 scripts/bench_paged.py "$M" $b 128 128 32 | tee -a "$OUT/suite.txt"; done
