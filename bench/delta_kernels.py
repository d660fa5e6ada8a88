"""The kernels one Gated DeltaNet layer's chunked prefill (``runners.delta_chunks``) builds, by
prompt length, for this tree and for the module at a git revision: on CUDA each non-view
primitive is at least one kernel node and each input of a concatenation one copy, and a graph
of new length is one MLX instantiates anew (issue 41 point 4).

    python bench/delta_kernels.py [--ref 7c12bd9] [--tokens 64,404,2048] [--heads 16] [--dim 128]

Builds the layer's graph on zeros (nothing is run) and counts it with ``mx.export_to_dot``.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import mlx.core as mx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mlxd.worker.runners import delta_chunks  # noqa: E402

PATH = "mlxd/worker/runners/delta_chunks.py"
# Flatten copies only what is not in rows (here nothing); an AsStrided view stays counted as an
# op: the matmul that takes it copies it to a contiguous batch first (ensure_batch_contiguous).
VIEWS = {"Transpose", "Broadcast", "Squeeze", "Slice", "Reshape", "ExpandDims", "Flatten"}


def at(ref: str) -> ModuleType:
    """``delta_chunks`` as it was at git revision ``ref``."""
    text = subprocess.run(
        ["git", "show", f"{ref}:{PATH}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "delta_chunks_at.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("delta_chunks_at", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def kernels(module: ModuleType, tokens: int, heads: int, dim: int) -> tuple[int, int]:
    """The non-view primitives and the concatenated inputs of one layer's prefill."""
    qkv = [mx.zeros((1, tokens, heads, dim)) for _ in range(3)]
    gates = [mx.ones((1, tokens, heads)) for _ in range(2)]
    y, s = module.chunked_gated_delta(*qkv, *gates, mx.zeros((1, heads, dim, dim)))
    with tempfile.NamedTemporaryFile("r", suffix=".dot") as dot:
        mx.export_to_dot(dot.name, y, s)
        lines = dot.read().splitlines()
    ops = {
        ln.split()[1]: ln.split('label ="')[1].split('"')[0] for ln in lines if "rectangle" in ln
    }
    kinds = collections.Counter(ops.values())
    joins = {node for node, kind in ops.items() if kind == "Concatenate"}
    joined = sum(ln.split(" -> ")[-1].strip() in joins for ln in lines if " -> " in ln)
    return sum(n for k, n in kinds.items() if k not in VIEWS | {"Concatenate"}), joined


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref", default="7c12bd9", help="the revision to compare with")
    p.add_argument("--tokens", default="64,404,2048")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    args = p.parse_args()
    before = at(args.ref)
    for tokens in (int(t) for t in args.tokens.split(",")):
        row = [f"{tokens:>5} tokens ({-(-tokens // delta_chunks.CHUNK)} chunks):"]
        for name, module in ((args.ref, before), ("this tree", delta_chunks)):
            ops, joined = kernels(module, tokens, args.heads, args.dim)
            row.append(f"{name} {ops} ops + {joined} copies = {ops + joined}")
        print("  ".join(row))


if __name__ == "__main__":
    main()
