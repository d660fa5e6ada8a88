"""Between the paged pool and the disk cache: blocks out of the pool into files and back. (A
runner on the model's own caches has its snapshots' disk tier instead, ``snapshot_disk``;
``worker/build.py`` attaches one or the other.)

The prefix cache (``radix_cache``) calls ``save`` with the blocks it evicts, before anyone may
reuse them, and ``load`` with free blocks to fill on a match. Both first settle the runner
(``PagedModelRunner.settle``: the step in flight done, decode's unflushed tokens written), so a
saved block holds its final tokens and nothing pending overwrites a loaded one. A block is
stored as raw bytes per layer (K then V), whatever the pool's dtype (bfloat16 has no NumPy
type); its shape comes from the pool on the way back.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import mlx.core as mx
import numpy as np

from mlxd.worker.prefix.disk_cache import DiskKVCache
from mlxd.worker.prefix.radix_cache import TierBlock

if TYPE_CHECKING:
    from mlxd.worker.kv.paged_cache import KVPool

log = logging.getLogger(__name__)


class PagedRunner(Protocol):
    """What the tier needs of the paged runner (``runners.paged``): its pool, and a way to
    finish what is in flight before a copy."""

    pool: KVPool

    def settle(self) -> None: ...


class DiskTier:
    """The ``radix_cache.Tier`` of a paged worker with ``--kv-disk-gb`` (``build`` attaches
    it)."""

    def __init__(self, disk: DiskKVCache, runner: PagedRunner) -> None:
        self.disk = disk
        self.runner = runner
        self.num_saved = 0
        self.num_loaded = 0

    def has(self, digest: bytes) -> bool:
        return digest in self.disk

    def save(self, blocks: list[TierBlock]) -> None:
        todo = [b for b in blocks if b[0] not in self.disk]
        if not todo:
            return
        self.runner.settle()
        pool, bs = self.runner.pool, self.runner.pool.block_size
        arrays = pool.arrays
        for digest, parent, tokens, block_id in todo:
            s = block_id * bs
            parts = [a[s : s + bs] for a in arrays]
            raw = [np.array(p.reshape(-1).view(mx.uint8)) for p in parts]
            if self.disk.save(digest, parent, tokens, raw):
                self.num_saved += 1

    def load(self, blocks: list[TierBlock]) -> int:
        """Read the blocks in order into the pool; stops at the first one missing or bad."""
        read: list[list[np.ndarray]] = []
        for digest, parent, tokens, _ in blocks:
            arrays = self.disk.load(digest, parent, tokens)
            if arrays is None or not self._fits(arrays):
                break
            read.append(arrays)
        if not read:
            return 0
        self.runner.settle()
        pool, bs = self.runner.pool, self.runner.pool.block_size
        pool.ensure(max(b[3] for b in blocks[: len(read)]))
        targets = pool.arrays
        for (_, _, _, block_id), arrays in zip(blocks, read, strict=False):
            s = block_id * bs
            for i, raw in enumerate(arrays):
                layer = targets[i]
                block = mx.array(raw).view(layer.dtype).reshape(bs, *layer.shape[1:])
                layer[s : s + bs] = block  # in place: the pool's lists hold these arrays
        mx.eval(targets)
        self.num_loaded += len(read)
        return len(read)

    def _fits(self, arrays: list[np.ndarray]) -> bool:
        """The file's arrays are as many and as large as one block of this pool."""
        pool = self.runner.pool
        layers = pool.arrays
        want = [pool.block_size * a[0].nbytes for a in layers]
        ok = len(arrays) == len(layers) and [a.nbytes for a in arrays] == want
        if not ok:
            log.warning("KV disk cache: a block file does not fit this pool's layout; skipped")
        return ok
