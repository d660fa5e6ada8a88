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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from mlxd.config import WorkerConfig
from mlxd.errors import ConfigError
from mlxd.protocol import curve
from mlxd.protocol.channel import WorkerChannel, control_endpoint
from mlxd.protocol.messages import Message, Ping
from mlxd.worker import buffer_cache, cpu_backend
from mlxd.worker import group as worker_group
from mlxd.worker.build import build_engine, build_runner, save_snapshots
from mlxd.worker.control import Control
from mlxd.worker.embedder import Embedder
from mlxd.worker.engine import TEXT_ONLY, Engine
from mlxd.worker.runners import delta_chunks
from mlxd.worker.runners.base import ModelRunner
from mlxd.worker.runners.served import Served, for_serving, for_this_process
from mlxd.worker.sampling.tokenizer import PromptEncoder
from mlxd.worker.warmup import kernel_note, warm_up, warmup_budget

if TYPE_CHECKING:
    from mlxd.worker.spec.speculator import Drafter

log = logging.getLogger("mlxd.worker")

EXIT_OK = 0
STARTUP_FAILURE = 3
MAX_REASON_CHARS = 300

DEFAULT_CONTEXT = 4096


def serve(config: WorkerConfig) -> int:
    """Run one worker until SIGTERM/SIGINT or its parent dies; return the exit code."""
    auth = None
    if config.curve_keys is not None:  # admit only clients holding our key (before any bind)
        auth = curve.Authenticator(zmq.Context.instance(), config.curve_keys)
    config = _cap_buffer_cache(config)  # before loading: loads use the cache too
    try:
        loaded = _load_all(config)
    except Exception as exc:  # noqa: BLE001 - any load failure is a startup failure
        return _startup_failure(config, str(exc) or type(exc).__name__, auth)
    engine = _engine(config, loaded)
    channel = loaded.channel
    try:  # pings are answered on the control thread, so a long step never looks like a hang
        channel.bind_control(
            config.control_endpoint or control_endpoint(config.endpoint),
            answer=_answer_pings(engine),
        )
    except zmq.ZMQError as exc:
        channel.close()
        return _startup_failure(config, f"control socket: {exc}", auth)
    _prepare_to_serve(config, engine, channel)
    try:
        if not isinstance(channel, worker_group.GroupChannel):  # a group's ranks step together
            warm_up(engine, warmup_budget(config.scheduler.warmup_s, loaded.compute.device))
        engine.run()
        _save_caches(engine)
    finally:
        channel.close()
        if auth is not None:
            auth.stop()
        channel.context.term()  # waits (briefly) until a shutdown's Ack is out
    log.info("worker %s stopped", config.name)
    return EXIT_OK


@dataclass(slots=True)
class _Loaded:
    """What a worker loads before it can serve: the model and what is built on it."""

    model: Any
    tokenizer: Any
    channel: Any
    runner: Any
    pool: Any
    max_context: int
    compute: Any
    drafter: Any
    vision: Any = None  # a VLM's image encoder (worker/vision/encoder.py)
    images_refused: str = TEXT_ONLY  # why an image is a 400, where the runner takes none


def _load_all(config: WorkerConfig) -> _Loaded:
    """Load the model, join the group, open the channel, build the runner and the drafter."""
    group = worker_group.join(config)  # None: a lone worker
    if note := kernel_note(os.environ, cpu_backend.on_cuda()):
        log.warning(note)
    model, tokenizer, max_context, vision = _load(config, group)
    compute = cpu_backend.prepare(model, config.dtype)  # float32 on the CPU; GEMM probe
    patched = for_this_process(model)
    if patched.delta_modules:  # this process's gated delta prefill, where Metal is absent
        log.info("gated delta prefill in %d-token chunks", delta_chunks.CHUNK)
    if patched.padded_attention:  # exact-length prefills' queries padded inside attention
        log.info("attention queries padded to planned lengths")
    channel = _channel(config, group)
    runner, pool, max_context = build_runner(
        model, set(tokenizer.eos_token_ids), config, max_context
    )
    if group is not None:
        sizes = [0 if pool is None else pool.num_blocks, max_context]
        worker_group.check_same(group, sizes, "the KV pool and context")
    drafter = _draft_model(config, runner, model_vocab_size(model, tokenizer))
    refused = TEXT_ONLY if vision is None else _attach_vision(config, runner, vision)
    return _Loaded(
        model, tokenizer, channel, runner, pool, max_context, compute, drafter, vision, refused
    )


