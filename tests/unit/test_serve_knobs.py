"""The daemon's and the gateway's settings (issue #37 point 4): each is one row of
mlxd/serve_knobs.py, and `mlxd start`'s option, ``ServeConfig``'s default and check, and the
config file's top-level key all come from that row."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import pytest

from mlxd.cli.config_file import TOP_KEYS, read_config_file
from mlxd.cli.start import start_command
from mlxd.config import (
    GatewayAuth,
    HeartbeatLimits,
    HttpLimits,
    ModelSpec,
    RequestTimeouts,
    RestartLimits,
    ServeConfig,
)
from mlxd.errors import ConfigError
from mlxd.knobs import KNOBS, Knob
from mlxd.serve_knobs import SERVE_KNOBS, TOML_KNOBS

MODELS = (ModelSpec(name="m", path="/p"),)
# ServeConfig's fields that are not settings of one value: the models, keys and backends that
# `mlxd start` parses from its other options, the worker's configs, and what has no option.
NOT_KNOBS = {
    "models",
    "scheduler",
    "cache",
    "api_keys",
    "curve_keys",
    "backends",
    "remote_models",
    "worker_start_timeout_s",
}
ROOT = Path(__file__).resolve().parents[2]


def _option(knob: Knob[object]) -> click.Option:
    options = [p for p in start_command.params if isinstance(p, click.Option)]
    return next(p for p in options if p.name == knob.param)


@pytest.mark.parametrize("knob", SERVE_KNOBS, ids=lambda k: k.field)
def test_start_option_is_the_knobs(knob: Knob[object]) -> None:
    option = _option(knob)
    assert option.opts == [knob.flag] and option.help == knob.help
    if knob.kind is bool and not knob.negatable:  # a plain flag: off unless given
        assert option.is_flag and not option.secondary_opts
    else:
        assert option.default == knob.option_default
    assert option.envvar == (knob.envvar or None) and option.metavar == (knob.metavar or None)


@pytest.mark.parametrize("knob", SERVE_KNOBS, ids=lambda k: k.field)
def test_serve_config_default_is_the_knobs(knob: Knob[object]) -> None:
    assert getattr(ServeConfig(models=MODELS), knob.field) == knob.default


def test_every_serve_config_setting_is_a_knob() -> None:
    fields = {f.name for f in dataclasses.fields(ServeConfig)} - NOT_KNOBS
    worker = {k.field for k in KNOBS if k.section == "worker"}
    assert fields == {k.field for k in SERVE_KNOBS} | worker


RANGED = [k for k in SERVE_KNOBS if k.minimum is not None]


@pytest.mark.parametrize("knob", RANGED, ids=lambda k: k.field)
def test_serve_config_rejects_out_of_range_with_the_knobs_rule(knob: Knob[object]) -> None:
    low = knob.minimum if knob.above else knob.minimum - 1  # type: ignore[operator]
    message = f"^{re.escape(knob.flag)} must be {re.escape(knob.rule)}$"
    with pytest.raises(ConfigError, match=message):
        ServeConfig(models=MODELS, **{knob.field: knob.kind(low)})


def test_a_parsed_options_default_is_text_so_it_is_parsed_once() -> None:
    for knob in SERVE_KNOBS:
        if knob.parse is not None:
            assert knob.option_default is None or isinstance(knob.option_default, str)


def test_from_options_without_options_is_the_defaults() -> None:
    assert ServeConfig.from_options({}, models=MODELS) == ServeConfig(models=MODELS)


def test_from_options_parses_given_text_and_the_option_beats_the_file() -> None:
    options = {
        "chat_timeout": "2m",
        "max_memory": "1GB",
        "request_log_size": "8KB",
        "heartbeat_timeout": 3.0,
        "kv_cache_gb": None,
    }
    file = {"chat_timeout_s": 5.0, "keep_alive_s": 7.0, "kv_cache_gb": 0.5}
    config = ServeConfig.from_options(options, file, models=MODELS)
    assert (config.chat_timeout_s, config.keep_alive_s, config.cache.kv_cache_gb) == (120, 7, 0.5)
    assert (config.max_memory_bytes, config.request_log_max_bytes) == (2**30, 8192)
    assert config.heartbeat_timeout_s == 3.0


def test_config_file_top_keys_are_the_tables() -> None:
    assert TOP_KEYS == {"models", "backends", *(k.toml for k in TOML_KNOBS)}
    keys = {k.toml for k in TOML_KNOBS}
    assert keys == {
        "max_memory",
        "keep_alive",
        "kv_cache_gb",
        "chat_timeout",
        "completion_timeout",
        "embeddings_timeout",
        "max_stored_responses",
        "stored_responses_size",
        "max_images",
        "max_image_bytes",
    }


@pytest.mark.parametrize(
    "text, needle",
    [
        ("chat_timeout = 0", "mlxd.toml: chat_timeout must be > 0$"),
        ('kv_cache_gb = "big"', "mlxd.toml: kv_cache_gb must be a number$"),
        ('max_memory = "lots"', "bad memory size 'lots'"),
    ],
)
def test_config_file_settings_are_checked_with_their_knobs(
    tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "mlxd.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        read_config_file(path)


def test_the_docs_setting_tables_name_only_real_options() -> None:
    """docs/BATCHING.md and docs/RELIABILITY.md keep hand-written tuning tables (default, what
    it does, when to change it); every flag they list must be an option of `mlxd start`."""
    options = [p for p in start_command.params if isinstance(p, click.Option)]
    flags = {o for p in options for o in (*p.opts, *p.secondary_opts)}
    for doc in ("BATCHING.md", "RELIABILITY.md"):
        rows = re.findall(r"^\| `(--[a-z-]+)", (ROOT / "docs" / doc).read_text(), re.MULTILINE)
        assert rows and set(rows) <= flags, (doc, set(rows) - flags)


@pytest.mark.parametrize(
    "cls", [RestartLimits, HeartbeatLimits, RequestTimeouts, HttpLimits, GatewayAuth]
)
def test_each_narrow_piece_is_serve_configs_fields(cls: type) -> None:
    config = ServeConfig(models=MODELS, max_crashes=2, step_timeout_s=9.0, chat_timeout_s=8.0)
    piece = config.piece(cls)
    for f in dataclasses.fields(cls):
        assert getattr(piece, f.name) == getattr(config, f.name)


def test_a_narrow_piece_checks_itself_with_the_knobs() -> None:
    with pytest.raises(ConfigError, match="^--crash-window must be > 0 seconds$"):
        RestartLimits(crash_window_s=0)
