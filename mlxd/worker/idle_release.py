"""Giving KV memory back when a worker has been idle for a while (``--kv-idle-s``).

On a laptop the GPU shares memory with everything else the user runs, so a worker that served a
burst of long requests should not keep the burst's KV. After ``after_s`` seconds without work,
the prefix-cache blocks beyond the pool's first chunk are evicted (the first chunk's stay, so a
warm system prompt survives), the pool's arrays shrink to the chunks still in use, and MLX's
cache of freed buffers is emptied (``mx.clear_cache``): an idle worker holds its weights and
about one chunk of KV. The next request grows the pool again, one chunk or more at a time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlxd.worker.runners.base import ModelRunner
    from mlxd.worker.sched.scheduler import Scheduler

log = logging.getLogger(__name__)


class IdleRelease:
    """A timer the engine ticks: ``busy`` on each step, ``idle`` on each idle loop turn.

    Args:
        after_s: idle seconds before memory is given back (0: never).
        clock: seconds, monotonic.
    """

    def __init__(self, after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.after_s = after_s
        self.clock = clock
        self.num_releases = 0
        self._since: float | None = None  # when the worker last became idle
        self._released = False  # once per idle period

    def busy(self) -> None:
        self._since, self._released = None, False

    def idle(self, runner: ModelRunner, scheduler: Scheduler) -> bool:
        """Release if the worker has been idle long enough; returns whether it did now."""
        if self.after_s <= 0 or scheduler.has_work() or runner.rows:
            return False  # paused with work is not idle: its rows keep their blocks
        now = self.clock()
        if self._since is None:
            self._since = now
        if self._released or now - self._since < self.after_s:
            return False
        self._released = True
        self.num_releases += 1
        release(runner, scheduler)
        return True


def release(runner: ModelRunner, scheduler: Scheduler) -> None:
    """Evict the prefix cache beyond the pool's first chunk, shrink the pool, free MLX's
    buffer cache (nothing may be in flight)."""
    before = runner.kv_reserved_bytes
    highest, evicted = -1, 0
    kv_pool = getattr(runner, "pool", None)  # the paged runner's arrays
    if scheduler.pool is not None and kv_pool is not None:
        if scheduler.radix is not None:
            evicted = scheduler.radix.evict_from(kv_pool.chunk_blocks)
            windows = getattr(runner, "windows", None)  # a window model's slab arrays
            if scheduler.windows is not None and windows is not None:
                scheduler.radix.drop_slabs_from(windows.chunk_blocks)
        highest = scheduler.pool.highest_used()
    runner.release_memory(highest)
    _trim_heap()
    log.info(
        "idle: KV memory %d -> %d bytes (%d prefix-cache blocks evicted)",
        before,
        runner.kv_reserved_bytes,
        evicted,
    )


def _trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc): MLX's CPU backend allocates
    with malloc, and freed buffers otherwise stay in the process's RSS."""
    if not sys.platform.startswith("linux"):
        return
    name = ctypes.util.find_library("c")
    if name is None:
        return
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim(0)
