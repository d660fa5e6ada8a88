"""The engine builder: which runner a model gets, how big its KV pool is, and the engine around it.

One rule for the served worker (``main.serve``) and the in-process benchmarks
(``mlxd.bench.engine.new_engine``, which the scripts use): the paged runner with its block
pool; the hybrid and sliding-window runners on the pool for those layouts; the runner on the
model's own caches (``runners.native``) for a model the pool cannot hold; the contiguous one
with ``--no-paged-kv``. The pool is sized from the KV budget (``--kv-cache-gb``, else a share of
the memory the weights leave) unless the caller gives a ``PoolSize`` (the benchmarks do).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx.utils import tree_flatten

from mlxd.config import SchedulerConfig, WorkerConfig, data_dir, kv_bytes_wanted, split_kv_budget
from mlxd.errors import ConfigError
from mlxd.protocol.channel import WorkerChannel
from mlxd.worker import cpu_backend
from mlxd.worker.embedder import Embedder
from mlxd.worker.engine import Engine
from mlxd.worker.idle_release import IdleRelease
from mlxd.worker.kv import layer_caches
from mlxd.worker.kv.block_pool import BlockPool
from mlxd.worker.kv.formats import parts
from mlxd.worker.prefix.disk_cache import DiskKVCache, model_identity
from mlxd.worker.prefix.disk_tier import DiskTier
from mlxd.worker.runners.base import ModelRunner
from mlxd.worker.runners.contiguous import ContiguousModelRunner
from mlxd.worker.runners.paged import PagedModelRunner, check_model_supported
from mlxd.worker.sampling.tokenizer import PromptEncoder
from mlxd.worker.sched.prefill_cost import PrefillCost
from mlxd.worker.sched.scheduler import Scheduler

if TYPE_CHECKING:
    from mlxd.worker.kv.formats import KVFormat
    from mlxd.worker.spec.speculator import Drafter
    from mlxd.worker.vision.encoder import ImageEncoder

log = logging.getLogger("mlxd.worker")

DEFAULT_KV_FRACTION = 0.5  # of the memory the weights leave, when --kv-cache-gb is not given
SNAPSHOT_BYTES = 8 * 2**30  # most KV budget of a model on its own caches (rows + snapshots)


@dataclass(frozen=True, slots=True)
class PoolSize:
    """A paged pool sized by hand rather than from the KV budget (the benchmarks' pools).

    Args:
        num_blocks: blocks in the pool, allocated at once (no growth by chunks).
        view_tokens: tokens decode's read view may hold (None: the pool's).
        state_budget: a hybrid's bytes for the prefix cache's recurrent-state snapshots.
    """

    num_blocks: int
    view_tokens: int | None = None
    state_budget: int = 1 << 30


def build_engine(
    config: WorkerConfig,
    runner: ModelRunner,
    pool: BlockPool | None,
    *,
    model: Any,
    encoder: PromptEncoder,
    channel: WorkerChannel,
    max_context: int,
    clock: Callable[[], float] = time.monotonic,
    embedder: Embedder | None = None,
    drafter: Drafter | None = None,
    vision: ImageEncoder | None = None,
) -> Engine:
    """The engine on ``runner`` (from ``build_runner``): its scheduler on ``pool``, the idle
    release of ``--kv-idle-s``, and the prefix cache's disk tier with ``--kv-disk-gb``;
    ``vision``: a VLM's image encoder."""
    engine = Engine(
        name=config.name,
        runner=runner,
        scheduler=Scheduler(
            scheduler_config(config, runner),
            pool=pool,
            clock=clock,
            cost=PrefillCost.for_model(model),
        ),
        encoder=encoder,
        channel=channel,
        max_context=max_context,
        embedder=embedder,
        drafter=drafter,
        vision=vision,
    )
    engine.idle_release = IdleRelease(config.cache.kv_idle_s)
    fit_kv(engine.scheduler, runner)
    _attach_disk_tier(config, engine.scheduler, runner)
    return engine


