"""What compiling a whole one-row decode step would save: mlx-lm's ``generate_step`` against
the same model stepped through one ``mx.compile``d function over a fixed-shape KV cache, in
one process, alternated.

    python bench/compiled_step.py MODEL_DIR [--tokens 256] [--capacity 1024] [--rounds 3]

Why (issue 41): one MoE row steps in 15-25 ms on an H200 (run GS1) where its weights take a
fraction of a millisecond to read: the step is the host's, a few thousand operations built
in Python and launched one by one. Rapid-MLX compiles a one-row step over a shape-stable
slab (``rapid_mlx/compiled_decode.py``). Before mlxd builds that into its engine, this
measures the saving on the models that matter, with no engine around it.

The compiled step is a pure function: the last token, the position, and every layer's keys
and values (``--capacity`` slots each) in; the greedy token and the updated arrays out. Each
layer's cache writes its new K/V at the position (``mx.slice_update``) and masks the slots
past it, so every step has the same shapes and ``mx.compile`` traces once. Models whose
caches are all plain K/V (dense, MoE, MLA-free) only; others exit with a message.

Prints per leg and round the step p50/p95 (ms) and tok/s, whether the compiled tokens match
mlx-lm's greedy ones (and where they first part), and the compiled over mlx-lm ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx

from mlxd.bench.engine import load_served


class SlabCache:
    """One layer's K/V in ``capacity`` fixed slots, written at ``offset`` (an array)."""

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array) -> None:
        self.keys, self.values, self.offset = keys, values, offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        at = self.offset[None]
        self.keys = mx.slice_update(self.keys, keys, at, axes=(2,))
        self.values = mx.slice_update(self.values, values, at, axes=(2,))
        return self.keys, self.values

    def make_mask(
        self, n: int, return_array: bool = False, window_size: int | None = None
    ) -> mx.array:
        """Slots up to this step's position are seen; the rest are not yet written."""
        return mx.arange(self.keys.shape[2])[None] <= self.offset


def main() -> None:
    args = _parser().parse_args()
    model, _ = load_served(args.model)
    if not _plain_kv(model):
        sys.exit(f"{args.model}: its caches are not all plain K/V; this probe steps those only")
    prompt = [random.Random(0).randrange(100, 8000) for _ in range(args.prompt)]
    rows = []
    for r in range(args.rounds):
        order = ("mlx-lm", "compiled") if r % 2 == 0 else ("compiled", "mlx-lm")
        for leg in order:
            tokens, times = LEGS[leg](model, prompt, args)
            rows.append({"round": r + 1, "leg": leg, "tokens": tokens, **_summary(times)})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "tokens"}), flush=True)
    _report(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    p.add_argument("--tokens", type=int, default=256, help="tokens decoded a leg")
    p.add_argument("--capacity", type=int, default=1024, help="K/V slots a layer")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default="")
    return p


def _plain_kv(model: Any) -> bool:
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    return all(type(c) is KVCache for c in make_prompt_cache(model))


def mlx_lm_leg(
    model: Any, prompt: list[int], args: argparse.Namespace
) -> tuple[list[int], list[float]]:
    """mlx-lm's generate_step, greedy: its tokens and the time from one token to the next."""
    from mlx_lm.generate import generate_step

    steps = generate_step(mx.array(prompt), model, max_tokens=args.tokens)
    return _timed((int(token) for token, _ in steps))


def compiled_leg(
    model: Any, prompt: list[int], args: argparse.Namespace
) -> tuple[list[int], list[float]]:
    """The prompt through mlx-lm's cache, its K/V copied into slabs, then the compiled step."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array(prompt)[None], cache=cache)
    token = mx.argmax(logits[0, -1]).reshape(1)
    kv = [part for c in cache for part in _slab(c, args.capacity)]
    step = mx.compile(_step_function(model, len(cache)))
    offset = mx.array(len(prompt), dtype=mx.int32)

    def tokens() -> Iterator[int]:
        nonlocal token, offset, kv
        for _ in range(args.tokens):
            if int(offset) >= args.capacity:
                raise SystemExit(
                    f"--capacity {args.capacity} is too small for the prompt and --tokens"
                )
            out = step(token, offset, *kv)
            mx.async_eval(out)
            yield int(token.item())
            token, offset, kv = out[0], out[1], list(out[2:])

    return _timed(tokens())


def _slab(cache: Any, capacity: int) -> tuple[mx.array, mx.array]:
    """A prefilled cache's keys and values in ``capacity`` slots (zeros past its tokens)."""
    n = cache.offset
    keys, values = cache.keys[..., :n, :], cache.values[..., :n, :]
    pad = [(0, 0), (0, 0), (0, capacity - n), (0, 0)]
    return mx.pad(keys, pad), mx.pad(values, pad)


def _step_function(model: Any, layers: int) -> Callable[..., list[mx.array]]:
    def step(token: mx.array, offset: mx.array, *kv: mx.array) -> list[mx.array]:
        caches = [SlabCache(kv[2 * i], kv[2 * i + 1], offset) for i in range(layers)]
        logits = model(token[None], cache=caches)
        nxt = mx.argmax(logits[0, -1]).reshape(1)
        return [nxt, offset + 1, *(a for c in caches for a in (c.keys, c.values))]

    return step


def _timed(tokens: Iterator[int]) -> tuple[list[int], list[float]]:
    """Drain ``tokens``: the tokens and the ms between consecutive ones."""
    out, times, last = [], [], None
    for token in tokens:
        now = time.perf_counter()
        if last is not None:
            times.append((now - last) * 1e3)
        out.append(token)
        last = now
    return out, times


def _summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    p50 = statistics.median(ordered)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return {
        "step_p50_ms": round(p50, 3),
        "step_p95_ms": round(p95, 3),
        "tok_s": round(1e3 / p50, 1),
    }


def _report(rows: list[dict[str, Any]]) -> None:
    """Medians per leg, the compiled leg's speed over mlx-lm's, and whether the tokens agree."""
    p50 = {
        leg: statistics.median(r["step_p50_ms"] for r in rows if r["leg"] == leg) for leg in LEGS
    }
    print(
        f"step p50 median: mlx-lm {p50['mlx-lm']:.3f} ms, compiled {p50['compiled']:.3f} ms, "
        f"compiled is {p50['mlx-lm'] / p50['compiled']:.2f}x as fast"
    )
    ref = next(r["tokens"] for r in rows if r["leg"] == "mlx-lm")
    got = next(r["tokens"] for r in rows if r["leg"] == "compiled")
    same = next((i for i, (a, b) in enumerate(zip(ref, got, strict=False)) if a != b), None)
    print("greedy tokens: " + ("the same" if same is None else f"part at token {same}"))


LEGS: dict[str, Callable[..., tuple[list[int], list[float]]]] = {
    "mlx-lm": mlx_lm_leg,
    "compiled": compiled_leg,
}

if __name__ == "__main__":
    main()
