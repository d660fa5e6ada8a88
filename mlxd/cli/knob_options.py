"""The command-line options of the worker knobs (mlxd/knobs.py), shared by `mlxd start` and
`mlxd worker serve`, and the config values built from what they parse."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from mlxd.config import CacheConfig, SchedulerConfig
from mlxd.knobs import KNOBS, Knob, section

F = TypeVar("F", bound=Callable[..., Any])  # a command function, as click's decorators keep it


def knob_option(knob: Knob[object]) -> Callable[[F], F]:
    """``knob``'s click option: its flag, default, type (or choices) and help."""
    if knob.kind is bool:
        return click.option(f"{knob.flag}/--no-{knob.flag[2:]}", knob.param, default=knob.default,
                            show_default=True, help=knob.help)  # fmt: skip
    kind: Any = click.Choice(knob.choices) if knob.choices else knob.kind
    return click.option(knob.flag, knob.param, type=kind, default=knob.default,
                        show_default=knob.default is not None, help=knob.help)  # fmt: skip


def with_knob_options(fn: F) -> F:
    """Add every knob's option to the command ``fn``, in the table's order."""
    for knob in reversed(KNOBS):
        fn = knob_option(knob)(fn)
    return fn


def scheduler_config(opts: dict[str, object]) -> SchedulerConfig:
    """The scheduler knobs parsed into ``opts``, as a config value."""
    return SchedulerConfig(**{k.field: opts[k.param] for k in section("scheduler")})  # type: ignore[arg-type]


def cache_config(opts: dict[str, object]) -> CacheConfig:
    """The cache knobs parsed into ``opts``, as a config value."""
    return CacheConfig(**{k.field: opts[k.param] for k in section("cache")})  # type: ignore[arg-type]
