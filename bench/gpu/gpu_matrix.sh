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
#   run 2 (carry .gpuB): bash .gpuB/install.sh b
#   run 3 (carry .gpuP): bash .gpuP/install_peers.sh && MAKE_ONLY=1 CLASSES=... bash bench/gpu/gpu_matrix.sh
# then one run per class (each fits 600 s: BUDGET_S=540 is shared fairly among the servers,
# at most SERVER_S=100 each; the servers' bounds are in each JSON):
#   CLASSES=dense bash bench/gpu/gpu_matrix.sh
# Several GPUs: LANES="0:prime:dense,dense,soak:mlxd:hybrid 1:make:moe,soak:mlxd:moe,fidelity"
# runs each lane's items in turn on its GPU (CUDA_VISIBLE_DEVICES), the lanes side by side, each
# with its own ports and $OUT/laneN/. Items: a class (matrix.py; named again in a lane, its Nth
# pass writes to laneN/passN/ and starts the servers' order N-1 places in); make:CLASS (its model, which
# items of other lanes wait for); prime:CLASS (mlxd's engine runs one LONG prompt in-process: a
# fresh machine compiles MLX's CUDA kernels in the first process that needs them, which would
# otherwise charge whichever server is timed first; a class item primes itself first if no item
# has on this machine); engine:CLASS (`mlxd bench engine` against
# mlx-lm's BatchGenerator in-process, ENGINE_LEVELS=1,16); soak:SERVER:CLASS (bench/soak_peer.py,
# DURATION=600 s at STREAMS=32, into $OUT/soak/); fidelity (gpu_fidelity.sh once $GGUF is there);
# rows (gpu_rows.sh's step time by rows, ROWS=16,24,32,48,64, on ROW_SIZES=qwen3-0.6b); scaleout
# (gpu_scaleout2.sh on this lane's GPU and the next, which then has no lane of its own); prof
# (bench/step_profile.py at PROF_ROWS="16 64" on the dense model); trace:CLASS (bench/step_trace.py:
# each decode step of TRACE_ROWS=1 rows timed, slow ones with what ran in them, against mlx-lm's
# generate_step); gap, gap:CLASS or gap:CLASS:CONC (gpu_gap.sh at CONC, else GAP_CONC=16, on the
# Qwen3-0.6B shape or the class's model: the engine in-process against the daemon over HTTP,
# GAP_LEGS, GAP_ROUNDS=2; SPY=1 adds py-spy's stacks of both); firstspy:CLASS (gpu_first_spy.sh: py-spy --native on
# the served worker through its first long prompt and a second, and what only the first ran).
# first:CLASS[:VARIANT] (bench/first_prompt.py on the class's model, FIRST_RUNS=2 starts, warm-up
# on: VARIANT default, graphs (MLX_CUDA_GRAPH_CACHE_SIZE=GRAPH_CACHE, 4000), nographs
# (MLX_USE_CUDA_GRAPHS=0) or warm60 (a 60 s warm-up bound)).
# shortconv (bench/short_conv.py: a depthwise conv1d against its multiply-adds, first calls at
# new lengths and row counts and repeats). placement:CLASS (bench/cpu_placement.py: mlx-lm's one
# row in fresh processes, unpinned and pinned to the GPU's node's CPUs and to two of them,
# PLACE_ROUNDS=3, alternated).
# updates (bench/graph_updates.py: an MLP stack at 1, 16 and 64 rows with CUDA graphs on and off,
# bf16 then 4-bit, three rounds: whether graphs lose where cuBLAS's clusters make them re-instantiate).
# warmtrace:CLASS (bench/warmup_trace.py: warm-up's stages twice in-process, with an empty PTX
# cache and again in a new process with it kept: which stage's steps compile kernels with NVRTC).
# graphsoff:CLASS (gpu_graphs_off.sh on the class's model: graphs on and off alternated,
# ROUNDS=2, GRAPHS_LEVELS="1 16", not the matrix's LEVELS: runs GO1 and GS1 ran 1 16 64 there).
# Then $OUT/all/matrix.md joins
# the classes and $OUT/soak/soak.md the soaks.
# A run longer than one command: DETACH=1 starts it in its own session, from a copy of the tree
# (TREE=/root/matrix-tree), writing to $RUN_DIR (/root/matrix-out), and returns; a later
# command, COLLECT=1, waits up to WAIT_S (580) for it, joins the table from whatever has
# finished, and copies matrix.md and a tarball of the run to $OUT (run it again if it was not
# done).
# Knobs: CLASSES SERVERS LEVELS=1,16,64 (LEVELS_CLASS, SERVERS_CLASS: one class's own)
#   PROMPT=128 OUTPUT=128 LONG=4500 PREFIX=2000
#   CLIENT_PROCS=8 MAX_SEQS=128 MLXD_ARGS (more `mlxd start` options) MODELS=/root/models
#   PEERS_ROOT=/root/peers MAKE_ONLY=1 (only the models) PYTHON=python3 (mlxd's, the servers')
#   TINY=1 (tiny widths: a CPU check, e.g. with LEVELS=1,4,8 PROMPT=32 OUTPUT=16 LONG=512
#   PREFIX=256 CLIENT_PROCS=2 MAX_SEQS=16)
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f /root/mlx-env.sh ] && source /root/mlx-env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export CUDA_DEVICE_ORDER=PCI_BUS_ID  # CUDA's GPU numbers are nvidia-smi's (soak's memory samples)
# One folder of MLX's compiled kernels for every server and probe on the machine, as MLX's own
# default under /tmp is (mlxd's workers would otherwise keep theirs apart: PTX_CACHE, run WT1)
export MLX_PTX_CACHE_DIR=${MLX_PTX_CACHE_DIR:-/root/ptx}
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
  [ -d "$RUN_DIR/soak" ] && "$PY" bench/soak_peer.py --out "$RUN_DIR/soak" --report > /dev/null 2>&1
  tar czf "$OUT/matrix-run.tgz" -C "$RUN_DIR" . && cp "$RUN_DIR/all/matrix.md" "$OUT/" 2>/dev/null
  cat "$RUN_DIR/all/matrix.md" "$RUN_DIR"/lane*/pass*/matrix.md "$RUN_DIR/soak/soak.md" 2>/dev/null
  tail -3 "$RUN_DIR"/lane*.txt 2>/dev/null
  exit 0
