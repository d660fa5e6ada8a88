#!/usr/bin/env bash
# Where the text hybrid's 16-stream time goes (issue 41): the matrix's Qwen3.5-0.8B shape served
# by mlxd, a 4,500-token prompt right after the start and another, one stream (4 requests), then
# 16 streams three times in a row with new prompts (does a repeated load still pay for new
# shapes?), py-spy sampling the worker through the last 16-stream load, then a 2000-token shared
# prefix cold and hit. VARIANTS (default "base") names the trees to compare:
# "base" is the checkout; "minN" the same with Gated DeltaNet chunks from N tokens
# (delta_chunks.MIN_TOKENS = N, edited in this machine's copy and put back).
# $OUT: probe.tgz (worker logs, bench output, py-spy stacks), summary.txt.
# Setup as gpu_vision_probe.sh's.
set -uo pipefail
source "$(dirname "$0")/vision_env.sh"
SPY="${SPY:-/root/pyspy/bin/py-spy}"
M="${MODELS:-/root/models}/matrix-hybrid"
D=mlxd/worker/runners/delta_chunks.py
python3 bench/matrix.py --out "$OUT" --classes hybrid --make-only > "$OUT/make.txt" 2>&1
bench() {  # NAME ARGS...: one bench invocation, its last table row kept in summary.txt
  local name=$1; shift
  python3 -m mlxd bench run --url http://127.0.0.1:8591 --model bench --prompt-tokens 128 \
    --max-tokens 128 --client-procs 8 "$@" > "$OUT/bench-$name.txt" 2>&1
  echo "$name: $(grep -E '^ +[0-9]+ ' "$OUT/bench-$name.txt" | tail -2 | tr -s ' ' | tr '\n' '|')" \
    | tee -a "$OUT/summary.txt"
}
variant() {  # NAME: a daemon of this tree, its loads, stopped
  local t0=$SECONDS
  python3 -m mlxd start --model bench="$M" --port 8591 --max-num-seqs 128 --max-queued 1024 \
    ${MLXD_ARGS:-} > "$OUT/mlxd-$1.log" 2>&1 &
  local daemon=$!
  wait_ready 8591 150
  echo "$1: ready after $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
  local worker spy=; worker=$(pgrep -f "mlxd worker serve" | head -1)
  for leg in first warm; do  # a 4,500-token prompt right after the start, then another
    bench "$1-$leg" --prompt-tokens 4500 --max-tokens 1 --concurrency 1 --requests-per-level 1 \
      --warmup-tokens 0 --seed "${#leg}"
  done
  bench "$1-c1" --concurrency 1 --requests-per-level 4
  for i in 1 2 3; do
    if [ "$i" = 3 ] && [ -x "$SPY" ]; then
      "$SPY" record -p "$worker" -d 8 -r 200 -f raw --threads --nonblocking \
        -o "$OUT/pyspy-$1.txt" > "$OUT/pyspy-$1.log" 2>&1 &
      spy=$!
    fi
    bench "$1-c16-$i" --concurrency 16 --seed "$((7 * i))"
  done
  [ -n "$spy" ] && wait "$spy"
  bench "$1-prefix" --scenario shared-prefix --prefix-tokens 2000 --concurrency 1 --max-tokens 16
  kill -INT $daemon; wait $daemon
}
for v in ${VARIANTS:-base}; do
  cp "$D" "$D.probe"
  case "$v" in min*) sed -i "s/^MIN_TOKENS = .*/MIN_TOKENS = ${v#min}/" "$D" ;; esac
  variant "$v"
  mv "$D.probe" "$D"
done
(cd "$OUT" && tar czf probe.tgz mlxd-*.log bench-*.txt pyspy-* 2>/dev/null && rm -f mlxd-*.log bench-*.txt pyspy-*)
