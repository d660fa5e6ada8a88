"""Worker process entrypoint: load the model, build the engine, run until told to stop."""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq
from mlx.utils import tree_flatten

from mlxd.config import SchedulerConfig, WorkerConfig, kv_bytes_wanted, split_kv_budget
from mlxd.errors import ConfigError
from mlxd.protocol import curve
from mlxd.protocol.channel import WorkerChannel, control_endpoint
from mlxd.protocol.messages import Message, Ping
from mlxd.worker import cpu_backend
from mlxd.worker import group as worker_group
from mlxd.worker.control import Control
from mlxd.worker.embedder import Embedder
from mlxd.worker.engine import Engine
from mlxd.worker.idle_release import IdleRelease
from mlxd.worker.kv import layer_caches
from mlxd.worker.kv.block_pool import BlockPool
from mlxd.worker.prefix import disk_tier
from mlxd.worker.runners.base import ModelRunner, check_model_supported
from mlxd.worker.runners.output_head import last_position_only
from mlxd.worker.runners.quantized import batch_as_rows
from mlxd.worker.sampling.tokenizer import PromptEncoder
from mlxd.worker.sched.prefill_cost import PrefillCost
from mlxd.worker.sched.scheduler import Scheduler

if TYPE_CHECKING:
    from mlxd.worker.kv.formats import KVFormat
    from mlxd.worker.spec.speculator import Drafter

log = logging.getLogger("mlxd.worker")

EXIT_OK = 0
STARTUP_FAILURE = 3
MAX_REASON_CHARS = 300

DEFAULT_CONTEXT = 4096
DEFAULT_KV_FRACTION = 0.5  # of the memory the weights leave, when --kv-cache-gb is not given
SNAPSHOT_BYTES = 8 * 2**30  # most KV budget of a model on its own caches (rows + snapshots)


def serve(config: WorkerConfig) -> int:
    """Run one worker until SIGTERM/SIGINT or its parent dies; return the exit code."""
    auth = None
    if config.curve_keys is not None:  # admit only clients holding our key (before any bind)
        auth = curve.Authenticator(zmq.Context.instance(), config.curve_keys)
    if config.buffer_cache_bytes is not None:
        import mlx.core as mx

        mx.set_cache_limit(config.buffer_cache_bytes)  # before loading: loads use the cache too
    try:
        group = worker_group.join(config)  # None: a lone worker
        model, tokenizer, max_context = _load(config, group)
        compute = cpu_backend.prepare(model, config.dtype)  # float32 on the CPU; GEMM probe
        channel = _channel(config, group)
        runner, pool, max_context = _runner(
            model, set(tokenizer.eos_token_ids), config, max_context
        )
        if group is not None:
            sizes = [0 if pool is None else pool.num_blocks, max_context]
            worker_group.check_same(group, sizes, "the KV pool and context")
        drafter = _draft_model(config, runner, _vocab_size(model, tokenizer))
    except Exception as exc:  # noqa: BLE001 - any load failure is a startup failure
        log.error("worker %s failed to start: %s", config.name, exc)
        _leave_reason(config.reason_file, str(exc) or type(exc).__name__)
        if auth is not None:
            auth.stop()
        return STARTUP_FAILURE
    log.info("KV cache: %s", runner.kv_description)
    encoder = PromptEncoder(tokenizer, _vocab_size(model, tokenizer), max_tokens=max_context)
    log.info(
        "prompts over %s characters are refused untokenized",
        None if encoder.max_token_chars is None else encoder.max_token_chars * max_context,
    )
    engine = Engine(
        name=config.name,
        runner=runner,
        scheduler=Scheduler(
            _scheduler_config(config, runner),
            pool=pool,
            clock=getattr(channel, "clock", time.monotonic),
            cost=PrefillCost.for_model(model),
        ),
        encoder=encoder,
        channel=channel,
        max_context=max_context,
        embedder=Embedder(model),
        drafter=drafter,
    )
    engine.idle_release = IdleRelease(config.cache.kv_idle_s)
    runner.fit_scheduler(engine.scheduler)
    tier = disk_tier.attach(config, engine.scheduler, runner)
    engine.control = Control(
        engine,
        model_path=config.model,
        enable_test_faults=config.enable_test_faults,
        cache_limit_bytes=config.buffer_cache_bytes,
        compute=compute,
    )
    try:  # pings are answered on the control thread, so a long step never looks like a hang
        channel.bind_control(config.control_endpoint or control_endpoint(config.endpoint),
                             answer=_answer_pings(engine))  # fmt: skip
    except zmq.ZMQError as exc:
        log.error("worker %s failed to start: control socket: %s", config.name, exc)
        _leave_reason(config.reason_file, f"control socket: {exc}")
        channel.close()
        if auth is not None:
            auth.stop()
        return STARTUP_FAILURE
    _install_signal_handlers(engine)
    if isinstance(channel, worker_group.GroupChannel):
        worker_group.attach(engine, channel, leader=channel.inner is not None)
    # Everything alive now lives as long as the worker: keep the cyclic GC from rescanning it
    # (the model's modules, the tokenizer) in the middle of decode steps.
    gc.collect()
    gc.freeze()
    if config.parent_pid is not None:
        _watch_parent(engine, config.parent_pid)
    log.info("worker %s serving %s on %s (context %d)", config.name, config.model,
             config.endpoint, max_context)  # fmt: skip
    try:
        engine.run()
        if tier is not None and engine.scheduler.radix is not None:  # a restart finds them
            log.info("KV disk cache: saving %d cached blocks", engine.scheduler.radix.spill())
        disk_tier.save_snapshots(runner)
    finally:
        channel.close()
        if auth is not None:
            auth.stop()
        channel.context.term()  # waits (briefly) until a shutdown's Ack is out
    log.info("worker %s stopped", config.name)
    return EXIT_OK


