# (sourced) the GPU machine's environment for the probes: the checkout and mlx-vlm's peer folder
# on PYTHONPATH, $OUT made, and wait_ready. Used by gpu_vision_probe.sh, gpu_shape_cost.sh and
# gpu_hybrid_probe.sh.
cd "$(dirname "${BASH_SOURCE[1]}")/../.." || exit 1
[ -f /root/mlx-env.sh ] && source /root/mlx-env.sh
PEERS_ROOT="${PEERS_ROOT:-/root/peers}"
export PYTHONPATH="$PWD:${PYTHONPATH:-}:$PEERS_ROOT/mlx-vlm" PYTHONUNBUFFERED=1
export OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
wait_ready() {  # PORT SECONDS: until mlxd on PORT says it is ready, at most SECONDS
  for _ in $(seq "$2"); do curl -sf "localhost:$1/health" | grep -q '"ready":true' && return; sleep 1; done
}
