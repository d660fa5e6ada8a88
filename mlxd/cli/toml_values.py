"""A `mlxd start --config` file's values read through their knobs: each TOML value checked
against its knob's type (every mistake a ``ConfigError`` naming the file, table and key), and
a table's unknown keys refused."""

from __future__ import annotations

from typing import Any

from mlxd.errors import ConfigError
from mlxd.knobs import Knob
from mlxd.model_knobs import TOML_SPELLINGS

# What TOML gives for each kind of knob, in words ("replicas must be an integer").
_KINDS = {int: "an integer", str: "a string", bool: "true or false"}


def knob_value(knob: Knob[object], value: Any, where: str) -> object:
    """The TOML ``value`` of ``knob`` as its field takes it (sizes and durations parsed, a list
    of names as a tuple). Its type only: the range is the config class's check."""
    if knob.parse is not None:  # sizes and durations: text or a number
        return knob.parse(value)
    if knob.kind is float:
        return number(value, where)
    if knob.kind is tuple:
        return names_list(value, where)
    if isinstance(value, bool) != (knob.kind is bool) or not isinstance(value, knob.kind):
        raise ConfigError(f"{where} must be {_KINDS[knob.kind]}")
    return value


def table_values(
    knobs: tuple[Knob[object], ...], table: dict[str, Any], where: str
) -> dict[str, Any]:
    """The knobs a TOML ``table`` sets, by field; an older spelling of a key counts as the key
    (the key itself wins)."""
    spelled = {**{TOML_SPELLINGS.get(key, key): v for key, v in table.items()}, **table}
    return {
        k.field: knob_value(k, spelled[k.toml], f"{where}: {k.toml}")
        for k in knobs
        if k.toml in spelled
    }


def number(value: Any, where: str) -> float | None:
    """A TOML integer or float as a float (None stays None)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where} must be a number")
    return float(value)


def names_list(value: Any, where: str) -> tuple[str, ...]:
    """A TOML list of non-empty names."""
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise ConfigError(f"{where} must be a list of names")
    return tuple(value)


def no_unknown(table: dict[str, Any], known: set[str], where: str) -> None:
    """Refuse a key of ``table`` not in ``known``, naming the ones it may have."""
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; use {', '.join(sorted(known))}")