def fit_kv(scheduler: Scheduler, runner: ModelRunner) -> None:
    """What ``runner``'s caches ask of the scheduler: a sliding-window model's slabs beside the
    blocks in its KV ledger, the arrays' ``reclaim`` when out of room; a hybrid's prefix cache
    keeps recurrent states (``fit_scheduler``)."""
    from mlxd.worker.runners.window import WindowModelRunner

    runner.fit_scheduler(scheduler)
    if scheduler.kv is not None and isinstance(runner, WindowModelRunner):
        scheduler.kv.keep_windows(runner.window_slabs(), runner.reclaim)


def build_runner(
    model: Any,
    eos_token_ids: set[int],
    config: WorkerConfig,
    max_context: int,
    size: PoolSize | None = None,
) -> tuple[ModelRunner, BlockPool | None, int]:
    """The paged runner with its block pool, the contiguous one (``--no-paged-kv``), or the one
    on the model's own caches for a model the pool cannot hold (sliding-window, recurrent or
    cache-less layers: ``runners.native``). The context is capped to what the pool holds, so
    any one request fits alone. ``size``: the pool's, instead of the KV budget's."""
    why = check_model_supported(model)  # raises for models the engine cannot serve
    hybrid = bool(why) and config.cache.paged and layer_caches.is_hybrid(model)
    window = layer_caches.window_size(model) if why and config.cache.paged and not hybrid else 0
    if window:
        return _window_runner(model, eos_token_ids, config, max_context, window, size)
    if (why and not hybrid) or not config.cache.paged:
        if config.cache.kv_bits is not None:
            log.warning(
                "--kv-bits applies to the paged KV pool only; %s keeps float KV", config.name
            )
        if why:
            return _native_runner(model, eos_token_ids, config, why), None, max_context
        return ContiguousModelRunner(model, eos_token_ids), None, max_context
    from mlxd.worker.kv.paged_cache import KVPool

    bs = config.cache.block_size
    fmt = _kv_format(model, config)
    per_token = KVPool.bytes_per_token(model, fmt)
    per_block = per_token * bs
    view_tokens: int | None
    chunk: int | None = None  # None: the pool's arrays hold every block from the start
    if size is None:
        num_blocks, view_tokens, state_budget, rows = _paged_sizes(
            model, config, max_context, per_token, hybrid
        )
        # An idle worker holds about one chunk of KV, not its whole budget (idle_release.py).
        chunk = max(1, int(config.cache.kv_chunk_mb * 2**20) // per_block)
    else:
        num_blocks, view_tokens = size.num_blocks, size.view_tokens
        state_budget, rows = size.state_budget, 0
    if num_blocks < 2:
        held = f" after {rows} bytes of rows' recurrent state" if rows else ""
        raise ConfigError(
            f"--kv-cache-gb {config.cache.kv_cache_gb} holds no KV blocks{held}; "
            f"one block of {bs} tokens takes {per_block} bytes"
        )
    if num_blocks * bs < max_context:
        log.warning(
            "the KV pool holds %d tokens: context capped from %d", num_blocks * bs, max_context
        )
        max_context = num_blocks * bs
    pool = KVPool.for_model(
        model, num_blocks=num_blocks, block_size=bs, chunk_blocks=chunk, fmt=fmt
    )
    if hybrid:
        from mlxd.worker.runners.hybrid import HybridModelRunner

        runner: ModelRunner = HybridModelRunner(
            model, eos_token_ids, pool, state_budget, max_view_tokens=view_tokens
        )
    else:
        runner = PagedModelRunner(model, eos_token_ids, pool, max_view_tokens=view_tokens)
    blocks = BlockPool(
        num_blocks, bs, held=lambda: pool.capacity, reserve=lambda n: pool.ensure(n - 1)
    )
    return runner, blocks, max_context


def scheduler_config(config: WorkerConfig, runner: ModelRunner) -> SchedulerConfig:
    """The scheduler's limits; one row when the runner cannot batch."""
    if getattr(runner, "batchable", True):
        return config.scheduler
    return dataclasses.replace(config.scheduler, max_num_seqs=1)


def save_snapshots(runner: ModelRunner) -> None:
    """At the worker's end: its snapshots in memory to the disk tier, so a restart hits them."""
    snapshots = getattr(runner, "snapshots", None)
    if snapshots is not None and snapshots.disk is not None:
        log.info("KV disk cache: saving %d snapshots", snapshots.clear())


# Internal helpers: pool sizing


def _paged_sizes(
    model: Any, config: WorkerConfig, max_context: int, per_token: int, hybrid: bool
) -> tuple[int, int, int, int]:
    """From the KV budget: (pool blocks, decode view's tokens, a hybrid's snapshot budget, its
    rows' recurrent state bytes)."""
    bs = config.cache.block_size
    wanted = kv_bytes_wanted(per_token, config.scheduler.max_num_seqs, max_context, paged=True)
    budget = _kv_budget(model, config, wanted)
    state_budget, rows = 0, 0
    if hybrid:
        from mlxd.worker.runners.hybrid import reserved_bytes

        state_budget, rows = reserved_bytes(model, budget, config.scheduler.max_num_seqs)
    num_blocks, view_tokens = split_kv_budget(budget - state_budget - rows, per_token, bs)
    return num_blocks, view_tokens, state_budget, rows


def _window_runner(
    model: Any,
    eos_token_ids: set[int],
    config: WorkerConfig,
    max_context: int,
    window: int,
    size: PoolSize | None = None,
) -> tuple[ModelRunner, BlockPool, int]:
    """The paged runner of a sliding-window model: full layers' blocks and window layers'
    slabs from one budget (``window_slabs``). The context is capped to what the budget holds
    with one window's slabs beside it."""
    from mlxd.worker.kv.paged_cache import KVPool
    from mlxd.worker.runners.window import WindowModelRunner, margin

    bs, fmt = config.cache.block_size, _kv_format(model, config)
    full, windowed = (KVPool.bytes_per_token(model, fmt, windows=w) * bs for w in (False, True))
    view_tokens: int | None
    if size is None:
        wanted = kv_bytes_wanted(
            full // bs + windowed // bs, config.scheduler.max_num_seqs, max_context, paged=True
        )
        num_blocks, view_tokens = split_kv_budget(
            _kv_budget(model, config, wanted), (full + windowed) // bs, bs
        )
    else:
        num_blocks, view_tokens = size.num_blocks, size.view_tokens
    runner, pool = WindowModelRunner.for_model(
        model,
        eos_token_ids,
        num_blocks,
        bs,
        window,
        int(config.cache.kv_chunk_mb * 2**20),
        fmt,
        view_tokens,
    )
    # one sequence holds at most a window, decode's margin and a prefill chunk of slabs
    in_window = -(-(window + margin(bs) + config.scheduler.prefill_chunk) // bs) + 2
    context = runner.context_blocks(in_window) * bs
    if context < bs:
        raise ConfigError(
            f"--kv-cache-gb {config.cache.kv_cache_gb} holds no KV blocks; one "
            f"block of {bs} tokens takes {full + windowed} bytes"
        )
    if context < max_context:
        log.warning("the KV pool holds %d tokens: context capped from %d", context, max_context)
        max_context = context
    return runner, pool, max_context


def _kv_format(model: Any, config: WorkerConfig) -> KVFormat:
    """How the pool stores K/V: quantized with ``--kv-bits`` when the head dimension allows."""
    from mlxd.worker.kv.formats import KVFormat
    from mlxd.worker.kv.paged_cache import kv_shape

    fmt = KVFormat(config.cache.kv_bits, config.cache.kv_group_size)
    if not fmt.quantized:
        return fmt
    _, _, kd, vd, _ = kv_shape(model)
    if not (fmt.fits(kd) and fmt.fits(vd)):
        raise ConfigError(
            f"--kv-group-size {fmt.group_size} does not divide {config.name}'s "
            f"head dimension ({kd}, {vd})"
        )
    return fmt


def _native_runner(
    model: Any, eos_token_ids: set[int], config: WorkerConfig, why: str
) -> ModelRunner:
    """The runner on ``model``'s own caches. With the prefix cache (off with
    ``--no-paged-kv``) the KV budget is split between the batch's caches (rows beyond it are
    preempted and resume from their snapshots) and the snapshots."""
    from mlxd.worker.prefix.snapshot_cache import SnapshotCache
    from mlxd.worker.runners.native import NativeModelRunner

    snapshots, budget = None, None
    if config.cache.paged:
        budget = _kv_budget(model, config, SNAPSHOT_BYTES) // 2  # half rows, half snapshots
        snapshots = SnapshotCache(budget)
        log.info(
            "%s has %s: served on its own caches, %.2f GiB for the batch's and as much "
            "for prefix snapshots",
            config.name,
            why,
            budget / 2**30,
        )
    runner = NativeModelRunner(
        model, eos_token_ids, snapshots, config.cache.block_size, why, kv_budget=budget
    )
    if not runner.batchable:
        log.warning(
            "%s: a layer cache cannot join a batch (%s): one sequence at a time", config.name, why
        )
    return runner


def _kv_budget(model: Any, config: WorkerConfig, most_useful: int) -> int:
    """Bytes for the KV pool: ``--kv-cache-gb``, or a share of the device memory the weights
    leave, at most what ``max_num_seqs`` full contexts take."""
    if config.cache.kv_cache_gb is not None:
        return int(config.cache.kv_cache_gb * 2**30)
    import mlx.core as mx

    info = mx.device_info()
    # Metal: the recommended working set; CUDA: the device's memory; CPU: none (physical RAM)
    total = (
        info.get("max_recommended_working_set_size")
        or info.get("memory_size")
        or info.get("total_memory")
    )
    if not isinstance(total, int):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    weights = sum(int(v.nbytes) for _, v in tree_flatten(model.parameters()))
    return min(int(DEFAULT_KV_FRACTION * max(total - weights, 0)), most_useful)


# Internal helpers: the disk tiers of --kv-disk-gb


def _attach_disk_tier(
    config: WorkerConfig, scheduler: Scheduler, runner: ModelRunner
) -> DiskTier | None:
    """The disk tier under ``$MLXD_HOME/kv-cache/<model identity>`` when ``--kv-disk-gb`` asks
    for one and the runner is paged; set as the prefix cache's tier."""
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
    layout = (
        f"{len(pool.keys)} layers K{k.shape[1:]} V{v.shape[1:]} {v.dtype} block {pool.block_size}"
    )
    if pool.fmt.quantized:  # another format's blocks are foreign
        layout += f" {pool.fmt.bits}-bit groups of {pool.fmt.group_size}"
    model_id = model_identity(_model_dir(config), layout)
    disk = DiskKVCache(data_dir() / "kv-cache" / model_id, model_id, int(gb * 2**30))
    tier = DiskTier(disk, runner)
    scheduler.radix.tier = tier
    log.info(
        "KV disk cache: %s, %d blocks (%.1f of %.1f GiB)",
        disk.files.root,
        len(disk),
        disk.nbytes / 2**30,
        gb,
    )
    return tier


def _attach_snapshots(config: WorkerConfig, runner: ModelRunner, cap_bytes: int) -> bool:
    """A runner on the model's own caches with snapshots: their disk tier, under the same
    directory scheme (``snapshot_disk``). False for any other runner."""
    from mlx_lm.models.cache import make_prompt_cache

    from mlxd.worker.prefix.snapshot_disk import DiskSnapshots

    snapshots = getattr(runner, "snapshots", None)
    if snapshots is None:
        return False
    model = runner.model
    kinds = ",".join(type(c).__name__ for c in make_prompt_cache(model))
    dtype = cpu_backend.float_dtype(model)  # the compute dtype the snapshots are in
    model_id = model_identity(_model_dir(config), f"snapshots {kinds} {dtype}")
    snapshots.disk = DiskSnapshots(data_dir() / "kv-cache" / model_id, model_id, cap_bytes)
    log.info(
        "KV disk cache: %s, %d snapshots (%.1f of %.1f GiB)",
        snapshots.disk.files.root,
        len(snapshots.disk),
        snapshots.disk.nbytes / 2**30,
        cap_bytes / 2**30,
    )
    return True


def _model_dir(config: WorkerConfig) -> Path:
    """The local directory the model loaded from (a repo id: its Hugging Face snapshot)."""
    from mlxd.models import sources

    path = Path(sources.resolve(config.model, config.dtype))
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(path), local_files_only=True))