fi
preflight() {  # mlxd's worker, daemon and bench import here, or the run stops now (run RP1:
  # without llguidance every mlxd process exited at import, seen 7 minutes into the lease)
  "$PY" -c "import mlxd.worker.main, mlxd.daemon.server, mlxd.daemon.supervisor, mlxd.cli.bench" \
    || { echo "mlxd does not import with $PY: stage its dependencies (bench/README)" >&2; exit 1; }
}
if [ "${DETACH:-0}" = 1 ]; then
  preflight
  rm -rf "$RUN_DIR"; mkdir -p "$RUN_DIR"
  # The lanes run from a copy of the tree: the device machine refreshes its working tree at
  # every later command, and a server started during that refresh did not find mlxd's modules
  # (run FP1: the dense lane's daemon, ModuleNotFoundError).
  tree="${TREE:-/root/matrix-tree}"; rm -rf "$tree"; mkdir -p "$tree"
  tar cf - --exclude=./.gpuA --exclude=./.gpuB --exclude=./.venv --exclude=./.git --exclude=./out . \
    | tar xf - -C "$tree"
  OUT="$RUN_DIR" DETACH=0 setsid nohup bash "$tree/bench/gpu/gpu_matrix.sh" > "$RUN_DIR/run.log" 2>&1 < /dev/null &
  echo "started in its own session: COLLECT=1 bash $0"
  exit 0
