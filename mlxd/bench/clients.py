"""Load from several client processes at once.

One Python process spends about 1-3 ms of CPU to send a streamed request and read its first
chunk (httpx, one event loop). At 64 streams that staggers the requests by 100-200 ms and adds it
to every TTFT: the load generator, not the server, sets the number. Real clients are separate
processes; ``ClientPool`` splits a level's sessions over ``procs`` of them, each running
``run_sessions`` on its share of the sessions and of the concurrency, all started at one instant.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from mlxd.bench.http import Target, run_sessions
from mlxd.bench.stats import RequestTiming
from mlxd.bench.workload import Session

START_DELAY_S = 0.25  # every shard gets its work before this, then all start together

_progress: Any = None  # in a client process: where finished requests are reported


class ClientPool:
    """``procs`` client processes, started once and reused by every level.

    Args:
        procs: processes; with 1 every level runs in this process.
    """

    def __init__(self, procs: int) -> None:
        self.procs = max(1, procs)
        self._pool: ProcessPoolExecutor | None = None
        if self.procs > 1:
            ctx = mp.get_context("spawn")
            self._progress = ctx.Queue()
            self._pool = ProcessPoolExecutor(
                self.procs, mp_context=ctx, initializer=_init, initargs=(self._progress,)
            )
            # Start them now: a process that is still importing would start its shard late.
            for f in [self._pool.submit(time.sleep, 0.2) for _ in range(self.procs)]:
                f.result()

    def run(
        self,
        target: Target,
        concurrency: int,
        sessions: list[Session],
        on_done: Callable[[RequestTiming], None] | None = None,
    ) -> list[RequestTiming]:
        """``run_sessions`` of ``sessions``, ``concurrency`` at a time, over the processes."""
        n = min(self.procs, concurrency, len(sessions))
        if self._pool is None or n <= 1:
            return asyncio.run(run_sessions(target, concurrency, sessions, on_done))
        start_at = time.time() + START_DELAY_S
        futures = [
            self._pool.submit(_shard, target, _share(concurrency, n, i), sessions[i::n], start_at)
            for i in range(n)
        ]
        self._relay(futures, on_done)
        return [t for f in futures for t in f.result()]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Internal helpers

    def _relay(
        self,
        futures: list[Future[list[RequestTiming]]],
        on_done: Callable[[RequestTiming], None] | None,
    ) -> None:
        """Pass the shards' finished requests to ``on_done`` (progress) until all are done."""
        finished = False
        while True:
            try:
                timing = self._progress.get(timeout=0.05)
            except queue.Empty:
                if finished:
                    return  # a last look after the shards ended: their reports are in
                finished = all(f.done() for f in futures)
                continue
            if on_done is not None:
                on_done(timing)


def auto_client_procs() -> int:
    """One client process per 4 CPUs, at most 8: the server keeps the rest."""
    return max(1, min(8, (os.cpu_count() or 1) // 4))


def _share(total: int, parts: int, i: int) -> int:
    return total // parts + (1 if i < total % parts else 0)


def _init(progress: Any) -> None:
    global _progress
    _progress = progress


def _shard(
    target: Target, concurrency: int, sessions: list[Session], start_at: float
) -> list[RequestTiming]:
    time.sleep(max(0.0, start_at - time.time()))
    return asyncio.run(run_sessions(target, concurrency, sessions, _progress.put))
