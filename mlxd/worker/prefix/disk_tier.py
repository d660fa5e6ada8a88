"""Between the paged pool and the disk cache: blocks out of the pool into files and back (and,
for a runner on the model's own caches, its snapshots' disk tier: ``snapshot_disk``).

The prefix cache (``radix_cache``) calls ``save`` with the blocks it evicts, before anyone may
reuse them, and ``load`` with free blocks to fill on a match. Both first settle the runner
(``PagedModelRunner.settle``: the step in flight done, decode's unflushed tokens written), so a
saved block holds its final tokens and nothing pending overwrites a loaded one. A block is
stored as raw bytes per layer (K then V), whatever the pool's dtype (bfloat16 has no NumPy
type); its shape comes from the pool on the way back.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from mlxd.config import WorkerConfig, data_dir
from mlxd.worker import cpu_backend
from mlxd.worker.kv.formats import parts
from mlxd.worker.prefix.disk_cache import DiskKVCache, model_identity
from mlxd.worker.prefix.radix_cache import TierBlock

if TYPE_CHECKING:
    from mlxd.worker.runners.base import ModelRunner
    from mlxd.worker.runners.paged import PagedModelRunner
    from mlxd.worker.sched.scheduler import Scheduler

log = logging.getLogger(__name__)


class DiskTier:
    """The ``radix_cache.Tier`` of a paged worker with ``--kv-disk-gb``."""

    def __init__(self, disk: DiskKVCache, runner: PagedModelRunner) -> None:
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


def attach(config: WorkerConfig, scheduler: Scheduler, runner: ModelRunner) -> DiskTier | None:
    """The disk tier under ``$MLXD_HOME/kv-cache/<model identity>`` when ``--kv-disk-gb`` asks
    for one and the runner is paged; set as the prefix cache's tier."""
    from mlxd.worker.runners.paged import PagedModelRunner

    gb = config.cache.kv_disk_gb
    if gb and _attach_snapshots(config, runner, int(gb * 2**30)):
        return None
    if not gb or scheduler.radix is None or not isinstance(runner, PagedModelRunner):
        if gb:
            log.warning("--kv-disk-gb needs a prefix cache (paged or snapshots); no disk tier")
        return None
    if scheduler.radix.state_budget is not None or scheduler.radix.slabs is not None:
        log.warning(
            "--kv-disk-gb keeps K/V blocks, not a hybrid's recurrent state nor a "
            "window model's window slabs; no disk tier"
        )
        return None
    pool = runner.pool
    k, v = parts(pool.keys[0])[0], parts(pool.values[0])[-1]  # float dtype last
    layout = (f"{len(pool.keys)} layers K{k.shape[1:]} V{v.shape[1:]} {v.dtype} "
              f"block {pool.block_size}")  # fmt: skip
    if pool.fmt.quantized:  # another format's blocks are foreign
        layout += f" {pool.fmt.bits}-bit groups of {pool.fmt.group_size}"
    model_id = model_identity(_model_dir(config), layout)
    disk = DiskKVCache(data_dir() / "kv-cache" / model_id, model_id, int(gb * 2**30))
    tier = DiskTier(disk, runner)
    scheduler.radix.tier = tier
    log.info("KV disk cache: %s, %d blocks (%.1f of %.1f GiB)", disk.files.root, len(disk),
             disk.nbytes / 2**30, gb)  # fmt: skip
    return tier


def _attach_snapshots(config: WorkerConfig, runner: ModelRunner, cap_bytes: int) -> bool:
    """A runner on the model's own caches with snapshots: their disk tier, under the same
    directory scheme (``snapshot_disk``). False for any other runner."""
    from mlx_lm.models.cache import make_prompt_cache

    from mlxd.worker.prefix.snapshot_disk import DiskSnapshots

    snapshots = getattr(runner, "snapshots", None)
    if snapshots is None:
        return False
    model = runner.model  # type: ignore[attr-defined]
    kinds = ",".join(type(c).__name__ for c in make_prompt_cache(model))
    dtype = cpu_backend.float_dtype(model)  # the compute dtype the snapshots are in
    model_id = model_identity(_model_dir(config), f"snapshots {kinds} {dtype}")
    snapshots.disk = DiskSnapshots(data_dir() / "kv-cache" / model_id, model_id, cap_bytes)
    log.info("KV disk cache: %s, %d snapshots (%.1f of %.1f GiB)", snapshots.disk.files.root,
             len(snapshots.disk), snapshots.disk.nbytes / 2**30, cap_bytes / 2**30)  # fmt: skip
    return True


def save_snapshots(runner: ModelRunner) -> None:
    """At the worker's end: its snapshots in memory to the disk tier, so a restart hits them."""
    snapshots = getattr(runner, "snapshots", None)
    if snapshots is not None and snapshots.disk is not None:
        log.info("KV disk cache: saving %d snapshots", snapshots.clear())


def _model_dir(config: WorkerConfig) -> Path:
    """The local directory the model loaded from (a repo id: its Hugging Face snapshot)."""
    from mlxd.models import sources

    path = Path(sources.resolve(config.model, config.dtype))
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(path), local_files_only=True))
