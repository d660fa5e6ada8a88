"""What a prompt length never seen before costs: one-row prefills of new lengths against the same
length again, in-process.

    python bench/shape_cost.py MODEL_DIR [--tokens 352] [--count 6] [--out FILE.json]

Each round prefills one row of --tokens + i tokens (i = 1 .. --count, a length not seen before)
into a fresh cache, then the same length again; the medians of both and their ratio are printed.
A ratio well above 1 means a new length pays kernel builds (JIT compiles, graph instantiation)
that a server meets on every request whose prompt length it has not seen. Run once with
MLX_USE_CUDA_GRAPHS=0 beside to see which. An mlx-vlm checkpoint (a ``vision_config``) runs its
language model on text alone; any other through mlx-lm.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx


def loader(path: Path) -> tuple[Any, Any]:
    """(forward(ids, cache), make_cache()) for ``path``."""
    config = json.loads((path / "config.json").read_text())
    if "vision_config" in config:
        from mlx_vlm import load

        vlm, _ = load(str(path))
        lm = vlm.language_model
        return lm, lm.make_cache
    from mlx_lm import load as load_lm
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load_lm(str(path))
    return model, lambda: make_prompt_cache(model)


def prefill(forward: Any, make_cache: Any, length: int) -> float:
    ids = mx.array([[(7 * i) % 1000 + 10 for i in range(length)]])
    began = time.perf_counter()
    out = forward(ids, cache=make_cache())
    mx.eval(getattr(out, "logits", out))
    return time.perf_counter() - began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--tokens", type=int, default=352)
    p.add_argument("--count", type=int, default=6)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    forward, make_cache = loader(args.model)
    prefill(forward, make_cache, args.tokens)  # the first call's own costs left out
    prefill(forward, make_cache, args.tokens)
    new, again = [], []
    for i in range(1, args.count + 1):
        new.append(prefill(forward, make_cache, args.tokens + i))
        again.append(prefill(forward, make_cache, args.tokens + i))
    import os

    result = {
        "model": str(args.model),
        "tokens": args.tokens,
        "cuda_graphs": os.environ.get("MLX_USE_CUDA_GRAPHS", "default"),
        "new_ms": [round(t * 1e3, 1) for t in new],
        "again_ms": [round(t * 1e3, 1) for t in again],
        "new_p50_ms": round(statistics.median(new) * 1e3, 1),
        "again_p50_ms": round(statistics.median(again) * 1e3, 1),
    }
    result["ratio"] = round(result["new_p50_ms"] / result["again_p50_ms"], 2)
    text = json.dumps(result)
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
