"""`mlxd keys`: each side's CURVE keypair and the peers it trusts, for tcp:// worker links.

On the gateway's host `mlxd keys new gateway`, on each worker's host `mlxd keys new worker`;
then each side trusts the other's public key (`mlxd keys trust worker KEY [--name MODEL]` on the
gateway's host, `mlxd keys trust gateway KEY` on the worker's). Only public keys are printed or
copied between hosts; secrets stay in the 0600 ``*.key`` files.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from mlxd.config import data_dir
from mlxd.errors import MlxdError
from mlxd.protocol import curve

_ROLE = click.Choice(curve.ROLES)
_T = TypeVar("_T")


@click.group("keys")
def keys_command() -> None:
    """CURVE keys for tcp:// links between the gateway and workers on other hosts."""


@keys_command.command("new")
@click.argument("role", type=_ROLE)
@click.option("--force", is_flag=True, help="Replace this side's keypair (rotation).")
def new_command(role: str, force: bool) -> None:
    """Make ROLE's keypair in the data dir (secret file mode 0600) and print its public key."""
    directory = curve.keys_dir(data_dir())
    keys = _run(lambda: curve.generate(directory, role, overwrite=force))
    click.echo(f"wrote {directory / f'{role}.key'} (secret, 0600) and {role}.pub")
    other = curve.ROLES[1 - curve.ROLES.index(role)]
    click.echo(f"public key: {keys.public.decode()}")
    click.echo(f"on each {other} host: mlxd keys trust {role} {keys.public.decode()}")


# A z85 key may start with "-" (one of its 85 characters): an argument, not an unknown option.
# With no short option on the command (help is --help alone) click keeps such a word whole; with
# -h it read a key holding an "h" as a call for help and trusted nothing (CI, stop 56).
_KEY_ARGS = {"ignore_unknown_options": True, "help_option_names": ["--help"]}


@keys_command.command("trust", context_settings=_KEY_ARGS)
@click.argument("role", type=_ROLE)
@click.argument("public_key")
@click.option(
    "--name",
    default="",
    help="(worker keys) the model this worker serves, when workers have different keys.",
)
def trust_command(role: str, public_key: str, name: str) -> None:
    """Accept the ROLE peer that holds PUBLIC_KEY's secret."""
    path = _run(lambda: curve.trust(curve.keys_dir(data_dir()), role, public_key, name))
    click.echo(f"added to {path}; restart the daemon or worker that reads it")


@keys_command.command("revoke", context_settings=_KEY_ARGS)
@click.argument("public_key")
def revoke_command(public_key: str) -> None:
    """Stop accepting PUBLIC_KEY (removed from both authorized lists)."""
    changed = curve.revoke(curve.keys_dir(data_dir()), public_key)
    if not changed:
        raise click.ClickException("that key is not in any authorized list")
    click.echo(f"removed from {', '.join(str(p) for p in changed)}; restart what reads it")


@keys_command.command("list")
def list_command() -> None:
    """This host's public keys and authorized peers (never a secret)."""
    directory = curve.keys_dir(data_dir())
    for role in curve.ROLES:
        keys = _load(directory, role)
        if keys is None:
            continue
        click.echo(f"{role} public key: {keys.public.decode()}")
        for key, name in keys.peers:
            click.echo(f"  trusts {key.decode()}{f' ({name})' if name else ''}")


def _load(directory: Path, role: str) -> curve.CurveKeys | None:
    return _run(lambda: curve.load(directory, role))


def _run(fn: Callable[[], _T]) -> _T:
    try:
        return fn()
    except MlxdError as exc:
        raise click.ClickException(exc.message) from None