def _startup_failure(config: WorkerConfig, reason: str, auth: Any) -> int:
    log.error("worker %s failed to start: %s", config.name, reason)
    _leave_reason(config.reason_file, reason)
    if auth is not None:
        auth.stop()
    return STARTUP_FAILURE


def _engine(config: WorkerConfig, loaded: _Loaded) -> Engine:
    """The engine on what was loaded (``build_engine``), with its control handler."""
    runner, max_context, model = loaded.runner, loaded.max_context, loaded.model
    log.info("KV cache: %s", runner.kv_description)
    vocab_size = model_vocab_size(model, loaded.tokenizer)
    encoder = PromptEncoder(loaded.tokenizer, vocab_size, max_tokens=max_context)
    log.info(
        "prompts over %s characters are refused untokenized",
        None if encoder.max_token_chars is None else encoder.max_token_chars * max_context,
    )
    engine = build_engine(
        config,
        runner,
        loaded.pool,
        model=model,
        encoder=encoder,
        channel=loaded.channel,
        max_context=max_context,
        clock=getattr(loaded.channel, "clock", time.monotonic),
        embedder=Embedder(model),
        drafter=loaded.drafter,
        vision=loaded.runner.vision,
    )
    engine.images_refused = loaded.images_refused
    engine.control = Control(
        engine,
        model_path=config.model,
        enable_test_faults=config.enable_test_faults,
        cache_limit_bytes=config.buffer_cache_bytes,
        compute=loaded.compute,
    )
    return engine


def _cap_buffer_cache(config: WorkerConfig) -> WorkerConfig:
    """Hold MLX's cache of freed buffers to ``buffer_cache_bytes``; ``config`` with the limit in
    force."""
    if config.buffer_cache_bytes is None:
        return config
    return dataclasses.replace(
        config, buffer_cache_bytes=buffer_cache.cap(config.buffer_cache_bytes)
    )


def _prepare_to_serve(config: WorkerConfig, engine: Engine, channel: Any) -> None:
    """Signals, the group's followers, the frozen GC and the parent watch: all set to serve."""
    _install_signal_handlers(engine)
    if isinstance(channel, worker_group.GroupChannel):
        worker_group.attach(engine, channel, leader=channel.inner is not None)
    # Everything alive now lives as long as the worker: keep the cyclic GC from rescanning it
    # (the model's modules, the tokenizer) in the middle of decode steps.
    gc.collect()
    gc.freeze()
    if config.parent_pid is not None:
        _watch_parent(engine, config.parent_pid)
    log.info(
        "worker %s serving %s on %s (context %d)",
        config.name,
        config.model,
        config.endpoint,
        engine.max_context,
    )


def _save_caches(engine: Engine) -> None:
    """What a restart finds again: the prefix cache's blocks on disk, and the snapshots."""
    radix = engine.scheduler.radix
    if radix is not None and radix.tier is not None:
        log.info("KV disk cache: saving %d cached blocks", radix.spill())
    save_snapshots(engine.runner)


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


def _load(config: WorkerConfig, group: Any = None) -> tuple[Any, Any, int, Any]:
    """The model, its tokenizer, its context and, for a VLM, its image encoder."""
    started = time.monotonic()
    vision = None
    if (path := _vlm_path(config.model)) is not None:
        model, tokenizer, vision = _load_vlm(path, group)
    else:
        model, tokenizer = _load_model(config.model, config.dtype, group)
    max_context = config.max_context or _model_context(model)
    if (limit := getattr(model, "context_limit", None)) is not None and max_context > limit:
        # a VLM whose language model is served right only so far (Llama 4: one chunk)
        log.warning("%s: context capped from %d to %d tokens", config.name, max_context, limit)
        max_context = limit
    log.info("loaded %s in %.1f s", config.model, time.monotonic() - started)
    return model, tokenizer, max_context, vision


