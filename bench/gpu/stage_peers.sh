#!/usr/bin/env bash
# Stage the peer servers of the class matrix (issue 41) for a GPU machine with no package index:
# vllm-mlx, Rapid-MLX and mlx-vlm's server, each with the few wheels it needs beyond what the
# machine has (Python 3.12, torch, transformers, tokenizers, numpy, ... and mlxd's /root/site
# from ../shared/gpu/stage.sh: mlx, mlx-lm 0.32.2, starlette, uvicorn). mlx_lm.server needs
# nothing: it is mlxd's own mlx-lm.
#
# The lists are the minimal sets that import and serve (checked by starting each server on a
# tiny model, in a Python with only the GPU machine's packages): the declared dependencies
# gradio, mcp, torchvision, opencv-python, mlx-embeddings, lm-format-enforcer, tiktoken, ...
# are not imported by a text model's server. fastapi stays below 0.142, whose import needs
# opentelemetry. Rapid-MLX's pins on transformers (<5.16) and tokenizers (<0.23) are not
# honoured: it serves on the machine's 5.17 / 0.23.
#
# Run from the project root (idempotent; the folder is git-excluded), then carry it:
#   bash bench/gpu/stage_peers.sh            # -> .gpuP/ (wheels + install_peers.sh), < 64 MiB
#   GPU run (carry .gpuP):  bash .gpuP/install_peers.sh      # -> /root/peers/NAME, one per peer
# A check here (Python 3.11, the CPU): PYVER=3.11 DEST=/tmp/peerwheels bash bench/gpu/stage_peers.sh
#   && PEERS_ROOT=/tmp/peers bash /tmp/peerwheels/install_peers.sh
set -euo pipefail
ROOT="$(git rev-parse --show-toplevel)"
cd "$ROOT"
PYVER="${PYVER:-3.12}"
DEST="${DEST:-.gpuP}"
# Pinned to what was checked: pip resolves nothing here (--no-deps), so every wheel is named.
WEB="fastapi==0.140.0 annotated-doc==0.0.7 pydantic==2.14.4 pydantic-core==2.50.5 \
annotated-types==0.8.0 typing-inspection==0.4.5 python-multipart==0.0.34"
SCHEMA="jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \
rpds-py==2026.9.1 attrs==26.1.0"
VLLM_MLX="vllm-mlx==0.6.0 mlx-lm==0.31.3 $WEB $SCHEMA"
RAPID_MLX="rapid-mlx==0.16.10 mlx-lm==0.31.3 mlx-vlm==0.7.2 $WEB $SCHEMA websockets==17.4"
MLX_VLM="mlx-vlm==0.7.10 mlx-audio==0.6.2 $WEB cryptography==50.0.2 cffi==2.1.1 pycparser==3.12"
EXCLUDE="$(git rev-parse --git-common-dir)/info/exclude"  # a worktree's .git is a file
case "$DEST" in /*) ;; *) grep -qx "/$DEST/" "$EXCLUDE" 2>/dev/null || echo "/$DEST/" >> "$EXCLUDE" ;; esac
mkdir -p "$DEST"
dl() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 \
    -d "$DEST" "$@"
}
# shellcheck disable=SC2086  # the lists are word lists
dl $VLLM_MLX $MLX_VLM
dl $RAPID_MLX  # apart: its mlx-vlm pin (0.7.2) is not the server's (0.7.10)
dl py-spy==0.4.3  # the sampler of gpu_vision_probe.sh (installed to /root/pyspy by hand)
{
  echo '#!/usr/bin/env bash'
  echo '# Each peer in its own --target folder: PYTHONPATH=$PEERS_ROOT/NAME:$PYTHONPATH puts its'
  echo '# mlx-lm (0.31.3 for vllm-mlx and Rapid-MLX) before mlxd'"'"'s (0.32.2 in /root/site).'
  echo 'set -euo pipefail'
  echo 'here="$(cd "$(dirname "$0")" && pwd)"; root="${PEERS_ROOT:-/root/peers}"'
  echo 'py="${PYTHON:-python3}"'
  echo 'peer() {  # NAME REQUIREMENT...'
  echo '  local name=$1; shift; rm -rf "${root:?}/$name"'
  echo '  "$py" -m pip install -q --no-index --no-deps --no-compile --find-links "$here" --target "$root/$name" "$@"'
  echo '  echo "$name -> $root/$name"'
  echo '}'
  echo "peer vllm-mlx $VLLM_MLX"
  echo "peer rapid-mlx $RAPID_MLX"
  echo "peer mlx-vlm $MLX_VLM"
} > "$DEST/install_peers.sh"
chmod +x "$DEST/install_peers.sh"
du -sh "$DEST"
