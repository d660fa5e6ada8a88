"""`mlxd bench failover`: streams against a model with fallbacks while its backend is killed
(mlxd/bench/failover.py); prints requests lost, cut, served by each model, time to fail over."""

from __future__ import annotations

import asyncio
import json
import os

import click

from mlxd.bench.failover import kill_process, run_failover, worker_pid


@click.command("failover")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True)
@click.option("--model", required=True, help="The primary model (it must list fallbacks).")
@click.option("--kill-pid", type=int, help="Kill this process (e.g. the upstream daemon).")
@click.option("--kill-worker", is_flag=True,
              help="Kill --model's local worker (its pid from /admin/overview).")  # fmt: skip
@click.option("--kill-after", default=4.0, show_default=True, help="Seconds into the run.")
@click.option("--duration", default=12.0, show_default=True, help="Seconds of traffic.")
@click.option("--concurrency", default=8, show_default=True)
@click.option("--max-tokens", default=32, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def failover_command(url: str, model: str, kill_pid: int | None, kill_worker: bool,
                     kill_after: float, duration: float, concurrency: int, max_tokens: int,
                     as_json: bool) -> None:  # fmt: skip
    """Kill the primary mid-run and measure how requests fail over.

    Lost: failed before their first token (the target is 0). Cut: failed mid-stream (the
    primary died under them; mlxd ends them with an error event, never a silent switch).
    """
    if (kill_pid is None) == (not kill_worker):
        raise click.UsageError("give exactly one of --kill-pid PID and --kill-worker")
    key = os.environ.get("MLXD_API_KEY")
    pid = kill_pid if kill_pid is not None else worker_pid(url, model, key)
    report = asyncio.run(run_failover(
        url, model, kill_process(pid), concurrency=concurrency, duration_s=duration,
        kill_after_s=kill_after, max_tokens=max_tokens, api_key=key,
        on_progress=lambda line: click.echo(line, err=True)))  # fmt: skip
    figures = report.summary()
    if as_json:
        click.echo(json.dumps(figures))
        return
    for name, value in figures.items():
        click.echo(f"{name:>12}  {value}")
