#!/usr/bin/env bash
# Replica routing (#22): the multi-turn scenario against 1 replica, 2 replicas with cache-aware
# routing and 2 with round robin; one `mlxd bench run` JSON and table each under $OUT. The
# "cached" column is usage.prompt_tokens_details.cached_tokens / prompt_tokens.
#   bash bench/bench_replicas.sh MODEL_DIR [CONCURRENCY=4] [extra `mlxd bench run` args]
# START_ARGS (env): extra `mlxd start` options for every daemon, e.g. "--max-context 4096".
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$1"; LEVELS="${2:-4}"; shift $(( $# < 2 ? $# : 2 ))
PY="${PYTHON:-.venv/bin/python}"; [ -x "$PY" ] || PY=python3
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
PORT="${PORT:-8124}"
export MLXD_HOME="${MLXD_HOME:-$(mktemp -d)}"  # its own data dir: any other daemon is left alone
run() {  # NAME, then `mlxd start` options
  local name="$1"; shift
  # shellcheck disable=SC2086  # START_ARGS is a list of options
  "$PY" -m mlxd start --model "bench=$MODEL" --port "$PORT" --log-level warning ${START_ARGS:-} "$@" \
    > "$OUT/daemon-$name.log" 2>&1 &
  local daemon=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.5; done
  "$PY" -m mlxd bench run --url "http://127.0.0.1:$PORT" --model bench --scenario multi-turn \
    --endpoint chat --concurrency "$LEVELS" --label "$name" --json "$OUT/replicas-$name.json" \
    "${BENCH_ARGS[@]}" 2>&1 | tee "$OUT/replicas-$name.txt"
  kill -TERM "$daemon"; wait "$daemon" || true
}
BENCH_ARGS=("$@")
run one
run two-cache-aware --replicas 2 --routing cache_aware
run two-round-robin --replicas 2 --routing round_robin
