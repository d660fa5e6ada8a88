"""The command line of a spawned worker: ``python -m mlxd worker serve --config-json ...``,
its whole ``WorkerConfig`` (this daemon's knobs, its endpoints and the memory the budget
reserved) as one typed value, not an option per knob."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping

from mlxd import gpus
from mlxd.config import ServeConfig, WorkerConfig, data_dir
from mlxd.daemon.footprint import buffer_cache_bytes, config_of, device_share, kv_cache_gb
from mlxd.daemon.worker_process import WorkerProcess
from mlxd.models.kv_layout import has_state, has_window

# MLX's CUDA graphs, off in the worker of a hybrid (layers with recurrent state) and of a model
# with sliding-window layers. Three starts of each, alternated, on one H200 alone
# (docs/PERFORMANCE.md, runs GO1 and GS1): the Qwen3.5-0.8B shape's first 4,500-token prompt
# after a start took 684 ms without graphs against 1,507 (medians), its lone stream 102 tok/s
# against 82; the Gemma-3-1B shape's first prompt 181 ms against 283 (1.14x warm against
# 1.73x), its lone stream 97 against 78 tok/s and 64 streams 3,338 against 2,515. A dense
# Qwen3-0.6B shape keeps them: its lone stream took 124 tok/s without against 159 with (16 and
# 64 streams gained 1.2x and 1.4x without). MLX reads the switch once per process, at its first
# GPU work; other backends have no CUDA graphs. A user's own ``MLX_USE_CUDA_GRAPHS`` stands.
CUDA_GRAPHS = "MLX_USE_CUDA_GRAPHS"
# Where MLX's CUDA backend keeps the kernels it compiles with NVRTC at their first use, by
# default under the temporary folder, which many systems empty at boot. On an H200 a MoE's
# 4-bit expert matmuls (``qmm_sm80``) took 30-95 s each to compile, four minutes in all at its
# first start on a machine, and none at the next start with the folder kept (run WT1,
# docs/PERFORMANCE.md). Workers keep them in mlxd's data folder; other backends read nothing
# from it. A user's own ``MLX_PTX_CACHE_DIR`` stands.
PTX_CACHE = "MLX_PTX_CACHE_DIR"


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
    (``mlxd.gpus``), where compiled kernels are kept (``kernel_cache_env``) and its model's
    (``model_env``)."""
    env = {gpus.VISIBLE: worker.gpus} if worker.gpus else {}
    model = model_env(worker.spec.path, worker.spec.dtype or config.dtype, environ)
    return env | kernel_cache_env(environ) | model


def kernel_cache_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``PTX_CACHE`` in mlxd's data folder, unless ``environ`` sets it."""
    return {} if PTX_CACHE in environ else {PTX_CACHE: str(data_dir(environ) / "kernels")}


def model_env(path: str, dtype: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment a process serving the model at ``path`` runs with: no CUDA graphs for a
    hybrid or a model with window layers (``CUDA_GRAPHS``) unless ``environ`` says otherwise.
    ``mlxd bench engine`` takes it too, before MLX starts, so that it measures what a worker
    runs."""
    if CUDA_GRAPHS in environ:
        return {}
    config = config_of(path, dtype)
    return {CUDA_GRAPHS: "0"} if has_state(config) or has_window(config) else {}


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
