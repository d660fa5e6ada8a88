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

Padding bounds the shapes, but not to the few warm-up can build: a long prompt's last chunk is
(1, its remainder's queries, the whole length's keys), and a chat turn over a cached history
is (1, the turn's queries, the history's keys), new for nearly every length. On an H200 a
first 4,500-token prompt spent a quarter of its samples building such a plan (a cuDNN engine
compiled by NVRTC, then its CUDA graph: run RP1). So once warm-up is done (``freeze``), a call
of a shape warm-up did not build, with at most ``PLAIN_SCORES`` attention scores, runs as plain
matmuls and a softmax (``plain_attention``): a matmul of a new shape costs cuBLAS a few ms of
heuristics where cuDNN took 45 ms to 1 s, and scores that few cost little memory. Larger new
shapes (a later full chunk of a longer prompt than warm-up's) still build their plan.

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
# A new shape's scores (rows x query heads x queries x keys) up to this many run as plain ops
# once warm-up is done: a 4,500-token prompt's last chunk on a 16-head model has 37M; a full
# 2,048-token chunk over 4,096 keys has 134M (its plan warm-up builds).
PLAIN_SCORES = 1 << 26

Key = tuple[Any, ...]  # what an attention plan is built for (``_key``)
_built: set[Key] = set()  # the shapes multi-query attention ran with before ``freeze``
_frozen = False


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


def freeze() -> None:
    """Warm-up is done: the shapes attention ran with so far have their plans; a later new shape
    with few scores runs as plain ops (module doc)."""
    global _frozen
    _frozen = True


def install() -> bool:
    """Route this process's ``mx.fast.scaled_dot_product_attention`` through
    ``padded_attention`` where attention plans are built per shape; whether it did (once)."""
    current = mx.fast.scaled_dot_product_attention
    if not BUCKETED or hasattr(current, "wrapped"):  # wrapped already
        return False
    mx.fast.scaled_dot_product_attention = padded_attention(current)
    return True


def uninstall() -> bool:
    """Undo ``install`` (a benchmark runs mlx-lm as it ships, then serves again); whether it
    was installed."""
    original = getattr(mx.fast.scaled_dot_product_attention, "wrapped", None)
    if original is None:
        return False
    mx.fast.scaled_dot_product_attention = original
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
        if n > 1 and _plain(_key(q, k, mask, count, rows, keys), args, kwargs):
            return plain_attention(q, k, v, kwargs["scale"], mask)
        if n == 1 or (count, rows, keys) == (b, n, m):
            return attend(q, k, v, *args, **kwargs)
        if lengths:
            per_row = mask.ndim == q.ndim and mask.shape[0] == b  # else broadcast over the rows
            kwargs["mask"] = _padded_mask(mask, rows, keys, count if per_row else 1)
        q, k, v = _pad(q, rows, count), _pad(k, keys, count), _pad(v, keys, count)
        return attend(q, k, v, *args, **kwargs)[:b, ..., :n, :]

    attention.wrapped = attend  # type: ignore[attr-defined]  # marks it, and undoes it
    return attention


def _key(q: mx.array, k: mx.array, mask: Any, rows: int, queries: int, keys: int) -> Key:
    """The plan a call of these (padded) rows and lengths needs: heads, widths, dtype, mask."""
    kind = (mask.dtype, mask.ndim) if isinstance(mask, mx.array) else mask
    return (rows, q.shape[1], k.shape[1], q.shape[-1], queries, keys, q.dtype, kind)


def _plain(key: Key, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a multi-query call runs as plain ops: after warm-up, a shape it did not build,
    with few scores, asked in the plain form (a scale and a mask; no sinks, no other option)."""
    if not _frozen:
        _built.add(key)
        return False
    rows, heads, queries, keys = key[0], key[1], key[4], key[5]
    if key in _built or rows * heads * queries * keys > PLAIN_SCORES:
        return False
    plain = {"scale", "mask", "sinks"}  # mlx-lm passes sinks=None where a model has none
    return not args and set(kwargs) <= plain and "scale" in kwargs and kwargs.get("sinks") is None


def plain_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any) -> mx.array:
    """``mx.fast.scaled_dot_product_attention`` as matmuls and a float32 softmax: q (B, Hq, L, D),
    k and v (B, Hk, S, D) with Hq a multiple of Hk; ``mask`` None, "causal" (the last query sees
    every key), a boolean array (True: seen) or an additive one, broadcast as the fast op's."""
    b, heads, n, d = q.shape
    groups = heads // k.shape[1]
    q = (q * scale).reshape(b, k.shape[1], groups, n, d)
    scores = (q @ mx.expand_dims(k, 2).swapaxes(-1, -2)).astype(mx.float32)  # (B, Hk, G, L, S)
    m = k.shape[-2]
    if isinstance(mask, str) and mask == "causal":
        mask = mx.arange(m)[None, :] <= mx.arange(n)[:, None] + (m - n)
    if isinstance(mask, mx.array):
        mask = _grouped(mask, k.shape[1], groups)
        hidden = mx.finfo(mx.float32).min  # finite: a query that sees no key (padding) stays so
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, hidden)
        else:
            scores = mx.maximum(scores + mask.astype(mx.float32), hidden)
    weights = mx.softmax(scores, axis=-1).astype(v.dtype)
    return (weights @ mx.expand_dims(v, 2)).reshape(b, heads, n, v.shape[-1])


def _grouped(mask: mx.array, kv_heads: int, groups: int) -> mx.array:
    """A mask broadcast like (..., Hq or 1, L, S) as (..., Hk or 1, G or 1, L, S)."""
    if mask.ndim < 3:
        return mask
    if mask.shape[-3] == kv_heads * groups and groups > 1:
        return mask.reshape(*mask.shape[:-3], kv_heads, groups, *mask.shape[-2:])
    return mx.expand_dims(mask, -3)


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
