"""The command line of a spawned worker: ``python -m mlxd worker serve`` and the options that
carry this daemon's config (scheduler, cache, dtype, and the memory the budget reserved)."""

from __future__ import annotations

import os
import sys

from mlxd.config import ServeConfig
from mlxd.daemon.footprint import buffer_cache_bytes
from mlxd.daemon.worker_process import WorkerProcess


def worker_command(worker: WorkerProcess, config: ServeConfig, log_level: str) -> list[str]:
    """The full argv that starts ``worker``'s process (its reason file included)."""
    cmd = [sys.executable, "-m", "mlxd", "worker", "serve", *worker_args(worker, config, log_level)]
    if worker.reason_file is not None:
        cmd += ["--reason-file", str(worker.reason_file)]
    return cmd


def worker_args(worker: WorkerProcess, config: ServeConfig, log_level: str) -> list[str]:
    """The options after ``mlxd worker serve``: where to bind and how to run the model."""
    args = ["--model", worker.spec.path, "--name", worker.spec.name, "--bind", worker.endpoint,
            "--control", worker.control.endpoint, "--parent-pid", str(os.getpid()),
            "--log-level", log_level, *_scheduler_args(config)]  # fmt: skip
    if config.max_context:
        args += ["--max-context", str(config.max_context)]
    c = config.cache
    args += ["--kv-block-size", str(c.block_size), "--paged-kv" if c.paged else "--no-paged-kv"]
    budgets = (worker.spec.kv_cache_gb, config.kv_cache_gb, c.kv_cache_gb)
    kv_gb = next((gb for gb in budgets if gb is not None), None)  # the model's, then global
    if kv_gb is None and config.max_memory_bytes is not None:
        kv_gb = worker.size.kv_bytes / 2**30  # what the budget reserved: hold it to that
    if kv_gb is not None:
        args += ["--kv-cache-gb", str(kv_gb)]
    if config.max_memory_bytes is not None:  # hold the buffer cache to the reservation
        args += ["--buffer-cache-gb", str(buffer_cache_bytes(worker.size) / 2**30)]
    return [*args, "--dtype", worker.spec.dtype or config.dtype]


def _scheduler_args(config: ServeConfig) -> list[str]:
    s = config.scheduler
    return ["--max-num-seqs", str(s.max_num_seqs), "--max-queued", str(s.max_queued),
            "--prefill-chunk", str(s.prefill_chunk), "--stream-interval", str(s.stream_interval),
            "--priority-aging", str(s.aging_s)]  # fmt: skip
