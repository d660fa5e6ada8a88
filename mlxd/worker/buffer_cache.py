"""MLX's cache of freed buffers in a worker: held to a cap, and emptied when stale buffers fill it.

A worker caps the cache (``footprint.buffer_cache_bytes``): left to MLX's own limit on a GPU (95 %
of its memory) a worker kept every freed buffer until it held the whole card (run S1). But MLX
keeps a freed buffer only while its cache is under the limit, reuses a cached buffer only for a
request of more than half its size, and lets cached buffers go only under memory pressure or by
as much as one freed buffer took the cache over its limit (``BufferCache`` and the CUDA and Metal
allocators of MLX 0.32; the CPU's never). So a cache filled to its cap with buffers of sizes a
decode step never asks for (loading's temporaries, warm-up's and a long prompt's chunk-sized
activations, decode's outgrown views) stays full: of the buffers a step frees at its end, one is
cached and the rest go back to the device, and every one the next step asks for but that one is
a new allocation: on CUDA a ``cudaMallocAsync`` and a ``cudaFreeAsync`` for each of the step's
thousands of arrays. That is a hypothesis which fits what was measured, not measured itself: on
an H200 a MoE's one-row step took 21.5 ms in-process with the cache capped at 1 GiB, both rounds,
against 14.6-15.1 ms left to MLX's limit, and a served worker's was 15.5 ms after one start and
23.6 after another (docs/PERFORMANCE.md, run MX6).

So the engine looks at the cache once a step (``CacheSweep.tick``) and empties it when it is
nearly full (``FULL`` of the limit), at most once every ``MIN_STEPS`` steps: the next step
allocates afresh once and its buffers are cached from then on. A cap smaller than one step's
buffers would keep the cache full whatever is emptied; the pause bounds the emptying to one in
``MIN_STEPS`` steps there.
"""

from __future__ import annotations

import logging

import mlx.core as mx

log = logging.getLogger("mlxd.worker")

FULL = 0.9  # of the limit: a cache at least this full is emptied
MIN_STEPS = 64  # engine steps from one emptying to the next, at least


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


class CacheSweep:
    """Empties MLX's buffer cache when it is nearly full; the engine ticks it once a step.

    Args:
        limit: the cache's limit in bytes (default: the one in force when built).
        min_steps: steps from one emptying to the next, at least.
    """

    def __init__(self, limit: int | None = None, min_steps: int = MIN_STEPS) -> None:
        self.limit = limit_in_force() if limit is None else limit
        self.min_steps = min_steps
        self.since = min_steps  # steps since the last emptying: the first may come at once
        self.sweeps = 0

    def tick(self) -> bool:
        """After a step: empty the cache if it is full and the last emptying is far enough
        back; whether it did."""
        self.since += 1
        if self.since < self.min_steps or mx.get_cache_memory() < FULL * self.limit:
            return False
        if not self.sweeps:
            log.info("MLX's buffer cache filled its %d MiB: emptied", self.limit >> 20)
        mx.clear_cache()
        self.since, self.sweeps = 0, self.sweeps + 1
        return True
