"""`mlxd start`: the gateway and one worker per model, in the foreground."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from mlxd import gpus
from mlxd.cli.api_keys import api_keys
from mlxd.cli.backend_options import check_backend_keys, cli_routes
from mlxd.cli.config_file import ConfigFile, read_config_file
from mlxd.cli.knob_options import knob_option, with_knob_options
from mlxd.config import DEFAULT_MODEL, ModelSpec, ServeConfig, data_dir
from mlxd.daemon import placement
from mlxd.daemon.daemon_files import DaemonFiles, busy_message
from mlxd.daemon.detach import detach
from mlxd.daemon.server import check_port_free
from mlxd.errors import ConfigError, MlxdError
from mlxd.gateway.http.request_log import FILE_NAME
from mlxd.knobs import given
from mlxd.model_knobs import DISTRIBUTED, GPUS, GROUP_SIZE, MODEL_OPTIONS, REPLICAS
from mlxd.protocol import curve
from mlxd.serve_knobs import (
    ADMIN_KEY,
    ALLOW_PRIVATE_IMAGE_URLS,
    CHAT_TIMEOUT,
    COMPLETION_TIMEOUT,
    CRASH_WINDOW,
    DRAIN_TIMEOUT,
    EMBEDDINGS_TIMEOUT,
    HEARTBEAT_TIMEOUT,
    HOST,
    IMAGE_FETCH_TIMEOUT,
    KEEP_ALIVE,
    LOG_PROMPTS,
    MAX_BODY_BYTES,
    MAX_CRASHES,
    MAX_IMAGE_BYTES,
    MAX_IMAGES,
    MAX_MEMORY,
    MAX_STORED_RESPONSES,
    OLLAMA_PORT,
    PORT,
    REQUEST_LOG,
    REQUEST_LOG_SIZE,
    RESTART_BACKOFF,
    ROUTING,
    STEP_TIMEOUT,
    STORED_RESPONSES_SIZE,
    STREAM_STALL_TIMEOUT,
)


@click.command("start")
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="[NAME=]PATH_OR_REPO",
    help="A model to serve (repeatable): a local mlx-lm directory, a Hugging Face repo id, a "
    "GGUF file or ollama:NAME[:TAG], optionally named. Default: the built-in model, made on "
    "first start.",
)
@click.option(
    "--worker",
    "workers",
    multiple=True,
    metavar="NAME=ENDPOINT",
    help="Attach a worker already running elsewhere (`mlxd worker serve --bind tcp://…`; "
    "its control socket is the next port). tcp:// needs the keys from `mlxd keys`. The same "
    "NAME again adds a replica.",
)
@knob_option(REPLICAS)
@knob_option(GROUP_SIZE)
@knob_option(DISTRIBUTED)
@knob_option(GPUS)
@knob_option(ROUTING)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="TOML file: [models.NAME] tables (path, aliases, keep_alive, pinned, preload, "
    "kv_cache_gb) and max_memory, keep_alive; command-line options win.",
)
@knob_option(MAX_MEMORY)
@knob_option(KEEP_ALIVE)
@click.option(
    "--detach",
    is_flag=True,
    help="Run in the background: pidfile and log file in the data dir; returns once healthy.",
)
@click.option("--claim-data-dir", is_flag=True, hidden=True)  # set by --detach for its child
@knob_option(HOST)
@knob_option(PORT)
@knob_option(OLLAMA_PORT)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.option(
    "--api-key",
    "api_key_values",
    multiple=True,
    metavar="KEY",
    envvar="MLXD_API_KEY",
    help="Require this key on /v1/* (repeatable; tier normal). MLXD_API_KEY or "
    "--api-keys-file keep it out of `ps`.",
)
@click.option(
    "--api-keys-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="TOML [[keys]] tables: name, key, tier (high|normal|low), "
    "requests_per_minute, tokens_per_minute.",
)
@knob_option(LOG_PROMPTS)
@knob_option(REQUEST_LOG)
@knob_option(REQUEST_LOG_SIZE)
@knob_option(ADMIN_KEY)
@knob_option(HEARTBEAT_TIMEOUT)
@knob_option(STEP_TIMEOUT)
@knob_option(DRAIN_TIMEOUT)
@knob_option(MAX_CRASHES)
@knob_option(CRASH_WINDOW)
@knob_option(RESTART_BACKOFF)
@knob_option(STREAM_STALL_TIMEOUT)
@knob_option(CHAT_TIMEOUT)
@knob_option(COMPLETION_TIMEOUT)
@knob_option(EMBEDDINGS_TIMEOUT)
@knob_option(MAX_BODY_BYTES)
@knob_option(MAX_STORED_RESPONSES)
@knob_option(STORED_RESPONSES_SIZE)
@knob_option(MAX_IMAGES)
@knob_option(MAX_IMAGE_BYTES)
@knob_option(IMAGE_FETCH_TIMEOUT)
@knob_option(ALLOW_PRIVATE_IMAGE_URLS)
@click.option(
    "--backend",
    "backends",
    multiple=True,
    metavar="NAME=KIND:URL",
    help="A remote API (kind openai or anthropic), e.g. up=openai:http://host:8000/v1; "
    "serve its models with --model NAME=BACKEND:UPSTREAM (docs/BACKENDS.md).",
)
@click.option(
    "--backend-key",
    "backend_keys",
    multiple=True,
    metavar="NAME=ENV_VAR",
    help="The environment variable holding backend NAME's API key (its name, never the key).",
)
@click.option(
    "--fallback",
    "fallbacks",
    multiple=True,
    metavar="MODEL=OTHER[,OTHER]",
    help="Models tried in turn when MODEL fails before its answer starts.",
)
@with_knob_options
def start_command(models: tuple[str, ...], log_level: str, **opts: Any) -> None:
    """Serve the OpenAI API on HOST:PORT until Ctrl-C or SIGTERM."""
    logging.basicConfig(
        level=log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        files = DaemonFiles(data_dir())
        running = files.running()
        if running is not None:  # checked first: before a default model is made
            raise ConfigError(busy_message(files.directory, running))
        config = _config(models, opts)
        placement.check(config.models, gpus.visible())  # a GPU list that cannot be: say so now
        check_port_free(config.host, config.port)
        if config.ollama_port is not None:
            check_port_free(config.host, config.ollama_port)
        from mlxd.models import sources  # GGUF files and ollama: names: converted once, here

        sources.prepare(config.models, config.dtype, _progress)
        if opts["detach"]:
            sys.exit(_detach(files, _url(config.host, config.port)))
        if opts["claim_data_dir"]:
            files.claim(_url(config.host, config.port))
    except MlxdError as exc:
        raise click.ClickException(exc.message) from None
    try:
        code = _serve(config, log_level)
    except MlxdError as exc:  # before the app started: e.g. a pinned model that does not fit
        raise click.ClickException(exc.message) from None
    finally:
        files.release()
    sys.exit(code)


def _config(models: tuple[str, ...], opts: dict[str, Any]) -> ServeConfig:
    """The options and the --config file as one config: the settings through the knob
    tables, the models, backends and keys parsed here."""
    path = opts["config_file"]
    file = read_config_file(path) if isinstance(path, Path) else ConfigFile(models=())
    attached = _parse_workers(opts["workers"])
    routes = cli_routes(
        models,
        opts["backends"],
        opts["backend_keys"],
        opts["fallbacks"],
        file.backends,
        file.remote_models,
    )
    check_backend_keys(routes.backends, os.environ)
    local = _model_specs(routes.local_models, file, bool(attached) or bool(routes.remote_models))
    local = _with_model_options(local, opts)
    # Without --request-log, `mlxd start` writes one in the data dir (ServeConfig's default: none).
    request_log = opts["request_log"] or str(data_dir() / FILE_NAME)
    return ServeConfig.from_options(
        {**opts, "request_log": request_log},
        file.settings,
        models=routes.with_fallbacks(local + attached),
        backends=routes.backends,
        remote_models=routes.with_fallbacks(routes.remote_models),
        curve_keys=_curve_keys((*attached, *file.models)),
        api_keys=api_keys(opts["api_key_values"], opts["api_keys_file"]),
    )


def _curve_keys(specs: tuple[ModelSpec, ...]) -> curve.CurveKeys | None:
    """The gateway's CURVE keys when any attached worker is on tcp:// (None: none is)."""
    tcp = [e for s in specs for e in s.endpoints if e.startswith("tcp://")]
    if not tcp:
        return None
    return curve.require(tcp[0], curve.load(curve.keys_dir(data_dir()), "gateway"))


