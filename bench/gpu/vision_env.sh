# (sourced) the GPU machine's environment for a script that loads a VLM: the checkout and
# mlx-vlm's peer folder on PYTHONPATH, $OUT made. Used by gpu_vision_probe.sh, gpu_shape_cost.sh.
cd "$(dirname "${BASH_SOURCE[1]}")/../.." || exit 1
[ -f /root/mlx-env.sh ] && source /root/mlx-env.sh
PEERS_ROOT="${PEERS_ROOT:-/root/peers}"
export PYTHONPATH="$PWD:${PYTHONPATH:-}:$PEERS_ROOT/mlx-vlm" PYTHONUNBUFFERED=1
export OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
