"""`mlxd start`: the gateway and one worker per model, in the foreground."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from pathlib import Path

import click

from mlxd.cli.api_keys import api_keys
from mlxd.cli.backend_options import check_backend_keys, cli_routes
from mlxd.cli.config_file import ConfigFile, read_config_file
from mlxd.cli.knob_options import cache_config, scheduler_config, with_knob_options
from mlxd.config import (
    DEFAULT_MODEL,
    ModelSpec,
    ServeConfig,
    data_dir,
    parse_duration,
    parse_memory,
)
from mlxd.daemon.daemon_files import DaemonFiles, busy_message
from mlxd.daemon.detach import detach
from mlxd.daemon.server import check_port_free
from mlxd.errors import ConfigError, MlxdError
from mlxd.gateway.http.request_log import FILE_NAME
from mlxd.protocol import curve


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
@click.option(
    "--replicas",
    type=click.IntRange(min=1),
    default=None,
    help="Workers per local model (each its own process and KV cache); requests are routed "
    "by --routing. Default 1, or `replicas` in the model's [models.NAME] table.",
)
@click.option(
    "--group-size",
    type=click.IntRange(min=1),
    default=None,
    help="Processes per local worker over mlx.distributed: tensor parallel on mlx-lm models "
    "with shard(); rank 0 talks to the gateway (docs/ARCHITECTURE.md, scale-out). Default 1, "
    "or `group_size` in [models.NAME].",
)
@click.option(
    "--distributed",
    type=click.Choice(["ring", "nccl"]),
    default=None,
    help="The group's mlx.distributed backend: ring (TCP; CPU, Macs) or nccl (CUDA). "
    "Default ring, or `distributed` in [models.NAME].",
)
@click.option(
    "--routing",
    type=click.Choice(["cache_aware", "round_robin"]),
    default="cache_aware",
    show_default=True,
    help="How a request picks a model's replica: the one that served its prompt's prefix "
    "unless much busier (cache_aware), or in turn (round_robin).",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="TOML file: [models.NAME] tables (path, aliases, keep_alive, pinned, preload, "
    "kv_cache_gb) and max_memory, keep_alive; command-line options win.",
)
@click.option(
    "--max-memory",
    default=None,
    metavar="SIZE",
    help="Memory budget for all workers (weights + KV + headroom), e.g. 24GB or 75% (of the "
    "RAM); a model that does not fit unloads least recently used idle ones. On a host with "
    "several GPUs, each GPU's budget. Default: no budget.",
)
@click.option(
    "--keep-alive",
    default=None,
    metavar="DURATION",
    help="Unload a model's worker after this long idle (e.g. 300, 10m; 0 = never, the default).",
)
@click.option(
    "--detach",
    is_flag=True,
    help="Run in the background: pidfile and log file in the data dir; returns once healthy.",
)
@click.option("--claim-data-dir", is_flag=True, hidden=True)  # set by --detach for its child
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, help="Port to listen on.")
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
@click.option(
    "--log-prompts",
    is_flag=True,
    help="Put prompts in the access log (mlxd.access); off by default.",
)
@click.option(
    "--request-log",
    default=None,
    metavar="PATH|off",
    envvar="MLXD_REQUEST_LOG",
    help="Rotating file of one JSON line per request, never prompts or keys, for `mlxd logs` "
    "(env MLXD_REQUEST_LOG; default: requests.log in the data dir; off: none).",
)
@click.option(
    "--request-log-size",
    default="10MB",
    show_default=True,
    metavar="SIZE",
    help="Rotate the request log past this size; 3 older files are kept.",
)
@click.option(
    "--admin-key",
    default=None,
    metavar="KEY",
    envvar="MLXD_ADMIN_KEY",
    help="Let clients that send this key (Authorization: Bearer) use /admin/* over TCP; "
    "without one, admin is only reachable through the Unix socket this host's mlxd CLI uses.",
)
@click.option(
    "--heartbeat-timeout",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds a worker may leave a ping unanswered before it is killed and restarted.",
)
@click.option(
    "--step-timeout",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds one engine step may run (first kernel compiles included) before the worker "
    "is taken for hung, killed and restarted.",
)
@click.option(
    "--drain-timeout",
    type=float,
    default=10.0,
    show_default=True,
    help="On SIGTERM/Ctrl-C, seconds in-flight requests may still run before they are cut.",
)
@click.option(
    "--max-crashes",
    type=int,
    default=5,
    show_default=True,
    help="A worker that crashes this often within --crash-window is marked failed (not "
    "restarted again) until `mlxd load MODEL`.",
)
@click.option("--crash-window", type=float, default=60.0, show_default=True,
              help="Seconds over which --max-crashes counts a worker's crashes.")  # fmt: skip
@click.option("--restart-backoff", type=float, default=0.5, show_default=True,
              help="Seconds before restarting a crashed worker, doubled for each crash within "
              "--crash-window (at most 30 s).")  # fmt: skip
@click.option(
    "--stream-stall-timeout",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds a streaming client may read nothing before its stream is cut and cancelled.",
)
@click.option("--chat-timeout", default=None, metavar="DURATION",
              help="Longest a chat completion (or /v1/messages) may take before it is cut with "
              "408 (e.g. 900, 15m; default 15m, or chat_timeout in --config).")  # fmt: skip
@click.option("--completion-timeout", default=None, metavar="DURATION",
              help="The same for /v1/completions (default 10m).")  # fmt: skip
@click.option("--embeddings-timeout", default=None, metavar="DURATION",
              help="The same for /v1/embeddings (default 2m).")  # fmt: skip
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1024),
    default=8 * 1024 * 1024,
    show_default=True,
    help="Largest request body accepted; bigger ones get 413 before they are read.",
)
@click.option(
    "--backend",
    "backends",
    multiple=True,
    metavar="NAME=KIND:URL",
    help="A remote API (kind openai or anthropic), e.g. up=openai:http://host:8000/v1; "
    "serve its models with --model NAME=BACKEND:UPSTREAM (docs/BACKENDS.md).",
)
@click.option("--backend-key", "backend_keys", multiple=True, metavar="NAME=ENV_VAR",
              help="The environment variable holding backend NAME's API key (its name, never "
              "the key).")  # fmt: skip
@click.option("--fallback", "fallbacks", multiple=True, metavar="MODEL=OTHER[,OTHER]",
              help="Models tried in turn when MODEL fails before its answer starts.")  # fmt: skip
@with_knob_options
def start_command(models: tuple[str, ...], host: str, port: int, log_level: str,
                  **opts: object) -> None:  # fmt: skip
    """Serve the OpenAI API on HOST:PORT until Ctrl-C or SIGTERM."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")  # fmt: skip
    try:
        files = DaemonFiles(data_dir())
        running = files.running()
        if running is not None:  # checked first: before a default model is made
            raise ConfigError(busy_message(files.directory, running))
        path = opts["config_file"]
        file = read_config_file(path) if isinstance(path, Path) else ConfigFile(models=())
        max_memory = opts["max_memory"] or file.max_memory
        keep_alive = opts["keep_alive"]
        attached = _parse_workers(opts["workers"])  # type: ignore[arg-type]
        routes = cli_routes(models, opts["backends"], opts["backend_keys"], opts["fallbacks"],  # type: ignore[arg-type]
                            file.backends, file.remote_models)  # fmt: skip
        models = routes.local_models
        check_backend_keys(routes.backends, os.environ)
        tcp = [e for s in (*attached, *file.models) for e in s.endpoints if e.startswith("tcp://")]
        gateway_keys = curve.load(curve.keys_dir(data_dir()), "gateway") if tcp else None
        keys = curve.require(tcp[0], gateway_keys) if tcp else None
        config = ServeConfig(
            models=routes.with_fallbacks(
                _with_replicas(
                    _model_specs(models, file, bool(attached) or bool(routes.remote_models)),
                    opts["replicas"],  # type: ignore[arg-type]
                    opts["group_size"],  # type: ignore[arg-type]
                    opts["distributed"],  # type: ignore[arg-type]
                )
                + attached
            ),
            routing=str(opts["routing"]),
            backends=routes.backends,
            remote_models=routes.with_fallbacks(routes.remote_models),
            curve_keys=keys,
            max_memory_bytes=None if max_memory is None else parse_memory(str(max_memory)),
            keep_alive_s=file.keep_alive_s or 0.0
            if keep_alive is None
            else parse_duration(str(keep_alive)),  # fmt: skip
            host=host,
            port=port,
            scheduler=scheduler_config(opts),
            cache=cache_config(
                {**opts, "kv_cache_gb": file.kv_cache_gb} if opts["kv_cache_gb"] is None else opts
            ),
            max_context=opts["max_context"],  # type: ignore[arg-type]
            dtype=str(opts["dtype"]),
            api_keys=api_keys(opts["api_key_values"], opts["api_keys_file"]),  # type: ignore
            log_prompts=bool(opts["log_prompts"]),
            admin_key=opts["admin_key"],  # type: ignore[arg-type]
            heartbeat_timeout_s=opts["heartbeat_timeout"],  # type: ignore[arg-type]
            step_timeout_s=opts["step_timeout"],  # type: ignore[arg-type]
            drain_timeout_s=opts["drain_timeout"],  # type: ignore[arg-type]
            max_crashes=opts["max_crashes"],  # type: ignore[arg-type]
            crash_window_s=opts["crash_window"],  # type: ignore[arg-type]
            restart_backoff_s=opts["restart_backoff"],  # type: ignore[arg-type]
            max_body_bytes=opts["max_body_bytes"],  # type: ignore[arg-type]
            stream_stall_timeout_s=opts["stream_stall_timeout"],  # type: ignore[arg-type]
            **_timeouts(opts, file),
            request_log=_request_log_path(opts["request_log"]),  # type: ignore[arg-type]
            request_log_max_bytes=parse_memory(str(opts["request_log_size"])),
        )
        check_port_free(host, port)
        from mlxd.models import sources  # GGUF files and ollama: names: converted once, here

        sources.prepare(config.models, config.dtype, _progress)
        if opts["detach"]:
            sys.exit(_detach(files, _url(host, port)))
        if opts["claim_data_dir"]:
            files.claim(_url(host, port))
    except MlxdError as exc:
        raise click.ClickException(exc.message) from None
    try:
        code = _serve(config, log_level)
    finally:
        files.release()
    sys.exit(code)


