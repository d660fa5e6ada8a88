"""What compiling a whole one-row decode step would save: mlx-lm's ``generate_step`` against
the same model stepped through one ``mx.compile``d function over a fixed-shape KV cache, in
one process, alternated.

    python bench/compiled_step.py MODEL_DIR [--tokens 256] [--capacity 1024] [--rounds 3]

Why (issue 41): one MoE row steps in 15-25 ms on an H200 (run GS1) where its weights take a
fraction of a millisecond to read: the step is the host's, a few thousand operations built
in Python and launched one by one. Rapid-MLX compiles a one-row step over a shape-stable
slab (``rapid_mlx/compiled_decode.py``). Before mlxd builds that into its engine, this
measures the saving on the models that matter, with no engine around it.

The compiled step is a pure function: the last token, the position, and every layer's cache
arrays in; the greedy token and the updated arrays out. A full-attention layer's keys and values
take ``--capacity`` slots, written at the position (``mx.slice_update``) and masked past it; a
sliding-window layer's take a ring of its window's slots, written at the position modulo the
window; a recurrent layer's state (a hybrid's conv and delta states) passes through as it is.
Every step has the same shapes, so ``mx.compile`` traces once. Caches of other kinds (quantized,
MLA's, a window with kept tokens) exit with a message.
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
from mlxd.bench.stats import percentile


class SlabCache:
    """A full-attention layer's K/V in fixed slots, written at ``offset`` (an array)."""

    def __init__(self, keys: mx.array, values: mx.array, *, offset: mx.array) -> None:
        self.keys, self.values, self.offset = keys, values, offset

    def slot(self) -> mx.array:
        return self.offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        at = self.slot()[None]
        self.keys = mx.slice_update(self.keys, keys, at, axes=(2,))
        self.values = mx.slice_update(self.values, values, at, axes=(2,))
        return self.keys, self.values

    def make_mask(self, n: int, return_array: bool = False, window_size: Any = None) -> mx.array:
        """Slots up to this step's position are seen; the rest are not yet written."""
        return mx.arange(self.keys.shape[2])[None] <= self.offset

    def arrays(self) -> list[mx.array]:
        return [self.keys, self.values]


class RingCache(SlabCache):
    """A sliding-window layer's K/V in a ring of its window's slots: position p in slot
    p mod window, so the ring holds the window's last tokens."""

    def slot(self) -> mx.array:
        return self.offset % self.keys.shape[2]

    def make_mask(self, n: int, return_array: bool = False, window_size: Any = None) -> mx.array:
        """A slot is seen once written: the position it holds now is not negative."""
        slots = mx.arange(self.keys.shape[2])
        return (self.offset - (self.offset - slots) % self.keys.shape[2] >= 0)[None]


class StateCache:
    """A recurrent layer's state arrays, read and replaced by the model as mlx-lm's
    ``ArraysCache`` is."""

    def __init__(self, *state: mx.array, offset: mx.array) -> None:
        self.cache = list(state)  # a state has no position: ``offset`` is not kept
        self.left_padding = self.lengths = None

    def __getitem__(self, i: int) -> mx.array:
        return self.cache[i]

    def __setitem__(self, i: int, value: mx.array) -> None:
        self.cache[i] = value

    def make_mask(self, n: int) -> None:
        return None

    def advance(self, n: int) -> None:
        pass

    def arrays(self) -> list[mx.array]:
        return self.cache


KINDS = {"kv": SlabCache, "ring": RingCache, "state": StateCache}


def main() -> None:
    args = _parser().parse_args()
    model, _ = load_served(args.model)
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
    layout = [_slab(c, args.capacity) for c in cache]
    kinds = [(kind, len(parts)) for kind, parts in layout]
    state = [a for _, parts in layout for a in parts]
    step = mx.compile(_step_function(model, kinds))
    offset = mx.array(len(prompt), dtype=mx.int32)
    if "kv" in dict(kinds) and len(prompt) + args.tokens > args.capacity:
        sys.exit(f"--capacity {args.capacity} is too small for the prompt and --tokens")

    def tokens() -> Iterator[int]:
        nonlocal token, offset, state
        for _ in range(args.tokens):
            out = step(token, offset, *state)
            mx.async_eval(out)  # launched before the last token is read, as generate_step does
            yield int(token.item())
            token, offset, state = out[0], out[1], list(out[2:])

    return _timed(tokens())


def _slab(cache: Any, capacity: int) -> tuple[str, list[mx.array]]:
    """A prefilled mlx-lm cache as its compiled step's kind and arrays: K/V in ``capacity``
    slots, a window's last tokens in its ring, a recurrent state as it is."""
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    n = cache.offset if hasattr(cache, "offset") else 0
    if type(cache) is KVCache:
        return "kv", [_padded(a[..., :n, :], capacity) for a in (cache.keys, cache.values)]
    if type(cache) is RotatingKVCache and not cache.keep and cache.keys.shape[2] == n:
        window = cache.max_size  # one prefill: every position in order (``_update_concat``)
        slots = mx.array([p % window for p in range(max(0, n - window), n)])
        return "ring", [
            _ring(a[..., max(0, n - window) :, :], slots, window)
            for a in (cache.keys, cache.values)
        ]
    if type(cache) is ArraysCache and all(a is not None for a in cache.cache):
        return "state", list(cache.cache)
    sys.exit(f"a {type(cache).__name__} layer: this probe steps plain K/V, windows and states")


def _padded(a: mx.array, capacity: int) -> mx.array:
    return mx.pad(a, [(0, 0), (0, 0), (0, capacity - a.shape[2]), (0, 0)])


def _ring(a: mx.array, slots: mx.array, window: int) -> mx.array:
    ring = mx.zeros((*a.shape[:2], window, a.shape[3]), a.dtype)
    ring[:, :, slots] = a
    return ring


def _step_function(model: Any, kinds: list[tuple[str, int]]) -> Callable[..., list[mx.array]]:
    def step(token: mx.array, offset: mx.array, *arrays: mx.array) -> list[mx.array]:
        caches, at = [], 0
        for kind, count in kinds:
            parts = arrays[at : at + count]
            caches.append(KINDS[kind](*parts, offset=offset))
            at += count
        logits = model(token[None], cache=caches)
        nxt = mx.argmax(logits[0, -1]).reshape(1)
        return [nxt, offset + 1, *(a for c in caches for a in c.arrays())]

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
    p50, p95 = percentile(times, 50), percentile(times, 95)
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