fi
commit_id() {  # the tree under test: a copy without .git (DETACH, the device) needs MLXD_COMMIT
  echo "${MLXD_COMMIT:-$(git log -1 --format=%h 2>/dev/null || echo "unknown: set MLXD_COMMIT")}"
}
model_dir() { echo "${MODELS:-/root/models}/matrix-$1$([ "${TINY:-0}" = 1 ] && echo -tiny)"; }
make_model() {  # CLASS: its model made (matrix.py makes each once)
  # shellcheck disable=SC2046  # TINY adds one option
  "$PY" bench/matrix.py --out "$OUT/make" --classes "$1" --make-only \
    $([ "${TINY:-0}" = 1 ] && echo --tiny) >> "$OUT/make.txt" 2>&1
}
made() {  # CLASS: its model, once the lane making it (make:CLASS) is done
  while [ -f "$(model_dir "$1").making" ]; do sleep 5; done
  make_model "$1"
}
prime() {  # CLASS DIR: mlxd's engine runs one LONG prompt, then a worker's warm-up unbounded,
  # in-process: MLX's CUDA kernels built (FX1: the one prompt alone left the warm-up's many-row
  # kernels to the served starts, whose bound then cut their passes)
  timeout -k 5 300 "$PY" -m mlxd bench engine --model "$(model_dir "$1")" --no-compare-mlx-lm \
    --speculate off --concurrency 1 --prompt-tokens "${LONG:-4500}" --max-tokens 8 >> "$2-prime.txt" 2>&1
  timeout -k 5 600 "$PY" bench/warmup_trace.py "$(model_dir "$1")" --passes 1 >> "$2-prime.txt" 2>&1
  touch "$(model_dir "$1").primed"
}
primed() {  # CLASS DIR: primed once on this machine before its servers are timed: on a fresh one
  # mlxd's MoE worker built kernels and warmed up past its 100 s to be ready (runs MC2-MC3)
  [ -f "$(model_dir "$1").primed" ] || prime "$1" "$2"
}
first_env() {  # VARIANT: the first-prompt variant's environment (run FP2)
  case $1 in graphs) echo "MLX_CUDA_GRAPH_CACHE_SIZE=${GRAPH_CACHE:-4000}" ;;
    nographs) echo MLX_USE_CUDA_GRAPHS=0 ;; *) echo "MLXD_FIRST_VARIANT=$1" ;; esac
}
first_args() {  # VARIANT: its first_prompt.py options (warm60: a 60 s warm-up bound)
  case $1 in warm60) echo "--warmup-s 60" ;; *) echo "--warmup-s ${WARMUP_S:-20}" ;; esac
}
item() {  # GPU ITEM: one item of a lane, on GPU (its output in $OUT/laneGPU*)
  local gpu=$1 kind=${2%%:*} arg=${2#*:} dir="$OUT/lane$1"
  export CUDA_VISIBLE_DEVICES=$gpu; mkdir -p "$dir"
  case $kind in
    make) make_model "$arg"; rm -f "$(model_dir "$arg").making" ;;
    prime) made "$arg"; prime "$arg" "$dir" ;;
    engine) made "$arg"; "$PY" -m mlxd bench engine --model "$(model_dir "$arg")" --speculate off \
      --concurrency "${ENGINE_LEVELS:-1,16}" --prompt-tokens 128 --max-tokens 128 \
      --json "$dir/engine-$arg.json" >> "$dir-engine.txt" 2>&1 ;;
    soak) made "${arg#*:}"; "$PY" bench/soak_peer.py --out "$OUT/soak" --server "${arg%%:*}" \
      --model "$(model_dir "${arg#*:}")" --label "${arg/:/-}" --duration "${DURATION:-600}" \
      --streams "${STREAMS:-32}" --port $((8490 + 100 * gpu)) ${SOAK_ARGS:-} \
      $(nvidia-smi -L > /dev/null 2>&1 && echo --gpu "$gpu") >> "$dir-soak.txt" 2>&1 ;;
    fidelity) for _ in $(seq 600); do [ -f "${GGUF:-/root/smollm2.gguf}" ] && break; sleep 1; done
      OUT="$dir/fidelity" bash bench/gpu/gpu_fidelity.sh > "$dir-fidelity.txt" 2>&1 ;;
    rows) OUT="$dir" SIZES="${ROW_SIZES:-qwen3-0.6b}" LEVELS="${ROWS:-16,24,32,48,64}" LONG=0 \
      bash bench/gpu/gpu_rows.sh > "$dir-rows.txt" 2>&1 ;;
    scaleout) CUDA_VISIBLE_DEVICES=$gpu,$((gpu + 1)) OUT="$dir/scaleout" \
      bash bench/gpu/gpu_scaleout2.sh > "$dir-scaleout.txt" 2>&1 ;;  # GPUs gpu and gpu+1: no lane gpu+1
    trace) made "$arg"; "$PY" bench/step_trace.py "$(model_dir "$arg")" --rows "${TRACE_ROWS:-1}" \
      --json "$dir/trace-$arg.json" >> "$dir-trace.txt" 2>&1 ;;
    gap) local cls=${arg%%:*} conc=${GAP_CONC:-16} out=$dir/gap  # gap[:CLASS[:CONC]]
      [[ $arg == *:* ]] && conc=${arg#*:}
      [ "$cls" = gap ] || { made "$cls"; out=$dir/gap-${arg//:/-}; }
      MODEL=$([ "$cls" = gap ] || model_dir "$cls") OUT="$out" CONC="$conc" \
        LEGS="${GAP_LEGS:-engine http}" ROUNDS="${GAP_ROUNDS:-2}" PORT=$((8300 + 100 * gpu)) \
        bash bench/gpu/gpu_gap.sh >> "$dir-gap.txt" 2>&1 ;;
    firstspy) made "$arg"; primed "$arg" "$dir"  # what the first long prompt pays, in C frames
      MODEL=$(model_dir "$arg") OUT="$dir/firstspy-$arg" PORT=$((8950 + 100 * gpu)) \
        bash bench/gpu/gpu_first_spy.sh > "$dir-firstspy.txt" 2>&1 ;;
    first) local cls=${arg%%:*} var=default; [[ $arg == *:* ]] && var=${arg#*:}  # first:CLASS[:VAR]
      made "$cls"; primed "$cls" "$dir"
      # shellcheck disable=SC2046  # a variant's environment and options
      env $(first_env "$var") "$PY" bench/first_prompt.py --model "$(model_dir "$cls")" --on-only \
        --tokens "${LONG:-4500}" --runs "${FIRST_RUNS:-2}" $(first_args "$var") \
        --json "$dir/first-$cls-$var.json" >> "$dir-first-$var.txt" 2>&1 ;;
    graphsoff) made "$arg"; primed "$arg" "$dir"  # graphsoff:CLASS: CUDA graphs on and off
      MODEL=$(model_dir "$arg") OUT="$dir/graphs-$arg" PORT=$((8700 + 100 * gpu)) \
        LEVELS="${GRAPHS_LEVELS:-1 16}" bash bench/gpu/gpu_graphs_off.sh > "$dir-graphs.txt" 2>&1 ;;
    warmtrace) made "$arg"  # warmtrace:CLASS: warm-up's stages, the machine's kernel
      # folder (MLX_PTX_CACHE_DIR, above) emptied first, then kept: first in a lane, before servers
      for fresh in --fresh ""; do  # shellcheck disable=SC2086  # --fresh or nothing
        "$PY" bench/warmup_trace.py "$(model_dir "$arg")" $fresh \
          --json "$dir/warmtrace-$arg${fresh:+-fresh}.json" >> "$dir-warmtrace.txt" 2>&1
      done ;;
    shortconv) "$PY" bench/short_conv.py >> "$dir-shortconv.txt" 2>&1 ;;  # conv1d against taps
    placement) made "$arg"  # placement:CLASS: mlx-lm's one row unpinned and pinned to CPUs
      "$PY" bench/cpu_placement.py "$(model_dir "$arg")" --rounds "${PLACE_ROUNDS:-3}" \
        --json "$dir/placement-$arg.json" >> "$dir-placement.txt" 2>&1 ;;
    updates) for bits in 0 4; do
        "$PY" bench/graph_updates.py --bits "$bits" --json "$dir/graph-updates-$bits.json" >> "$dir-updates.txt" 2>&1
      done ;;
    prof) for r in ${PROF_ROWS:-16 64}; do
        "$PY" bench/step_profile.py "$(model_dir dense)" --rows "$r" >> "$dir-prof.txt" 2>&1
      done ;;
    *) made "$kind"; primed "$kind" "$dir"  # a class; its Nth pass in a lane: passN/, order turned
      local n levels="LEVELS_$kind" servers="SERVERS_$kind"  # a class's own, if set
      n=$(( $(cat "$dir/.passes-$kind" 2>/dev/null || echo 0) + 1 ))
      echo "$n" > "$dir/.passes-$kind"
      # shellcheck disable=SC2046  # TINY and the class's own levels and servers add options
      "$PY" bench/matrix.py --out "$dir$([ "$n" -gt 1 ] && echo "/pass$n")" --classes "$kind" \
        --rotate $((n - 1)) --port $((8400 + 100 * gpu)) --budget-s "${BUDGET_S:-540}" \
        $([ -n "${!levels:-}" ] && echo --levels "${!levels}") \
        $([ -n "${!servers:-}" ] && echo --servers "${!servers}") \
        $([ "${TINY:-0}" = 1 ] && echo --tiny) >> "$dir.txt" 2>&1 ;;
  esac
}
lane() {  # GPU ITEMS: a lane's items in turn on GPU
  local gpu=$1 it
  for it in ${2//,/ }; do echo "$(date -u +%T) $it" >> "$OUT/lane$gpu-items.txt"; item "$gpu" "$it"; done
  echo "$(date -u +%T) done" >> "$OUT/lane$gpu-items.txt"
}
if [ -n "${LANES:-}" ]; then
  preflight
  mkdir -p "$OUT"; date -u > "$OUT/started"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > "$OUT/machine.txt" 2>&1
  echo "commit $(commit_id) LANES=$LANES" >> "$OUT/machine.txt"
  for it in ${LANES//,/ }; do  # every model a lane makes, so that other lanes wait for it
    case $it in *make:*) mkdir -p "${MODELS:-/root/models}"; touch "$(model_dir "${it##*make:}").making" ;; esac
  done
  for spec in $LANES; do lane "${spec%%:*}" "${spec#*:}" & done
  wait; join_tables "$OUT"
  [ -d "$OUT/soak" ] && "$PY" bench/soak_peer.py --out "$OUT/soak" --report > /dev/null 2>&1
  date -u > "$OUT/done"; exit 0
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"
  "$PY" -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())"
  echo "commit $(commit_id)"; date -u
  echo "CLASSES=${CLASSES:-dense} SERVERS=${SERVERS:-all} LEVELS=${LEVELS:-1,16,64}"
} | tee "$OUT/machine.txt"
# shellcheck disable=SC2046  # MAKE_ONLY and TINY (a CPU check) add one option each
"$PY" bench/matrix.py --out "$OUT" --classes "${CLASSES:-dense}" --budget-s "${BUDGET_S:-540}" \
  $([ "${MAKE_ONLY:-0}" = 1 ] && echo --make-only) $([ "${TINY:-0}" = 1 ] && echo --tiny) \
  2>&1 | tee "$OUT/matrix.txt"
