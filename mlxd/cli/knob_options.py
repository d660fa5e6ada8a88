"""The command-line options of the knobs (mlxd/knobs.py, mlxd/serve_knobs.py): the worker's,
shared by `mlxd start` and `mlxd worker serve`, and the daemon's and gateway's of `mlxd start`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from mlxd.knobs import KNOBS, Knob

F = TypeVar("F", bound=Callable[..., Any])  # a command function, as click's decorators keep it


def knob_option(knob: Knob[Any]) -> Callable[[F], F]:
    """``knob``'s click option: its flag, default, type (or choices), help, metavar, env var."""
    named: dict[str, Any] = {"help": knob.help}
    if knob.envvar:
        named["envvar"] = knob.envvar
    if knob.metavar:
        named["metavar"] = knob.metavar
    if knob.kind is bool and not knob.negatable:
        return click.option(knob.flag, knob.param, is_flag=True, **named)
    if knob.kind is bool:
        flags = f"{knob.flag}/--no-{knob.flag[2:]}"
        return click.option(flags, knob.param, default=knob.default, show_default=True, **named)
    named["show_default"] = knob.option_default is not None
    return click.option(
        knob.flag, knob.param, type=_option_type(knob), default=knob.option_default, **named
    )


def _option_type(knob: Knob[Any]) -> Any:
    """What click parses the option's text into: text where the knob parses it itself."""
    if knob.choices:
        return click.Choice(knob.choices)
    if knob.parse is not None:
        return str
    if knob.click_range:
        return click.IntRange(min=int(knob.minimum or 0))
    return knob.kind


def with_knob_options(fn: F) -> F:
    """Add every worker knob's option to the command ``fn``, in the table's order."""
    for knob in reversed(KNOBS):
        fn = knob_option(knob)(fn)
    return fn
