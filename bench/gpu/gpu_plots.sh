#!/usr/bin/env bash
# PNGs from bench/gpu/gpu_suite.sh's JSON, drawn here (the GPU machine has no matplotlib):
#   bash bench/gpu/gpu_plots.sh DIR      (writes DIR/*.png; needs `pip install -e '.[plot]'`)
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR="${1:?usage: gpu_plots.sh DIR_WITH_SUITE_JSON}"
PY="${PY:-.venv/bin/python}"
plot() { local out=$1; shift; local files=(); for f in "$@"; do [ -f "$f" ] && files+=("$f"); done
  [ ${#files[@]} -gt 0 ] && "$PY" -m mlxd bench plot "${files[@]}" --out "$DIR/$out" || true; }
for http in "$DIR"/http-*.json; do
  [ -f "$http" ] || continue
  tag="${http##*/http-}"; tag="${tag%.json}"
  # mlxd over HTTP vs in-process vs mlx_lm.server, same model and workload
  case "$tag" in contiguous-*) continue ;; esac
  plot "throughput-$tag.png" "$http" "$DIR/engine-$tag.json" "$DIR/mlx_lm_server-$tag.json" \
    "$DIR/http-contiguous-$tag.json"
  plot "prefix-$tag.png" "$DIR/prefix-$tag.json" "$DIR/mlx_lm_server-prefix-$tag.json"
done
plot "models.png" "$DIR"/http-*.json
ls -l "$DIR"/*.png
