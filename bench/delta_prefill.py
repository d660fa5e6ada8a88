#!/usr/bin/env python
"""A Gated DeltaNet model's prefill: mlx-lm's per-token loop against mlxd's chunks
(``mlxd.worker.runners.delta_chunks``), alternated, in-process.

    python bench/delta_prefill.py MODEL_DIR [--tokens 1024,4096] [--rounds 3]

Loads MODEL_DIR with mlx-lm and times one forward of a prompt of each length from an empty
cache, the loop and the chunks in turn for --rounds rounds (the first forward of each length
is a warm-up and not counted). Prints each time and the median ratio. Every length runs in
chunks here, under ``delta_chunks.MIN_TOKENS`` too: where the loop gives way is the question.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load

from mlxd.worker.runners import delta_chunks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--tokens", default="1024,4096")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    model, _ = load(args.model)
    module = importlib.import_module(type(model).__module__)
    loop = module.gated_delta_update
    delta_chunks.install(model)
    delta_chunks.MIN_TOKENS = 1
    chunked = module.gated_delta_update
    print(f"device {mx.default_device()}, metal {mx.metal.is_available()}")
    for n in (int(t) for t in args.tokens.split(",")):
        prompt = mx.array([[(7 * i) % 1000 + 10 for i in range(n)]])
        times: dict[str, list[float]] = {"loop": [], "chunks": []}
        for r in range(args.rounds + 1):
            for name, fn in (("loop", loop), ("chunks", chunked)):
                module.gated_delta_update = fn
                t = _forward(model, prompt)
                if r:
                    times[name].append(t)
        ratio = statistics.median(times["loop"]) / statistics.median(times["chunks"])
        print(
            f"{n} tokens: loop {[f'{t:.3f}' for t in times['loop']]} s, "
            f"chunks {[f'{t:.3f}' for t in times['chunks']]} s, median ratio {ratio:.2f}x"
        )
    module.gated_delta_update = loop


def _forward(model: object, prompt: mx.array) -> float:
    cache = make_prompt_cache(model)
    t0 = time.perf_counter()
    mx.eval(model(prompt, cache=cache))  # type: ignore[operator]
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
