#!/usr/bin/env bash
# Before/after on one GPU machine, in ONE run: the suite's HTTP throughput and shared-prefix legs
# for an older tree and this one, alternated (A B A B) so the machine's drift shows in both.
# Results (each round's JSON, tables and logs) come back as one tarball, $OUT/compare.tar.gz,
# and a summary table, $OUT/compare.txt.
#
#   BEFORE=.before  a copy of the older tree (git archive <commit> mlxd scripts | tar -x -C .before),
#                   carried to the machine; its own suite script runs it (scripts/ or bench/gpu/)
#   ROUNDS=2  LEVELS=1,16,64  PREFIXES=2000  ROUND_S=120 (each suite's budget)
#   ORDER="before after" (each round's order)  LEGS="http prefix" (the suite's legs)
#   AFTER_COMMIT=<this tree's commit, for the labels>
# Setup as for gpu_suite.sh (../shared/gpu/stage.sh, then .gpuA and .gpuB installs).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f /root/mlx-env.sh ] && source /root/mlx-env.sh
BEFORE="${BEFORE:-.before}"; ROUNDS="${ROUNDS:-2}"; ROUND_S="${ROUND_S:-120}"
ORDER="${ORDER:-before after}"; AFTER_COMMIT="${AFTER_COMMIT:-$(git log -1 --format=%h 2>/dev/null)}"
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT/runs"
export LEVELS="${LEVELS:-1,16,64}" PREFIXES="${PREFIXES:-2000}" PEERS=0 EXTRA_LEGS=0
suite_of() {  # the suite script of a tree: bench/gpu/ now, scripts/ before the move
  if [ -f "$1/bench/gpu/gpu_suite.sh" ]; then echo "$1/bench/gpu/gpu_suite.sh"
  else echo "$1/scripts/gpu_suite.sh"; fi
}
for round in $(seq "$ROUNDS"); do
  for side in $ORDER; do
    tree=$([ "$side" = before ] && echo "$BEFORE" || echo .)
    commit=$([ "$side" = before ] && cat "$BEFORE/COMMIT" || echo "$AFTER_COMMIT")
    echo "== round $round: $side ($commit)" >&2
    MLXD_COMMIT="$commit" OUT="$OUT/runs/$side$round" LEGS="${LEGS:-http prefix}" BUDGET_S="$ROUND_S" \
      bash "$(suite_of "$tree")" > "$OUT/runs/$side$round.log" 2>&1
  done
done
python3 - "$OUT/runs" > "$OUT/compare.txt" <<'PY'
import glob, json, os, sys
print("| run | leg | group | prefix | streams | out tok/s | TTFT p50 / p99 ms | ITL p50 ms | failed |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for path in sorted(glob.glob(f"{sys.argv[1]}/*/*.json")):
    run, leg = os.path.basename(os.path.dirname(path)), os.path.basename(path).split("-")[0]
    for r in json.load(open(path)).get("rows", []):
        print(f"| {run} | {leg} | {r.get('group')} | {r.get('prefix_tokens') or ''} | "
              f"{r['concurrency']} | {r['output_tok_s']:,.1f} | {r['ttft_p50_ms']:.0f} / "
              f"{r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.1f} | {r.get('failed')} |")
PY
tar -czf "$OUT/compare.tar.gz" -C "$OUT" runs
cat "$OUT/compare.txt"
