"""One row of a MoE through mlx-lm's ``generate_step`` with its experts' gate and up projections
fused (``runners.fused_experts``) and as mlx-lm made them, alternated in one process: the step's
median per round, and whether both chose the same greedy tokens.

    python bench/fused_experts.py MODEL [--rounds 4] [--tokens 64] [--prompt-tokens 1]

A one-token prompt keeps the prefill on the kernels one row decodes with (on CUDA a longer one
first compiles MLX's ``qmm_sm80`` kernels with NVRTC, 30-95 s each on an H200: run WT1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

from mlxd.worker.runners import fused_experts


def steps(model: object, prompt: mx.array, tokens: int) -> tuple[float, list[int]]:
    """The median step (ms, the first four left out) and the greedy tokens."""
    times, out, last = [], [], time.perf_counter()
    for token, _ in generate_step(prompt, model, max_tokens=tokens):
        now = time.perf_counter()
        times.append(now - last)
        out.append(int(token))
        last = now
    return statistics.median(times[4:]) * 1000, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=1)
    args = ap.parse_args()
    model, _ = load(args.model)
    prompt = mx.array(list(range(10, 10 + args.prompt_tokens)))
    steps(model, prompt, 16)  # kernels built before anything is timed
    ms: dict[str, list[float]] = {"mlx-lm": [], "fused": []}
    tokens: dict[str, list[int]] = {}
    for r in range(args.rounds):
        for name in ("mlx-lm", "fused") if r % 2 == 0 else ("fused", "mlx-lm"):
            done = fused_experts.fuse(model) if name == "fused" else []
            steps(model, prompt, 8)
            step, tokens[name] = steps(model, prompt, args.tokens)
            ms[name].append(round(step, 3))
            fused_experts.restore(done)
            print(
                json.dumps({"round": r + 1, "variant": name, "step_ms": ms[name][-1]}), flush=True
            )
    medians = {k: statistics.median(v) for k, v in ms.items()}
    print(
        json.dumps(
            {
                "step_ms": ms,
                "fused_over_mlx_lm": round(medians["fused"] / medians["mlx-lm"], 3),
                "same_tokens": tokens["fused"] == tokens["mlx-lm"],
            }
        )
    )


if __name__ == "__main__":
    main()
