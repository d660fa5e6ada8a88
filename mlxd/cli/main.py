"""`mlxd`: the click group and its commands, each imported when it runs (or is listed)."""

from __future__ import annotations

import importlib

import click

from mlxd import __version__

# name -> "module:attribute". `mlxd ps`, and every worker's `mlxd worker serve`, import only
# their own command: `mlxd bench`'s imports alone (numpy, httpx, rich) were 0.3 s of each.
COMMANDS = {
    "bench": "mlxd.cli.bench:bench_group",
    "keys": "mlxd.cli.keys:keys_command",
    "load": "mlxd.cli.service:load_command",
    "logs": "mlxd.cli.logs:logs_command",
    "make-model": "mlxd.cli.make_model:make_model_command",
    "ps": "mlxd.cli.ps:ps_command",
    "run": "mlxd.cli.run:run_command",
    "service": "mlxd.cli.login_service:service_group",
    "start": "mlxd.cli.start:start_command",
    "status": "mlxd.cli.service:status_command",
    "stop": "mlxd.cli.service:stop_command",
    "unload": "mlxd.cli.service:unload_command",
    "worker": "mlxd.cli.worker:worker_group",
}


class LazyGroup(click.Group):
    """A group whose commands (``COMMANDS``) are imported by name, when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, _, attribute = COMMANDS[cmd_name].partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command), COMMANDS[cmd_name]
        return command


@click.group(
    cls=LazyGroup,
    context_settings={"auto_envvar_prefix": "MLXD", "help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="mlxd")
def main() -> None:
    """mlxd: serve MLX models to many clients at once over the OpenAI API."""
