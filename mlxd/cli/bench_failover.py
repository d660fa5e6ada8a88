"""`mlxd bench run --scenario failover`: streams against a model with fallbacks while its backend
is killed (mlxd/bench/failover.py); prints requests lost, cut, served by each model, and the
time to fail over. Its options join `bench run`'s."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from mlxd.bench.failover import kill_process, run_failover, worker_pid

F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS = (
    click.option(
        "--kill-pid", type=int, help="failover: kill this process (e.g. the upstream daemon)."
    ),
    click.option(
        "--kill-worker",
        is_flag=True,
        help="failover: kill --model's local worker (pid from /admin/overview).",
    ),
    click.option(
        "--kill-after", default=4.0, show_default=True, help="failover: seconds into the run."
    ),
    click.option(
        "--duration", default=12.0, show_default=True, help="failover: seconds of traffic."
    ),
)


def failover_options(fn: F) -> F:
    """Add the failover scenario's options to a command."""
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


def run_failover_scenario(o: dict[str, Any], concurrency: int) -> None:
    """Lost: failed before their first token (the target is 0). Cut: failed mid-stream (the
    primary died under them; mlxd ends them with an error event, never a silent switch)."""
    if (o["kill_pid"] is None) == (not o["kill_worker"]):
        raise click.UsageError("failover needs exactly one of --kill-pid PID and --kill-worker")
    if len(o["models"]) != 1:
        raise click.BadParameter("failover needs one --model (the primary)", param_hint="--model")
    model, key = o["models"][0], o["api_key"] or os.environ.get("MLXD_API_KEY")
    pid = o["kill_pid"] if o["kill_pid"] is not None else worker_pid(o["url"], model, key)
    report = asyncio.run(
        run_failover(
            o["url"],
            model,
            kill_process(pid),
            concurrency=concurrency,
            duration_s=o["duration"],
            kill_after_s=o["kill_after"],
            max_tokens=o["max_tokens"],
            api_key=key,
            on_progress=lambda line: click.echo(line, err=True),
        )
    )
    figures = {
        "scenario": "failover",
        "model": model,
        "concurrency": concurrency,
        **report.summary(),
    }
    if o["json_path"] is not None:
        o["json_path"].write_text(json.dumps(figures, indent=1) + "\n")
    for name, value in figures.items():
        click.echo(f"{name:>12}  {value}")
