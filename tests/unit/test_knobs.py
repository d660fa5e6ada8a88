"""The config spine (issue #25 point 5): every knob option of `mlxd start`, `mlxd worker serve`
and `mlxd worker set` comes from the one table in mlxd/knobs.py, so names, defaults and ranges
agree everywhere."""

from __future__ import annotations

import dataclasses

import click
import pytest

from mlxd.cli.start import start_command
from mlxd.cli.worker import serve_command, set_command
from mlxd.config import CacheConfig, SchedulerConfig, ServeConfig, WorkerConfig
from mlxd.errors import ConfigError
from mlxd.gateway import admin
from mlxd.knobs import KNOBS, LIVE_KNOBS, Knob
from mlxd.protocol.messages import SetConfig

KNOB_OPTIONS = {(c.name, k.field): (c, k) for c in (start_command, serve_command) for k in KNOBS}
CONFIGS = {"scheduler": (SchedulerConfig,), "cache": (CacheConfig,),
           "worker": (WorkerConfig, ServeConfig)}  # fmt: skip
_MINIMAL: dict[type, dict[str, object]] = {WorkerConfig: {"model": "m", "name": "m", "endpoint": "ipc:///tmp/w.sock"},
            ServeConfig: {"models": ()}}  # fmt: skip


def _option(command: click.Command, knob: Knob[object]) -> click.Option:
    return next(p for p in command.params if isinstance(p, click.Option) and p.name == knob.param)


@pytest.mark.parametrize(
    "command, knob", KNOB_OPTIONS.values(), ids=[f"{c}-{k}" for c, k in KNOB_OPTIONS]
)
def test_option_is_the_knobs(command: click.Command, knob: Knob[object]) -> None:
    option = _option(command, knob)
    assert option.opts == [knob.flag] and option.default == knob.default
    assert option.help == knob.help
    if knob.kind is bool:
        assert option.secondary_opts == [f"--no-{knob.flag[2:]}"]
    elif knob.choices:
        assert tuple(option.type.choices) == knob.choices  # type: ignore[attr-defined]
    else:
        assert option.type.name == knob.kind.__name__.replace("int", "integer")


@pytest.mark.parametrize("knob", KNOBS, ids=[k.field for k in KNOBS])
def test_config_defaults_are_the_knobs(knob: Knob[object]) -> None:
    for cls in CONFIGS[knob.section]:
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        assert fields[knob.field] == knob.default, cls.__name__


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.minimum is not None], ids=lambda k: k.field)
def test_config_rejects_out_of_range_with_the_knobs_rule(knob: Knob[object]) -> None:
    low = knob.minimum if knob.above else knob.minimum - 1  # type: ignore[operator]
    for cls in CONFIGS[knob.section]:
        if cls is ServeConfig:
            continue  # it needs models; WorkerConfig covers the same check
        with pytest.raises(ConfigError, match=f"^{knob.flag} must be {knob.rule}$"):
            cls(**_MINIMAL.get(cls, {}), **{knob.field: knob.kind(low)})
        if knob.maximum is not None:
            with pytest.raises(ConfigError, match=f"^{knob.flag} must be"):
                cls(**_MINIMAL.get(cls, {}), **{knob.field: knob.kind(knob.maximum + 1)})


def test_worker_set_takes_exactly_the_live_knobs() -> None:
    names = [k.field for k in LIVE_KNOBS]
    assert [f.name for f in dataclasses.fields(SetConfig) if f.name != "request_id"] == names
    assert admin.SETTABLE == {k.field: k.kind for k in LIVE_KNOBS}
    assert all(k.section == "scheduler" for k in LIVE_KNOBS)  # the control plane replaces these
    assert ", ".join(names) in (set_command.help or "")


def test_every_scheduler_and_cache_field_is_a_knob() -> None:
    fields = {f.name for cls in (SchedulerConfig, CacheConfig) for f in dataclasses.fields(cls)}
    assert fields == {k.field for k in KNOBS if k.section in ("scheduler", "cache")}
