# Sourced by the bench/gpu/gpu_*.sh that serve the real model: the tests' SmolLM2 GGUF ($GGUF,
# default /root/smollm2.gguf) converted once (dequantized) and cast to float16, the GPU's
# compute dtype, in $F16; $OUT made. Expects to run from the repository root after
# `source /root/mlx-env.sh`.
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
F32=$(python3 -c "from pathlib import Path; from mlxd.models import gguf
print(gguf.ensure_converted(Path('${GGUF:-/root/smollm2.gguf}'), Path('/root/gguf'), dequantize=True))")
F16=/root/models/smollm2-f16
[ -d "$F16" ] || python3 -c "import sys; sys.path.insert(0, 'bench'); import fidelity
from pathlib import Path; fidelity.to_float16(Path('$F32'), Path('$F16'))"
