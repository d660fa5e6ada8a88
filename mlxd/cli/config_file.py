"""`mlxd start --config FILE`: models and pool settings from a TOML file (stdlib tomllib).

max_memory = "75%"          # or "24GB"; the same as --max-memory
keep_alive = "10m"          # idle time before a worker unloads; 0 = never
kv_cache_gb = 1.0           # each model's KV budget unless it sets its own
chat_timeout = "15m"        # per-request timeouts (408 past them): chat and messages,
completion_timeout = "10m"  # completions,
embeddings_timeout = "2m"   # embeddings; the same as --chat-timeout etc.

[models.qwen]               # the name clients send
path = "mlx-community/Qwen3-0.6B-4bit"   # a local directory or a Hugging Face repo id
aliases = ["q", "small"]
keep_alive = 0              # never unload
pinned = true               # never unloaded to make room
preload = false             # load on its first request (default: at start)
dtype = "file"              # float weights as computed (default: --dtype, itself auto)
replicas = 2                # workers serving it, routed by prefix (default 1; --replicas wins)
group_size = 2              # processes per worker over mlx.distributed (tensor parallel)
distributed = "ring"        # their backend: ring or nccl (--group-size, --distributed win)

[models.big]                # workers already running elsewhere, one per replica (--worker)
workers = ["tcp://10.0.0.2:5555", "tcp://10.0.0.3:5555"]
fallbacks = ["cloud"]       # tried in turn when this model is unavailable

[backends.openai]           # a remote API (see backend_options.py and docs/BACKENDS.md)
kind = "openai"
base_url = "https://api.openai.com/v1"
api_key_env = "OPENAI_API_KEY"

[models.cloud]              # a model served by a backend
backend = "openai"
upstream_model = "gpt-4o-mini"
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxd.cli.backend_options import backend_table, fallbacks_of, remote_model_table
from mlxd.config import BackendSpec, ModelSpec, RemoteModelSpec
from mlxd.errors import ConfigError
from mlxd.knobs import Knob
from mlxd.serve_knobs import TOML_KNOBS
from mlxd.units import parse_duration

TOP_KEYS = {"models", "backends", *(k.toml for k in TOML_KNOBS)}
_KINDS = {int: "a whole number", str: "a string", bool: "true or false"}  # TOML's, in words
MODEL_KEYS = {
    "path",
    "aliases",
    "keep_alive",
    "pinned",
    "preload",
    "kv_cache_gb",
    "dtype",
    "fallbacks",
    "fallback",
    "fallback_on_busy",
    "replicas",
    "workers",
    "group_size",
    "distributed",
}


@dataclass(frozen=True)
class ConfigFile:
    """What a config file sets. ``settings``: the knobs its top-level keys set (``TOML_KNOBS``),
    by field, parsed (``{"keep_alive_s": 600.0}``); the command line wins over them."""

    models: tuple[ModelSpec, ...]
    settings: dict[str, object] = field(default_factory=dict)
    backends: tuple[BackendSpec, ...] = ()
    remote_models: tuple[RemoteModelSpec, ...] = ()  # [models.NAME] tables with a backend


def read_config_file(path: Path) -> ConfigFile:
    """Parse ``path``; every mistake is a ``ConfigError`` naming the file and the key."""
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    _no_unknown(doc, TOP_KEYS, str(path))
    models = doc.get("models", {})
    if not isinstance(models, dict):
        raise ConfigError(f"{path}: models must be tables: [models.NAME]")
    local = {n: t for n, t in models.items() if not (isinstance(t, dict) and "backend" in t)}
    specs = tuple(_model(name, table, f"{path}: [models.{name}]") for name, table in local.items())
    remote = tuple(
        remote_model_table(n, t, f"{path}: [models.{n}]")
        for n, t in models.items()
        if n not in local
    )
    backends = doc.get("backends", {})
    if not isinstance(backends, dict):
        raise ConfigError(f"{path}: backends must be tables: [backends.NAME]")
    return ConfigFile(
        models=specs,
        remote_models=remote,
        backends=tuple(backend_table(n, t, f"{path}: [backends.{n}]") for n, t in backends.items()),
        settings={
            k.field: _setting(k, doc[k.toml], f"{path}: {k.toml}")
            for k in TOML_KNOBS
            if doc.get(k.toml) is not None
        },
    )


def _setting(knob: Knob[object], value: Any, where: str) -> object:
    """A top-level key's ``value`` as its knob's field takes it, checked with the knob's range."""
    if knob.parse is not None:  # sizes and durations: text or a number
        value = knob.parse(value)
    elif knob.kind is float:
        value = _number(value, where)
    elif isinstance(value, bool) != (knob.kind is bool) or not isinstance(value, knob.kind):
        raise ConfigError(f"{where} must be {_KINDS[knob.kind]}")
    if not knob.is_valid(value):
        raise ConfigError(f"{where} must be {knob.bound}")
    return value


def _model(name: str, table: Any, where: str) -> ModelSpec:
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    _no_unknown(table, MODEL_KEYS, where)
    endpoints = _endpoints(table.get("workers", []), where)
    path, aliases = table.get("path", endpoints[0] if endpoints else None), table.get("aliases", [])
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{where}: path (a local directory or a repo id) is required")
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise ConfigError(f"{where}: aliases must be a list of names")
    for key in ("pinned", "preload", "fallback_on_busy"):
        if not isinstance(table.get(key, False), bool):
            raise ConfigError(f"{where}: {key} must be true or false")
    local = Path(path).expanduser()
    keep_alive = table.get("keep_alive")
    return ModelSpec(
        name=name,
        path=str(local.resolve()) if local.exists() else path,
        aliases=tuple(aliases),
        keep_alive_s=None if keep_alive is None else parse_duration(keep_alive),
        pinned=table.get("pinned", False),
        preload=table.get("preload", True),
        kv_cache_gb=_number(table.get("kv_cache_gb"), f"{where}: kv_cache_gb"),
        dtype=None if table.get("dtype") is None else str(table["dtype"]),
        fallbacks=fallbacks_of(table, where),
        fallback_on_busy=table.get("fallback_on_busy", False),
        replicas=_replicas(table.get("replicas", 1), where),
        group_size=_replicas(table.get("group_size", 1), where),
        distributed=str(table.get("distributed", "ring")),
        endpoint=endpoints[0] if endpoints else None,
        replica_endpoints=tuple(endpoints[1:]),
    )


def _replicas(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: replicas and group_size must be whole numbers >= 1")
    return value


def _endpoints(value: Any, where: str) -> list[str]:
    ok = isinstance(value, list) and all(isinstance(e, str) for e in value)
    if not ok or not all(e.startswith(("tcp://", "ipc://")) for e in value):
        raise ConfigError(f"{where}: workers must be a list of tcp:// or ipc:// endpoints")
    return list(value)


def _number(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where} must be a number")
    return float(value)


def _no_unknown(table: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; use {', '.join(sorted(known))}")
