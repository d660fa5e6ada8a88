"""The `mlxd` group: every command listed resolves to itself, and one imports only its own."""

from __future__ import annotations

import subprocess
import sys

import click

from mlxd.cli.main import COMMANDS, main


def test_every_listed_command_resolves_to_a_command_of_that_name() -> None:
    ctx = click.Context(main)
    names = main.list_commands(ctx)
    assert names == sorted(COMMANDS) and "start" in names and "worker" in names
    for name in names:
        command = main.get_command(ctx, name)
        assert isinstance(command, click.Command) and command.name == name
    assert main.get_command(ctx, "no-such-command") is None


def test_a_command_imports_its_own_module_only() -> None:
    """`mlxd ps` (and each worker's `mlxd worker serve`) skips `mlxd bench`'s imports."""
    code = (
        "import sys, click; from mlxd.cli.main import main; "
        "main.get_command(click.Context(main), 'ps'); "
        "print(' '.join(m for m in sys.modules if m.startswith('mlxd.cli.')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "mlxd.cli.ps" in loaded
    assert "mlxd.cli.bench" not in loaded and "mlxd.cli.start" not in loaded
