"""A remote backend's settings: each is one row of mlxd/backend_knobs.py, and ``BackendSpec``'s
default and check and the ``[backends.NAME]`` key that sets it come from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mlxd.backend_knobs import BACKEND_KNOBS
from mlxd.cli.backend_options import BACKEND_KEYS
from mlxd.cli.config_file import read_config_file
from mlxd.config import BackendSpec
from mlxd.errors import ConfigError
from mlxd.knobs import Knob

# A value of each knob's TOML key other than its default, and the field's value it gives.
SET = {
    "timeout": ('"5s"', 5.0),
    "max_concurrency": ("3", 3),
    "breaker_failures": ("2", 2),
    "breaker_cooldown": ('"1m"', 60.0),
}


def _read(tmp_path: Path, text: str) -> BackendSpec:
    path = tmp_path / "mlxd.toml"
    path.write_text(f'[backends.up]\nkind = "openai"\nbase_url = "http://h"\n{text}\n')
    [backend] = read_config_file(path).backends
    return backend


def _spec(**knobs: object) -> BackendSpec:
    return BackendSpec(name="up", kind="openai", base_url="http://h", **knobs)  # type: ignore[arg-type]


def test_a_backends_keys_are_the_knobs() -> None:
    assert BACKEND_KEYS == {"kind", "base_url", "api_key_env", "headers", *SET}
    assert {k.toml for k in BACKEND_KNOBS} == set(SET)


@pytest.mark.parametrize("knob", BACKEND_KNOBS, ids=lambda k: k.toml)
def test_default_and_toml_key_are_the_knobs(tmp_path: Path, knob: Knob[object]) -> None:
    assert getattr(_spec(), knob.field) == knob.default
    text, value = SET[knob.toml]
    assert getattr(_read(tmp_path, f"{knob.toml} = {text}"), knob.field) == value != knob.default


@pytest.mark.parametrize("knob", BACKEND_KNOBS, ids=lambda k: k.toml)
def test_out_of_range_is_the_knobs_rule_from_spec_and_toml(
    tmp_path: Path, knob: Knob[object]
) -> None:
    low = knob.minimum if knob.above else knob.minimum - 1  # type: ignore[operator]
    message = f"^backend 'up': {re.escape(knob.toml)} must be {re.escape(knob.rule)}$"
    with pytest.raises(ConfigError, match=message):
        _spec(**{knob.field: knob.kind(low)})
    with pytest.raises(ConfigError, match=message):
        _read(tmp_path, f"{knob.toml} = {low:g}")
