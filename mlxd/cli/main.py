"""`mlxd`: the click group and its commands."""

from __future__ import annotations

import click

from mlxd import __version__


@click.group(context_settings={"auto_envvar_prefix": "MLXD", "help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mlxd")
def main() -> None:
    """mlxd: serve MLX models to many clients at once over the OpenAI API."""


def _register() -> None:
    from mlxd.cli.bench import bench_group
    from mlxd.cli.keys import keys_command
    from mlxd.cli.login_service import service_group
    from mlxd.cli.logs import logs_command
    from mlxd.cli.make_model import make_model_command
    from mlxd.cli.ps import ps_command
    from mlxd.cli.run import run_command
    from mlxd.cli.service import load_command, status_command, stop_command, unload_command
    from mlxd.cli.start import start_command
    from mlxd.cli.worker import worker_group

    main.add_command(start_command)
    main.add_command(make_model_command)
    main.add_command(worker_group)
    main.add_command(bench_group)
    main.add_command(ps_command)
    main.add_command(status_command)
    main.add_command(stop_command)
    main.add_command(load_command)
    main.add_command(unload_command)
    main.add_command(keys_command)
    main.add_command(logs_command)
    main.add_command(run_command)
    main.add_command(service_group)


_register()
