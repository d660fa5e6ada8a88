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
gpus = "0,1"                # the GPUs its workers run on (default: those no model names, in turn)

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

from mlxd.cli.backend_options import backend_table, remote_model_table
from mlxd.cli.toml_values import knob_value, no_unknown, table_values
from mlxd.config import BackendSpec, ModelSpec, RemoteModelSpec
from mlxd.errors import ConfigError
from mlxd.knobs import Knob
from mlxd.model_knobs import MODEL_KNOBS, TOML_SPELLINGS
from mlxd.serve_knobs import TOML_KNOBS

TOP_KEYS = {"models", "backends", *(k.toml for k in TOML_KNOBS)}
# A local model's table: where it is (``path``, or ``workers`` already running) and its knobs.
MODEL_KEYS = {"path", "workers", *TOML_SPELLINGS, *(k.toml for k in MODEL_KNOBS)}


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
    no_unknown(doc, TOP_KEYS, str(path))
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
    value = knob_value(knob, value, where)
    if not knob.is_valid(value):
        raise ConfigError(f"{where} must be {knob.bound}")
    return value


def _model(name: str, table: Any, where: str) -> ModelSpec:
    """A ``[models.NAME]`` table without ``backend``: its knobs' values typed here (errors name
    the file), their ranges checked by ``ModelSpec`` (errors name the model)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    no_unknown(table, MODEL_KEYS, where)
    endpoints = _endpoints(table.get("workers", []), where)
    path = table.get("path", endpoints[0] if endpoints else None)
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{where}: path (a local directory or a repo id) is required")
    settings = table_values(MODEL_KNOBS, table, where)
    local = Path(path).expanduser()
    return ModelSpec(
        name=name,
        path=str(local.resolve()) if local.exists() else path,
        endpoint=endpoints[0] if endpoints else None,
        replica_endpoints=tuple(endpoints[1:]),
        **settings,
    )


def _endpoints(value: Any, where: str) -> list[str]:
    ok = isinstance(value, list) and all(isinstance(e, str) for e in value)
    if not ok or not all(e.startswith(("tcp://", "ipc://")) for e in value):
        raise ConfigError(f"{where}: workers must be a list of tcp:// or ipc:// endpoints")
    return list(value)
