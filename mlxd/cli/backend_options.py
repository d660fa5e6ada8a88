"""`mlxd start` options and `--config` tables for remote backends (docs/BACKENDS.md).

Command line, for the simple case::

    --backend up=openai:http://gpu-box:8000/v1  --backend-key up=UP_API_KEY
    --model fast=up:qwen3-8b                    # NAME=BACKEND:UPSTREAM_MODEL
    --fallback local-qwen=fast                  # MODEL=FALLBACK[,FALLBACK...]

Config file::

    [backends.up]
    kind = "openai"                     # or "anthropic"
    base_url = "http://gpu-box:8000/v1"
    api_key_env = "UP_API_KEY"          # the variable's name; the key never goes in a file
    timeout = "30s"                     # silence before 504 (or failover); default 60s
    max_concurrency = 16                # more wait in line, high priority first
    breaker_failures = 5                # failures in a row that open the circuit breaker
    breaker_cooldown = "30s"            # then nothing is sent for this long, then one probe
    headers = { "OpenAI-Organization" = "org-1" }

    [models.fast]
    backend = "up"
    upstream_model = "qwen3-8b"         # default: the entry's name
    fallbacks = ["local-qwen"]          # any model entry may list them
    fallback_on_busy = true             # a 429 (queue full, upstream busy) fails over too
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from mlxd.backend_knobs import BACKEND_KNOBS
from mlxd.cli.toml_values import no_unknown, table_values
from mlxd.config import BackendSpec, ModelSpec, RemoteModelSpec
from mlxd.errors import ConfigError
from mlxd.model_knobs import ROUTE_KNOBS, TOML_SPELLINGS

_Spec = TypeVar("_Spec", ModelSpec, RemoteModelSpec)

# A backend's table: what it is and how it is reached, and its knobs.
BACKEND_KEYS = {"kind", "base_url", "api_key_env", "headers", *(k.toml for k in BACKEND_KNOBS)}
# A remote model's table: its backend and upstream name, and the knobs it shares with a local one.
REMOTE_MODEL_KEYS = {"backend", "upstream_model", *TOML_SPELLINGS, *(k.toml for k in ROUTE_KNOBS)}


def parse_backend_option(text: str, key_envs: dict[str, str]) -> BackendSpec:
    """``NAME=KIND:URL`` (``--backend``), with the key variable ``--backend-key`` gave it."""
    name, _, rest = text.partition("=")
    kind, _, url = rest.partition(":")
    if not name or not kind or not url:
        raise ConfigError(f"bad --backend {text!r}: use NAME=openai:URL or NAME=anthropic:URL")
    return BackendSpec(name=name, kind=kind, base_url=url, api_key_env=key_envs.get(name))


def parse_backend_keys(options: Iterable[str]) -> dict[str, str]:
    """``--backend-key NAME=ENV_VAR`` options -> backend name -> variable name."""
    out = {}
    for text in options:
        name, _, env = text.partition("=")
        if not name or not env or not env.isidentifier():
            raise ConfigError(
                f"bad --backend-key {text!r}: use NAME=ENV_VAR (the variable's "
                "name, never the key itself)"
            )
        out[name] = env
    return out


def parse_remote_model(text: str, backends: set[str]) -> RemoteModelSpec | None:
    """``NAME=BACKEND:UPSTREAM`` when BACKEND is one of ``backends``; ``None`` otherwise (a
    local model: a path, a repo id, ``ollama:NAME``)."""
    name, sep, rest = text.partition("=")
    backend, colon, upstream = rest.partition(":")
    if not sep or not colon or backend not in backends:
        return None
    if not name or not upstream:
        raise ConfigError(f"bad --model {text!r}: use NAME=BACKEND:UPSTREAM_MODEL")
    return RemoteModelSpec(name=name, backend=backend, upstream_model=upstream)


def parse_fallback_options(options: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``--fallback MODEL=OTHER[,OTHER...]`` options -> model -> its fallbacks in order."""
    out: dict[str, tuple[str, ...]] = {}
    for text in options:
        name, _, rest = text.partition("=")
        fallbacks = tuple(f for f in rest.split(",") if f)
        if not name or not fallbacks:
            raise ConfigError(f"bad --fallback {text!r}: use MODEL=FALLBACK[,FALLBACK...]")
        out[name] = out.get(name, ()) + fallbacks
    return out