def _vlm_path(source: str) -> str | None:
    """``source``'s directory when it is a vision-language checkpoint (None otherwise)."""
    if not Path(source).is_dir() or not (Path(source) / "config.json").is_file():
        return None
    from mlxd.worker.vision.model import is_vlm

    return source if is_vlm(source) else None


def _load_vlm(path: str, group: Any) -> tuple[Any, Any, Any]:
    """A VLM through mlx-vlm (the ``vision`` extra): its language model for the runners, the
    tokenizer, and the image encoder beside them."""
    import importlib.util

    if importlib.util.find_spec("mlx_vlm") is None:
        raise ConfigError(f"{path} is a vision-language model: pip install 'mlxd[vision]'")
    if group is not None:
        raise ConfigError("a vision-language model cannot be sharded across a worker group yet")
    from mlxd.worker.vision.encoder import ImageEncoder
    from mlxd.worker.vision.model import load_vlm

    log.info("loading %s (vision-language, mlx-vlm) ...", path)
    model, tokenizer, (vlm, processor) = load_vlm(path)
    _log_served(for_serving(model, head=model.language_model))
    return model, tokenizer, ImageEncoder(vlm, processor, model)


def _attach_vision(config: WorkerConfig, runner: ModelRunner, vision: Any) -> str:
    """The image encoder on a runner that splices features into prefill (the paged one on
    plain K/V, the window one, a paged runner, for Gemma 3's and Gemma 4's sliding-window
    layers, and the hybrid one, a paged runner too, for Qwen3.5's recurrent layers); on
    another (Gemma 4 E2B / E4B: K/V shared across layers) the VLM serves text and refuses
    images. An image whose tokens attend each other both ways (the larger Gemma 4s) is
    prefilled in one forward, its masks overlaid (``sched.image_spans``). Returns why images
    are refused ("" where they are taken)."""
    from mlxd.worker.runners.hybrid import HybridModelRunner
    from mlxd.worker.runners.paged import PagedModelRunner

    if vision.both_ways and isinstance(runner, HybridModelRunner):
        why = "its image tokens attend both ways, which recurrent layers cannot"
    elif not isinstance(runner, PagedModelRunner):
        why = f"images need the paged KV runner, and this model runs on {runner}"
    else:
        vision.max_pixels = config.max_image_pixels
        runner.vision = vision
        return ""
    log.warning("%s: %s; text only", config.name, why)
    return why


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
    _log_served(for_serving(model))
    return model, tokenizer


def _log_served(served: Served) -> None:
    if served.quantized:
        log.info("%d quantized layers take each batch as rows of one matrix", len(served.quantized))
    if served.convs:
        log.info("%d short convolutions run as multiply-adds", len(served.convs))


def _draft_model(config: WorkerConfig, runner: ModelRunner, vocab_size: int) -> Drafter | None:
    """The ``--draft-model`` of ``--speculate draft``, loaded as the target is; None without
    one, or where the runner cannot speculate (a model on its own caches)."""
    path = config.scheduler.draft_model
    if path is None:
        return None
    if not runner.speculates:
        log.warning(
            "%s decodes one token per step (%s): --draft-model not loaded",
            config.name,
            runner.kv_description,
        )
        return None
    from mlxd.worker.spec.draft_model import DraftModel

    model, tokenizer = _load_model(path, config.dtype)
    cpu_backend.cast(model, config.dtype)
    return DraftModel(model, model_vocab_size(model, tokenizer), vocab_size, path)


def _model_context(model: Any) -> int:
    value = _model_arg(model, "max_position_embeddings")
    return int(value) if value else DEFAULT_CONTEXT


def model_vocab_size(model: Any, tokenizer: Any) -> int:
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
