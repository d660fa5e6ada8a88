"""How many operations one prefill forward of a Qwen3.5 VLM's language model builds, with
mlx-vlm's row-by-row chunk inverse against ``runners.delta_chunks``' blocked one: on CUDA each
is at least one kernel launch on the engine thread (a concatenation one per input).

    python bench/delta_graph.py MODEL_DIR [--tokens 352]

The forward is built, not run (mlx-vlm's own ``async_eval`` inside the scan is held back), and
its graph's primitives and its concatenations' inputs counted with ``mx.export_to_dot``, once
with each inverse.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlxd.worker.runners import delta_chunks  # noqa: E402


def primitives(lm: Any, tokens: int) -> tuple[int, int]:
    """The primitives of one forward of ``tokens`` tokens from a fresh cache, and the inputs
    of its concatenations (each copied by a launch of its own on CUDA)."""
    ids = mx.array([[(7 * i) % 1000 + 10 for i in range(tokens)]])
    held: list[mx.array] = []
    launch = mx.async_eval
    mx.async_eval = lambda *xs: held.extend(x for x in xs if isinstance(x, mx.array))
    try:
        logits = lm(ids, cache=lm.make_cache()).logits
    finally:
        mx.async_eval = launch
    with tempfile.NamedTemporaryFile("r", suffix=".dot") as dot:
        mx.export_to_dot(dot.name, logits, *held)
        lines = dot.read().splitlines()
    ops = [line for line in lines if "shape=rectangle" in line]
    joins = {line.split()[1] for line in ops if '"Concatenate"' in line}
    inputs = sum(line.split(" -> ")[-1].strip() in joins for line in lines if " -> " in line)
    return len(ops), inputs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--tokens", type=int, default=352)
    args = p.parse_args()
    from mlx_vlm import load
    from mlx_vlm.models.qwen3_5 import gated_delta as scan

    model, _ = load(str(args.model))
    row_by_row = scan._invert_unit_lower
    for name, inverse in (("row by row", row_by_row), ("blocked", delta_chunks._vlm_inverse)):
        scan._invert_unit_lower = inverse
        ops, joined = primitives(model.language_model, args.tokens)
        print(f"{name}: {ops} primitives, {joined} concatenated inputs")
    scan._invert_unit_lower = row_by_row


if __name__ == "__main__":
    main()
