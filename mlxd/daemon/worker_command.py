"""The command line of a spawned worker: ``python -m mlxd worker serve --config-json ...``,
its whole ``WorkerConfig`` (this daemon's knobs, its endpoints and the memory the budget
reserved) as one typed value, not an option per knob."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping

from mlxd import gpus
from mlxd.config import ServeConfig, WorkerConfig
from mlxd.daemon.footprint import buffer_cache_bytes, config_of, device_share, kv_cache_gb
from mlxd.daemon.worker_process import WorkerProcess
from mlxd.models.kv_layout import has_state

# MLX's CUDA graphs, off in a hybrid's worker (layers with recurrent state): on one H200 the
# Qwen3.5-0.8B shape's first 4,500-token prompt after a start took 667-725 ms without them
# against 1,182-1,626 with, its lone stream 89-114 tok/s against 62-98, and 16 and 64 streams
# within the noise (three starts of each, alternated: docs/PERFORMANCE.md, run GO1). MLX reads
# the switch once per process, at its first GPU work; other backends have no CUDA graphs. A
# user's own ``MLX_USE_CUDA_GRAPHS`` stands.
CUDA_GRAPHS = "MLX_USE_CUDA_GRAPHS"


def worker_command(worker: WorkerProcess, config: ServeConfig, log_level: str) -> list[str]:
    """The full argv that starts ``worker``'s process."""
    blob = worker_config(worker, config).to_json()
    return [
        sys.executable,
        "-m",
        "mlxd",
        "worker",
        "serve",
        "--config-json",
        blob,
        "--log-level",
        log_level,
    ]


def worker_env(
    worker: WorkerProcess, config: ServeConfig, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """What ``worker``'s process gets added to the daemon's environment: its GPUs
    (``mlxd.gpus``) and its model's (``model_env``)."""
    env = {gpus.VISIBLE: worker.gpus} if worker.gpus else {}
    return env | model_env(worker.spec.path, worker.spec.dtype or config.dtype, environ)


def model_env(path: str, dtype: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment a process serving the model at ``path`` runs with: no CUDA graphs for a
    hybrid (``CUDA_GRAPHS``) unless ``environ`` says otherwise. ``mlxd bench engine`` takes it
    too, before MLX starts, so that it measures what a worker runs."""
    if CUDA_GRAPHS not in environ and has_state(config_of(path, dtype)):
        return {CUDA_GRAPHS: "0"}
    return {}


def worker_config(worker: WorkerProcess, config: ServeConfig) -> WorkerConfig:
    """What ``worker`` runs: its model and endpoints, the daemon's knobs, the model's dtype and
    KV budget, and its buffer cache held to its headroom (``footprint.buffer_cache_bytes``). A
    group's ranks each get their share of the KV (their pools hold as many tokens as one
    worker's, in a ``group_size``-th of the bytes: each keeps that share of the heads)."""
    ranks = worker.spec.group_size or 1
    share = device_share(worker.size, ranks)
    kv_gb = kv_cache_gb(worker.spec, config)
    if kv_gb is None and config.max_memory_bytes is not None:
        kv_gb = share.kv_bytes / 2**30  # what the budget reserved: hold it to that
    elif kv_gb is not None:
        kv_gb /= ranks
    capped = config.max_memory_bytes is not None
    return WorkerConfig(
        model=worker.spec.path,
        name=worker.spec.name,
        endpoint=worker.endpoint,
        control_endpoint=worker.control.endpoint,
        parent_pid=os.getpid(),
        reason_file=None if worker.reason_file is None else str(worker.reason_file),
        scheduler=config.scheduler,
        cache=dataclasses.replace(config.cache, kv_cache_gb=kv_gb),
        max_context=config.max_context,
        buffer_cache_bytes=buffer_cache_bytes(share, capped),
        dtype=worker.spec.dtype or config.dtype,
        max_image_pixels=config.max_image_pixels,
        group_size=ranks,
        distributed=worker.spec.distributed or "ring",
    )