def backend_table(name: str, table: Any, where: str) -> BackendSpec:
    """A ``[backends.NAME]`` table."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    no_unknown(table, BACKEND_KEYS, where)
    for key in ("kind", "base_url"):
        if not isinstance(table.get(key), str):
            raise ConfigError(f"{where}: {key} (a string) is required")
    headers = table.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ConfigError(f"{where}: headers must be a table of strings")
    key_env = table.get("api_key_env")
    if key_env is not None and (not isinstance(key_env, str) or not key_env.isidentifier()):
        raise ConfigError(f"{where}: api_key_env must name an environment variable")
    return BackendSpec(
        name=name,
        kind=table["kind"],
        base_url=table["base_url"],
        api_key_env=key_env,
        headers=tuple(headers.items()),
        **table_values(BACKEND_KNOBS, table, where),
    )


def remote_model_table(name: str, table: dict[str, Any], where: str) -> RemoteModelSpec:
    """A ``[models.NAME]`` table that has ``backend``."""
    no_unknown(table, REMOTE_MODEL_KEYS, where)
    backend, upstream = table.get("backend"), table.get("upstream_model", "")
    if not isinstance(backend, str) or not isinstance(upstream, str):
        raise ConfigError(f"{where}: backend and upstream_model must be strings")
    return RemoteModelSpec(
        name=name,
        backend=backend,
        upstream_model=upstream,
        **table_values(ROUTE_KNOBS, table, where),
    )


@dataclass(frozen=True)
class Routes:
    """What `mlxd start`'s options and config file say about backends and remote models."""

    local_models: tuple[str, ...]  # the --model options that name local models
    backends: tuple[BackendSpec, ...]
    remote_models: tuple[RemoteModelSpec, ...]
    fallbacks: dict[str, tuple[str, ...]]  # from --fallback

    def with_fallbacks(self, specs: tuple[_Spec, ...]) -> tuple[_Spec, ...]:
        """``specs`` with the ``--fallback`` lists added to the models they name."""
        names = {s.name for s in specs} | {r.name for r in self.remote_models}
        for name in self.fallbacks:
            if name not in names:
                raise ConfigError(f"--fallback {name}=...: no model named {name!r}")
        return tuple(
            replace(s, fallbacks=s.fallbacks + self.fallbacks.get(s.name, ())) for s in specs
        )


def cli_routes(
    models: tuple[str, ...],
    backends: Iterable[str],
    keys: Iterable[str],
    fallbacks: Iterable[str],
    file_backends: tuple[BackendSpec, ...],
    file_remote: tuple[RemoteModelSpec, ...],
) -> Routes:
    """Split the ``--model`` options into local and remote ones, and gather the backends."""
    key_envs = parse_backend_keys(keys)
    specs = (*file_backends, *(parse_backend_option(b, key_envs) for b in backends))
    names = {b.name for b in specs}
    for name in key_envs:
        if name not in names:
            raise ConfigError(f"--backend-key {name}=...: no backend named {name!r}")
    remote = [(m, parse_remote_model(m, names)) for m in models]
    return Routes(
        local_models=tuple(m for m, r in remote if r is None),
        backends=specs,
        remote_models=(*file_remote, *(r for _, r in remote if r is not None)),
        fallbacks=parse_fallback_options(fallbacks),
    )


def check_backend_keys(backends: Iterable[BackendSpec], environ: Mapping[str, str]) -> None:
    """Fail now (``ConfigError``, exit 2) when a backend's ``api_key_env`` is not set."""
    for backend in backends:
        backend.api_key(environ)
