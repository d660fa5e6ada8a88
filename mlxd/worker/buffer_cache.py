"""MLX's cache of freed buffers in a worker, held to a cap.

A worker caps the cache (``footprint.buffer_cache_bytes``): left to MLX's own limit on a GPU (95 %
of its memory) a worker kept every freed buffer until it held the whole card (run S1). MLX keeps
a freed buffer only while its cache is under the limit and lets cached ones go only under
memory pressure, so a cache that loading or a long prompt filled stays full. Emptying a full
cache made no difference to a MoE's one-row step on an H200 (run GS1: 22.6 ms at the median
with the engine emptying it, 22.4 without, under a 1 GiB cap after a 4,096-token prompt), so the
engine leaves it to MLX.
"""

from __future__ import annotations

import mlx.core as mx


def cap(limit: int) -> int:
    """Hold MLX's cache of freed buffers to ``limit`` bytes, a cap that never raises MLX's own
    limit (32 MiB on the CPU backend); the limit in force (``mlxd bench engine`` sets it too)."""
    default = mx.set_cache_limit(limit)
    if default < limit:
        mx.set_cache_limit(default)
    return min(default, limit)


def limit_in_force() -> int:
    """MLX's cache limit now, read by setting it and putting it back (MLX has no getter)."""
    limit = mx.set_cache_limit(0)
    mx.set_cache_limit(limit)
    return limit
