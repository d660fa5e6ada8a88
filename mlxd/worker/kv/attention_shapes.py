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
"""

from __future__ import annotations

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