def _timeouts(opts: dict[str, object], file: ConfigFile) -> dict[str, float]:
    """``{name}_timeout_s`` for each timeout the command line or the config file sets (the
    command line wins); the others keep ServeConfig's defaults."""
    out = {f"{name}_timeout_s": seconds for name, seconds in file.timeouts_s.items()}
    for name in ("chat", "completion", "embeddings"):
        value = opts[f"{name}_timeout"]
        if value is not None:
            out[f"{name}_timeout_s"] = parse_duration(str(value))
    return out


def _detach(files: DaemonFiles, url: str) -> int:
    args = [a for a in sys.argv[1:] if a != "--detach"] + ["--claim-data-dir"]
    pid = detach(files, url, args, _progress)
    click.echo(f"mlxd is running at {url} (pid {pid})")
    return 0


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _model_specs(models: tuple[str, ...], file: ConfigFile, attached: bool = False
                 ) -> tuple[ModelSpec, ...]:  # fmt: skip
    if file.models or attached:
        return (*file.models, *(_parse_model(m) for m in models))
    if not models:
        from mlxd.models.maker import ensure_default_model

        path = ensure_default_model(data_dir(), progress=_progress)
        return (ModelSpec(name=DEFAULT_MODEL, path=str(path)),)
    return tuple(_parse_model(m) for m in models)


def _request_log_path(option: str | None) -> str | None:
    if option == "off":
        return None
    return str(Path(option).expanduser()) if option else str(data_dir() / FILE_NAME)


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
    return tuple(ModelSpec(name=name, path=first, endpoint=first, replica_endpoints=tuple(more))
                 for name, (first, *more) in endpoints.items())  # fmt: skip


def _with_replicas(specs: tuple[ModelSpec, ...], replicas: int | None, group_size: int | None,
                   distributed: str | None) -> tuple[ModelSpec, ...]:  # fmt: skip
    """``--replicas``, ``--group-size`` and ``--distributed`` for every local model (they win
    over the config file's keys)."""
    given = {"replicas": replicas, "group_size": group_size, "distributed": distributed}
    changes = {k: v for k, v in given.items() if v is not None}
    return tuple(dataclasses.replace(s, **changes) for s in specs)  # type: ignore[arg-type]


def _progress(line: str) -> None:
    click.echo(f"mlxd: {line}", err=True)


def _serve(config: ServeConfig, log_level: str) -> int:
    """The one call into the daemon's runtime (tests patch it to see the config)."""
    from mlxd.daemon import server  # uvicorn, the gateway and the supervisor: only to serve

    return server.serve(config, log_level, _progress)
