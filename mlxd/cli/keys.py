"""`mlxd keys`: make the CURVE keypair that tcp:// links between gateway and workers need."""

from __future__ import annotations

import click

from mlxd.config import data_dir
from mlxd.errors import MlxdError
from mlxd.protocol import curve


@click.command("keys")
@click.option("--force", is_flag=True, help="Replace an existing keypair.")
def keys_command(force: bool) -> None:
    """Make a CURVE keypair in the data dir (secret file mode 0600). Copy the keys directory
    to every host that runs a tcp:// worker or a gateway attaching one."""
    directory = curve.keys_dir(data_dir())
    try:
        keys = curve.generate(directory, overwrite=force)
    except MlxdError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"wrote {directory / curve.SECRET_FILE} (secret, 0600) and "
               f"{directory / curve.PUBLIC_FILE}")  # fmt: skip
    click.echo(f"public key: {keys.public.decode()}")
