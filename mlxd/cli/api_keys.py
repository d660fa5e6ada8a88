"""API keys from `mlxd start` options: ``--api-key KEY`` (repeatable) and ``--api-keys-file``.

The file is TOML, one ``[[keys]]`` table per key::

    [[keys]]
    name = "alice"              # for logs and limits; default "key-N"
    key = "sk-alice-..."
    tier = "high"               # high | normal | low (default normal): the request priority
    requests_per_minute = 60    # optional
    tokens_per_minute = 100000  # optional, prompt + completion tokens

Errors name the entry, never the key.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from mlxd.config import ApiKey
from mlxd.errors import ConfigError

# TOML field -> (ApiKey field, type, type's name in messages)
_FIELDS: dict[str, tuple[str, type, str]] = {
    "name": ("name", str, "a string"),
    "key": ("key", str, "a string"),
    "tier": ("tier", str, "a string"),
    "requests_per_minute": ("rpm", int, "an integer"),
    "tokens_per_minute": ("tpm", int, "an integer"),
}


def api_keys(cli_keys: tuple[str, ...], path: Path | None) -> tuple[ApiKey, ...]:
    """The keys of ``--api-key`` (tier normal, no limits) followed by those of the file."""
    keys = [ApiKey(name=f"key-{i}", key=key) for i, key in enumerate(cli_keys, 1)]
    if path is not None:
        keys += load_api_keys(path, first_index=len(keys) + 1)
    return tuple(keys)


def load_api_keys(path: Path, first_index: int = 1) -> list[ApiKey]:
    """Parse an ``--api-keys-file``; raise ``ConfigError`` naming the bad entry."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read --api-keys-file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--api-keys-file {path} is not valid TOML: {exc}") from None
    entries = doc.get("keys")
    if set(doc) - {"keys"} or not isinstance(entries, list) or not entries:
        raise ConfigError(f"--api-keys-file {path} must hold only [[keys]] tables, at least one")
    return [_api_key(entry, f"key-{i}") for i, entry in enumerate(entries, first_index)]


def _api_key(entry: Any, default_name: str) -> ApiKey:
    if not isinstance(entry, dict):
        raise ConfigError(f"API key {default_name!r} must be a table")
    name = entry.get("name")
    label = name if isinstance(name, str) and name else default_name
    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"API key {label!r}: unknown field(s) {', '.join(unknown)}")
    if "key" not in entry:
        raise ConfigError(f"API key {label!r} has no 'key'")
    values: dict[str, Any] = {"name": default_name}
    for toml_name, value in entry.items():
        field, kind, kind_name = _FIELDS[toml_name]
        if type(value) is not kind:  # exact: `true` is an int to Python, not a limit
            raise ConfigError(f"API key {label!r}: {toml_name} must be {kind_name}")
        values[field] = value
    return ApiKey(**values)
