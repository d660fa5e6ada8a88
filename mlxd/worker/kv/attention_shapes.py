"""The lengths a multi-query forward's attention is padded to, so that MLX's CUDA backend
reuses its attention plans.

On CUDA, MLX runs attention with more than one query through cuDNN, which builds a plan for
every new (batch, query length, key length): on an H100 a new shape cost 66-80 ms against
0.1-0.2 ms for one already built (`scripts/probe_attention_shapes.py` (removed; at commit
6e4ae59), docs/PERFORMANCE.md).
A prefill chunk after a prefix hit, and a verification window (a few queries per row over a
context that grows every step), would each pay a build; on CUDA verification runs as one
single-query row per input instead (``runners.paged.VIRTUAL_ROWS``), which builds none. Without
cuDNN (``MLX_CUDA_USE_CUDNN_SDPA=0``) no plan is built, but an 8k-token prefill then took 5x as
long, so the lengths are rounded up instead: queries to a power of two up to 16 (short chunks,
a verification window's 2-9 tokens) and to 4 lengths per octave above, keys to 4 block counts
per octave (at most 25 % more attention work). Padded queries and keys are masked, as a batch's
shorter rows already are.

The batch is part of a plan's key too (MLX's ``SDPACacheKey`` holds B with the lengths), and a
burst of requests reaches prefill split by their arrival: 16 streams from 8 client processes
came as forwards of 2, 2, 4 and 8 rows, then of 4 and 12 (the tiny dense model on the CPU,
2026-11-28). So a multi-query call's rows are padded to a power of two as well (``batch``),
the counts warm-up's decode stages prefill (``worker.warmup``), at the price of attention alone
on the padding rows. On an H200 each of 16 served streams of 128-token prompts waited 108-284 ms
for its first token, against 28-58 ms for the same burst in-process (docs/PERFORMANCE.md, runs
MX1-MX3): the plans of new row counts are the candidate this removes.

Other backends build no plans, so there the lengths stay exact; ``BUCKETED`` says which applies
(tests set it to run the padded path on the CPU).

A forward whose rows cannot be padded (a hybrid's recurrent layers would fold padding into their
state: ``runners.hybrid`` prefills exact spans) reaches attention with exact queries, and with
exact keys where it starts a prompt (its own); ``install`` pads both inside the attention call
alone (``padded_attention``), so a prompt of a length not seen before builds no plan either. On an
H200 a one-row prefill of a new length took 423 ms against 220 ms for the same length again in
mlx-vlm's Qwen3.5 language model, and a Qwen3-0.6B's 52 ms against 8 ms (``bench/shape_cost.py``);
of each op only attention paid: 63 ms with a causal mask, 1.06 s with an array mask, where a
matmul paid 4 ms (``bench/op_shape_cost.py``, docs/PERFORMANCE.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx

PLANNED = bool(getattr(mx, "cuda", None) and mx.cuda.is_available())  # a plan per shape
BUCKETED = PLANNED


def queries(n: int) -> int:
    """The query window a forward of at most ``n`` new tokens per row uses."""
    return rounded(n) if BUCKETED else n


def rounded(n: int) -> int:
    """``n`` rounded up to a power of two up to 16, to 4 lengths per octave above (at most
    25 % more), whatever the backend."""
    if n <= 1:
        return n
    if n <= 16:
        return 1 << (n - 1).bit_length()
    return _round(n)


def batch(n: int) -> int:
    """The rows a multi-query attention call of ``n`` rows runs with: a power of two."""
    return 1 << (n - 1).bit_length() if BUCKETED and n > 1 else n


def key_blocks(n: int, multi_query: bool) -> int:
    """How many blocks each row reads when the longest table has ``n`` (single-query steps
    take any length without a plan)."""
    return _round(n) if BUCKETED and multi_query else n


def _round(n: int) -> int:
    step = 1 << max(0, n.bit_length() - 3)  # 4 steps per octave
    return -(-n // step) * step


def install() -> bool:
    """Route this process's ``mx.fast.scaled_dot_product_attention`` through
    ``padded_attention`` where attention plans are built per shape; whether it did (once)."""
    current = mx.fast.scaled_dot_product_attention
    if not BUCKETED or getattr(current, "pads_queries", False):
        return False
    mx.fast.scaled_dot_product_attention = padded_attention(current)
    return True


def padded_attention(attend: Callable[..., mx.array]) -> Callable[..., mx.array]:
    """``attend`` with a multi-query call's rows padded to a planned count (``batch``), and its
    queries and keys to planned lengths (``queries``) where it has an array mask, which says what
    each query sees: padding keys are zeros no query sees, padding queries and rows see every
    key (so their output is finite) and are cut off the output. One-query calls pass as they
    are."""

    def attention(q: mx.array, k: mx.array, v: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        mask = kwargs.get("mask")
        b, n, m = q.shape[0], q.shape[-2], k.shape[-2]
        lengths = isinstance(mask, mx.array)  # a mask to pad along: lengths too, else the rows
        count, rows, keys = batch(b), *((queries(n), queries(m)) if lengths else (n, m))
        if n == 1 or (count, rows, keys) == (b, n, m):
            return attend(q, k, v, *args, **kwargs)
        if lengths:
            per_row = mask.ndim == q.ndim and mask.shape[0] == b  # else broadcast over the rows
            kwargs["mask"] = _padded_mask(mask, rows, keys, count if per_row else 1)
        q, k, v = _pad(q, rows, count), _pad(k, keys, count), _pad(v, keys, count)
        return attend(q, k, v, *args, **kwargs)[:b, ..., :n, :]

    attention.pads_queries = True  # type: ignore[attr-defined]
    return attention


def _pad(x: mx.array, length: int, rows: int) -> mx.array:
    """``x`` (B, ..., L, D) with zeros up to ``length`` along L and ``rows`` along B."""
    grow, more = length - x.shape[-2], rows - x.shape[0]
    if not grow and not more:
        return x
    return mx.pad(x, [(0, more)] + [(0, 0)] * (x.ndim - 3) + [(0, grow), (0, 0)])


def _padded_mask(mask: mx.array, rows: int, keys: int, batch: int = 1) -> mx.array:
    """``mask`` (..., L or 1, K) with key columns up to ``keys`` that no row sees, then rows up
    to ``rows`` that see every key (a row broadcast over the queries stays one row), then (a
    mask of one per batch row) batch rows up to ``batch`` that see every key."""
    mask = _padded_lengths(mask, rows, keys)
    if batch <= mask.shape[0]:
        return mask
    shape = (batch - mask.shape[0], *mask.shape[1:])
    see = mx.ones(shape, mx.bool_) if mask.dtype == mx.bool_ else mx.zeros(shape, mask.dtype)
    return mx.concatenate([mask, see], axis=0)


def _padded_lengths(mask: mx.array, rows: int, keys: int) -> mx.array:
    boolean = mask.dtype == mx.bool_
    if keys > mask.shape[-1]:
        shape = (*mask.shape[:-1], keys - mask.shape[-1])
        hidden = mx.zeros(shape, mx.bool_) if boolean else mx.full(shape, -mx.inf, mask.dtype)
        mask = mx.concatenate([mask, hidden], axis=-1)
    if mask.shape[-2] == 1 or rows == mask.shape[-2]:
        return mask
    shape = (*mask.shape[:-2], rows - mask.shape[-2], keys)
    see = mx.ones(shape, mx.bool_) if boolean else mx.zeros(shape, mask.dtype)
    return mx.concatenate([mask, see], axis=-2)
