"""Worker process entrypoint: load the model, build the engine, run until told to stop."""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from mlxd.config import WorkerConfig
from mlxd.errors import ConfigError
from mlxd.protocol.channel import WorkerChannel, control_endpoint
from mlxd.worker.control import Control
from mlxd.worker.embedder import Embedder
from mlxd.worker.engine import Engine
from mlxd.worker.model_runner import ModelRunner, check_model_supported
from mlxd.worker.scheduler import Scheduler
from mlxd.worker.tokenizer import PromptEncoder

log = logging.getLogger("mlxd.worker")

EXIT_OK = 0
STARTUP_FAILURE = 3

DEFAULT_CONTEXT = 4096


def serve(config: WorkerConfig) -> int:
    """Run one worker until SIGTERM/SIGINT or its parent dies; return the exit code."""
    try:
        model, tokenizer, max_context = _load(config)
        channel = WorkerChannel(config.endpoint)
        channel.bind_control(config.control_endpoint or control_endpoint(config.endpoint))
    except Exception as exc:  # noqa: BLE001 - any load failure is a startup failure
        log.error("worker %s failed to start: %s", config.name, exc)
        return STARTUP_FAILURE
    encoder = PromptEncoder(tokenizer, _vocab_size(model, tokenizer), max_tokens=max_context)
    log.info(
        "prompts over %s characters are refused untokenized",
        None if encoder.max_token_chars is None else encoder.max_token_chars * max_context,
    )
    engine = Engine(
        name=config.name,
        runner=ModelRunner(model, encoder.eos_token_ids),
        scheduler=Scheduler(config.scheduler),
        encoder=encoder,
        channel=channel,
        max_context=max_context,
        embedder=Embedder(model),
    )
    engine.control = Control(
        engine, model_path=config.model, enable_test_faults=config.enable_test_faults
    )
    _install_signal_handlers(engine)
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
    finally:
        channel.close()
        channel.context.term()  # waits (briefly) until a shutdown's Ack is out
    log.info("worker %s stopped", config.name)
    return EXIT_OK


def _load(config: WorkerConfig) -> tuple[Any, Any, int]:
    import mlx_lm

    started = time.monotonic()
    log.info("loading %s ...", config.model)
    if not Path(config.model).exists() and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ConfigError(f"model {config.model!r} is not a local directory (offline)")
    model, tokenizer = mlx_lm.load(config.model)[:2]
    check_model_supported(model)
    max_context = config.max_context or _model_context(model)
    log.info("loaded %s in %.1f s", config.model, time.monotonic() - started)
    return model, tokenizer, max_context


def _model_context(model: Any) -> int:
    args = getattr(model, "args", None)
    value = getattr(args, "max_position_embeddings", None)
    return int(value) if value else DEFAULT_CONTEXT


def _vocab_size(model: Any, tokenizer: Any) -> int:
    args = getattr(model, "args", None)
    return int(getattr(args, "vocab_size", None) or len(tokenizer))


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


def configure_logging(name: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s worker[{name}] %(message)s",
    )