def _answer_pings(engine: Engine) -> Callable[[Message], Message | None]:
    def answer(msg: Message) -> Message | None:
        return engine.pong(msg) if isinstance(msg, Ping) else None

    return answer


def _channel(config: WorkerConfig, group: Any) -> WorkerChannel:
    """The bound channel; in a group, rank 0's wrapped to broadcast, none on other ranks."""
    if group is None:
        return WorkerChannel(config.endpoint, keys=config.curve_keys)
    inner = WorkerChannel(config.endpoint, keys=config.curve_keys) if group.rank() == 0 else None
    return worker_group.GroupChannel(group, inner, worker_group.GroupClock())  # type: ignore[return-value]


def _load(config: WorkerConfig, group: Any = None) -> tuple[Any, Any, int]:
    started = time.monotonic()
    model, tokenizer = _load_model(config.model, config.dtype, group)
    max_context = config.max_context or _model_context(model)
    log.info("loaded %s in %.1f s", config.model, time.monotonic() - started)
    return model, tokenizer, max_context


def _load_model(source: str, dtype: str, group: Any = None) -> tuple[Any, Any]:
    """``source`` (a directory, repo id, GGUF or ``ollama:`` name) loaded for serving: sharded
    across ``group``, quantized layers taking batches as rows, the output head reading the last
    position only. The target model and the draft model both."""
    import mlx_lm

    from mlxd.models import sources

    log.info("loading %s ...", source)
    path = sources.resolve(source, dtype)  # GGUF / ollama: -> converted dir
    if not Path(path).exists() and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ConfigError(f"model {source!r} is not a local directory (offline)")
    model, tokenizer = mlx_lm.load(path)[:2]
    if group is not None:
        worker_group.shard(model, group)  # before the layers are wrapped below
    if quantized := batch_as_rows(model):
        log.info("%d quantized layers take each batch as rows of one matrix", len(quantized))
    last_position_only(model)  # the engine samples each row's last position, and nothing else
    return model, tokenizer


def _draft_model(config: WorkerConfig, runner: ModelRunner, vocab_size: int) -> Drafter | None:
    """The ``--draft-model`` of ``--speculate draft``, loaded as the target is; None without
    one, or where the runner cannot speculate (a model on its own caches)."""
    path = config.scheduler.draft_model
    if path is None:
        return None
    if not runner.speculates:
        log.warning("%s decodes one token per step (%s): --draft-model not loaded", config.name,
                    runner.kv_description)  # fmt: skip
        return None
    from mlxd.worker.spec.draft_model import DraftModel

    model, tokenizer = _load_model(path, config.dtype)
    cpu_backend.cast(model, config.dtype)
    return DraftModel(model, _vocab_size(model, tokenizer), vocab_size, path)


