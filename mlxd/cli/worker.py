"""`mlxd worker ...`: run a worker process (spawned by `mlxd start`, or by hand)."""

from __future__ import annotations

import sys

import click

from mlxd.cli.start import scheduler_config, with_scheduler_options
from mlxd.config import WorkerConfig
from mlxd.errors import MlxdError


@click.group("worker")
def worker_group() -> None:
    """Run or talk to model workers."""


@worker_group.command("serve")
@click.option("--model", required=True, help="Local mlx-lm directory or Hugging Face repo id.")
@click.option("--name", default=None, help="The model name clients use (default: --model).")
@click.option("--bind", "endpoint", required=True, help="ZMQ endpoint, e.g. ipc:///tmp/w.sock.")
@click.option("--parent-pid", type=int, default=None, help="Exit when this process is gone.")
@click.option("--log-level", default="INFO", show_default=True)
@with_scheduler_options
def serve_command(model: str, name: str | None, endpoint: str, parent_pid: int | None,
                  log_level: str, **opts: object) -> None:  # fmt: skip
    """Load MODEL and serve it on ENDPOINT until SIGTERM."""
    from mlxd.worker.main import configure_logging, serve

    try:
        config = WorkerConfig(
            model=model,
            name=name or model,
            endpoint=endpoint,
            scheduler=scheduler_config(opts),
            max_context=opts["max_context"],  # type: ignore[arg-type]
            parent_pid=parent_pid,
        )
    except MlxdError as exc:
        raise click.ClickException(exc.message) from None
    configure_logging(config.name, log_level.upper())
    sys.exit(serve(config))