def _detach(files: DaemonFiles, url: str) -> int:
    args = [a for a in sys.argv[1:] if a != "--detach"] + ["--claim-data-dir"]
    pid = detach(files, url, args, _progress)
    click.echo(f"mlxd is running at {url} (pid {pid})")
    return 0


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _model_specs(
    models: tuple[str, ...], file: ConfigFile, attached: bool = False
) -> tuple[ModelSpec, ...]:
    if file.models or attached:
        return (*file.models, *(_parse_model(m) for m in models))
    if not models:
        from mlxd.models.maker import ensure_default_model

        path = ensure_default_model(data_dir(), progress=_progress)
        return (ModelSpec(name=DEFAULT_MODEL, path=str(path)),)
    return tuple(_parse_model(m) for m in models)


def _parse_model(text: str) -> ModelSpec:
    name, sep, path = text.partition("=")
    if not sep:
        path = text
        p = Path(text).expanduser()
        name = p.name if p.exists() else text
    if not name or not path:
        raise ConfigError(f"bad --model {text!r}: use PATH, REPO_ID or NAME=PATH")
    local = Path(path).expanduser()
    return ModelSpec(name=name, path=str(local.resolve()) if local.exists() else path)


def _parse_workers(texts: tuple[str, ...]) -> tuple[ModelSpec, ...]:
    """One attached model per NAME; its endpoints in order are its replicas."""
    endpoints: dict[str, list[str]] = {}
    for text in texts:
        name, _, endpoint = text.partition("=")
        if not name or not endpoint.startswith(("tcp://", "ipc://")):
            raise ConfigError(f"bad --worker {text!r}: use NAME=tcp://HOST:PORT")
        endpoints.setdefault(name, []).append(endpoint)
    return tuple(
        ModelSpec(name=name, path=first, endpoint=first, replica_endpoints=tuple(more))
        for name, (first, *more) in endpoints.items()
    )


def _with_model_options(
    specs: tuple[ModelSpec, ...], opts: dict[str, Any]
) -> tuple[ModelSpec, ...]:
    """The model knobs' options given (``--replicas``, ``--group-size``, ``--distributed``,
    ``--gpus``) set for every local model: they win over the config file's keys."""
    changes = given(MODEL_OPTIONS, opts, {})
    return tuple(dataclasses.replace(s, **changes) for s in specs)


def _progress(line: str) -> None:
    click.echo(f"mlxd: {line}", err=True)


def _serve(config: ServeConfig, log_level: str) -> int:
    """The one call into the daemon's runtime (tests patch it to see the config)."""
    from mlxd.daemon import server  # uvicorn, the gateway and the supervisor: only to serve

    code = server.serve(config, log_level, _progress)
    atexit.register(_exit_at_once, code)  # the last registered: the first run at exit
    return code


def _exit_at_once(code: int) -> None:
    """A stopped daemon's exit, logs flushed, without the interpreter tearing down the gateway's
    560 modules one by one (0.2-0.3 s of every stop on a 2-core machine, for nothing)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