def _runner(
    model: Any, eos_token_ids: set[int], config: WorkerConfig, max_context: int
) -> tuple[ModelRunner, BlockPool | None, int]:
    """The paged runner with its block pool, the contiguous one (``--no-paged-kv``), or the one
    on the model's own caches for a model the pool cannot hold (sliding-window, recurrent or
    cache-less layers: ``runners.native``). The context is capped to what the pool holds, so
    any one request fits alone."""
    why = check_model_supported(model)  # raises for models the engine cannot serve
    hybrid = bool(why) and config.cache.paged and layer_caches.is_hybrid(model)
    window = layer_caches.window_size(model) if why and config.cache.paged and not hybrid else 0
    if window:
        return _window_runner(model, eos_token_ids, config, max_context, window)
    if (why and not hybrid) or not config.cache.paged:
        if config.cache.kv_bits is not None:
            log.warning("--kv-bits applies to the paged KV pool only; %s keeps float KV",
                        config.name)  # fmt: skip
        if why:
            return _native_runner(model, eos_token_ids, config, why), None, max_context
        return ModelRunner(model, eos_token_ids), None, max_context
    from mlxd.worker.kv.paged_cache import KVPool
    from mlxd.worker.runners.paged import PagedModelRunner

    bs = config.cache.block_size
    fmt = _kv_format(model, config)
    per_token = KVPool.bytes_per_token(model, fmt)
    per_block = per_token * bs
    wanted = kv_bytes_wanted(per_token, config.scheduler.max_num_seqs, max_context, paged=True)
    budget = _kv_budget(model, config, wanted)
    state_budget, rows = 0, 0
    if hybrid:
        from mlxd.worker.runners.hybrid import reserved_bytes

        state_budget, rows = reserved_bytes(model, budget, config.scheduler.max_num_seqs)
    num_blocks, view_tokens = split_kv_budget(budget - state_budget - rows, per_token, bs)
    if num_blocks < 2:
        held = f" after {rows} bytes of rows' recurrent state" if rows else ""
        raise ConfigError(f"--kv-cache-gb {config.cache.kv_cache_gb} holds no KV blocks{held}; "
                          f"one block of {bs} tokens takes {per_block} bytes")  # fmt: skip
    if num_blocks * bs < max_context:
        log.warning("the KV pool holds %d tokens: context capped from %d", num_blocks * bs,
                    max_context)  # fmt: skip
        max_context = num_blocks * bs
    # An idle worker holds about one chunk of KV, not its whole budget (worker/idle_release.py).
    chunk = max(1, int(config.cache.kv_chunk_mb * 2**20) // per_block)
    pool = KVPool.for_model(model, num_blocks=num_blocks, block_size=bs, chunk_blocks=chunk,
                            fmt=fmt)  # fmt: skip
    if hybrid:
        from mlxd.worker.runners.hybrid import HybridModelRunner

        runner: ModelRunner = HybridModelRunner(model, eos_token_ids, pool, state_budget,
                                                max_view_tokens=view_tokens)  # fmt: skip
    else:
        runner = PagedModelRunner(model, eos_token_ids, pool, max_view_tokens=view_tokens)
    return runner, BlockPool(num_blocks, bs), max_context


def _window_runner(
    model: Any, eos_token_ids: set[int], config: WorkerConfig, max_context: int, window: int
) -> tuple[ModelRunner, BlockPool, int]:
    """The paged runner of a sliding-window model: full layers' blocks and window layers'
    slabs from one budget (``window_slabs``). The context is capped to what the budget holds
    with one window's slabs beside it."""
    from mlxd.worker.kv.paged_cache import KVPool
    from mlxd.worker.runners.window import WindowModelRunner, margin

    bs, fmt = config.cache.block_size, _kv_format(model, config)
    full, windowed = (KVPool.bytes_per_token(model, fmt, windows=w) * bs for w in (False, True))
    wanted = kv_bytes_wanted(full // bs + windowed // bs, config.scheduler.max_num_seqs,
                             max_context, paged=True)  # fmt: skip
    num_blocks, view_tokens = split_kv_budget(_kv_budget(model, config, wanted),
                                              (full + windowed) // bs, bs)  # fmt: skip
    runner, pool = WindowModelRunner.for_model(
        model, eos_token_ids, num_blocks, bs, window, int(config.cache.kv_chunk_mb * 2**20),
        fmt, view_tokens)  # fmt: skip
    # one sequence holds at most a window, decode's margin and a prefill chunk of slabs
    in_window = -(-(window + margin(bs) + config.scheduler.prefill_chunk) // bs) + 2
    context = runner.context_blocks(in_window) * bs
    if context < bs:
        raise ConfigError(f"--kv-cache-gb {config.cache.kv_cache_gb} holds no KV blocks; one "
                          f"block of {bs} tokens takes {full + windowed} bytes")  # fmt: skip
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
        raise ConfigError(f"--kv-group-size {fmt.group_size} does not divide {config.name}'s "
                          f"head dimension ({kd}, {vd})")  # fmt: skip
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
        log.info("%s has %s: served on its own caches, %.2f GiB for the batch's and as much "
                 "for prefix snapshots", config.name, why, budget / 2**30)  # fmt: skip
    runner = NativeModelRunner(model, eos_token_ids, snapshots, config.cache.block_size, why,
                               kv_budget=budget)  # fmt: skip
    if not runner.batchable:
        log.warning("%s: a layer cache cannot join a batch (%s): one sequence at a time",
                    config.name, why)  # fmt: skip
    return runner


def _scheduler_config(config: WorkerConfig, runner: ModelRunner) -> SchedulerConfig:
    """The scheduler's limits; one row when the runner cannot batch."""
    if getattr(runner, "batchable", True):
        return config.scheduler
    return dataclasses.replace(config.scheduler, max_num_seqs=1)


def _kv_budget(model: Any, config: WorkerConfig, most_useful: int) -> int:
    """Bytes for the KV pool: ``--kv-cache-gb``, or a share of the device memory the weights
    leave, at most what ``max_num_seqs`` full contexts take."""
    if config.cache.kv_cache_gb is not None:
        return int(config.cache.kv_cache_gb * 2**30)
    import mlx.core as mx

    info = mx.device_info()
    # Metal: the recommended working set; CUDA: the device's memory; CPU: none (physical RAM)
    total = (info.get("max_recommended_working_set_size") or info.get("memory_size")
             or info.get("total_memory"))  # fmt: skip
    if not isinstance(total, int):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    weights = sum(int(v.nbytes) for _, v in tree_flatten(model.parameters()))
    return min(int(DEFAULT_KV_FRACTION * max(total - weights, 0)), most_useful)


def _model_context(model: Any) -> int:
    value = _model_arg(model, "max_position_embeddings")
    return int(value) if value else DEFAULT_CONTEXT


def _vocab_size(model: Any, tokenizer: Any) -> int:
    return int(_model_arg(model, "vocab_size") or len(tokenizer))


def _model_arg(model: Any, name: str) -> Any:
    """A config value of ``model``, or of its ``text_config`` (Qwen3.5, Gemma 3 and Mistral 3
    wrap their text model's config in one)."""
    args = getattr(model, "args", None)
    value = getattr(args, name, None)
    text = getattr(args, "text_config", None)
    if value is None and isinstance(text, dict):
        value = text.get(name)
    return value


def _install_signal_handlers(engine: Engine) -> None:
    def stop(signum: int, frame: object) -> None:
        engine.should_exit = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def _watch_parent(engine: Engine, parent_pid: int) -> None:
    """Exit when the process that started us is gone, so a killed daemon leaves no orphans."""

    def watch() -> None:
        while not engine.should_exit:
            if os.getppid() != parent_pid:
                log.warning("parent %d is gone; stopping", parent_pid)
                engine.should_exit = True
                return
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _leave_reason(path: str | None, reason: str) -> None:
    """Leave the supervisor one line saying why this worker could not start: it reports the
    model failed with it (``/health``, ``/v1/models``, 503s), so it is capped and one line."""
    if path is None:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(" ".join(reason.split())[:MAX_REASON_CHARS])
    except OSError as exc:
        log.warning("could not leave the failure reason in %s: %s", path, exc)


def configure_logging(name: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s worker[{name}] %(message)s",
    )
