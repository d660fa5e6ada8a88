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

Other backends build no plans, so there the lengths stay exact; ``BUCKETED`` says which applies
(tests set it to run the padded path on the CPU).

A forward whose rows cannot be padded (a hybrid's recurrent layers would fold padding into their
state: ``runners.hybrid`` prefills exact spans) still reaches attention with the bucketed keys of
its ``PagedStep``; ``install`` pads its queries there, inside the attention call alone
(``padded_attention``), so that a prompt of a length not seen before builds no plan either. On an
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
    if not BUCKETED or n <= 1:
        return n
    if n <= 16:
        return 1 << (n - 1).bit_length()
    return _round(n)


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
    """``attend`` with a multi-query call's queries padded to ``queries(n)`` rows where it
    has an array mask, which gives each row its keys: the padding rows see every key (so
    their output is finite) and are cut off the output. Other calls pass as they are."""

    def attention(q: mx.array, k: mx.array, v: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        mask = kwargs.get("mask")
        n = q.shape[-2]
        width = queries(n)
        if width == n or not isinstance(mask, mx.array):
            return attend(q, k, v, *args, **kwargs)
        grow = [(0, 0)] * (q.ndim - 2) + [(0, width - n), (0, 0)]
        kwargs["mask"] = _padded_mask(mask, width)
        return attend(mx.pad(q, grow), k, v, *args, **kwargs)[..., :n, :]

    attention.pads_queries = True  # type: ignore[attr-defined]
    return attention


def _padded_mask(mask: mx.array, width: int) -> mx.array:
    """``mask`` with rows up to ``width`` that see every key (a row broadcast over the
    queries stays one row)."""
    n = mask.shape[-2]
    if n == 1:
        return mask
    shape = (*mask.shape[:-2], width - n, mask.shape[-1])
    see = mx.ones(shape, dtype=mx.bool_) if mask.dtype == mx.bool_ else mx.zeros(shape, mask.dtype)
    return mx.concatenate([mask, see], axis=-2)
