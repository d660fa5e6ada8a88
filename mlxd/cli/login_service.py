"""`mlxd service install|uninstall`: start the daemon at login, with the options given now.

On Linux a systemd user unit (``~/.config/systemd/user/mlxd.service``, enabled for
``default.target``); on macOS a launchd agent (``~/Library/LaunchAgents/local.mlxd.plist``, run
at load). Either runs ``mlxd start OPTIONS`` in the foreground, restarts it when it fails, and
appends its output to ``service.log`` in the data dir. `mlxd status` says whether one is
installed. Keys belong in ``--api-keys-file``: the file written here is not secret.
"""

from __future__ import annotations

import os
import plistlib
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import click

from mlxd.config import data_dir

PLATFORMS = ("systemd", "launchd")
LABEL, UNIT = "local.mlxd", "mlxd.service"
LOG_NAME = "service.log"
_NOT_IN_A_SERVICE = ("--detach", "--claim-data-dir")


@dataclass(frozen=True)
class LoginService:
    """The service manager's file for mlxd on one platform, and the commands that (de)activate it.

    Args:
        platform: ``systemd`` (Linux) or ``launchd`` (macOS).
        path: where that platform looks for the file.
    """

    platform: str
    path: Path

    def render(self, argv: list[str], log_file: Path, home: Path) -> str:
        """The unit or plist that runs ``argv`` at login, its output appended to ``log_file``."""
        env = {"MLXD_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        if self.platform == "launchd":
            log = str(log_file)
            plist = {
                "Label": LABEL,
                "ProgramArguments": argv,
                "EnvironmentVariables": env,
                "RunAtLoad": True,
                "KeepAlive": {"SuccessfulExit": False},
                "StandardOutPath": log,
                "StandardErrorPath": log,
            }
            return plistlib.dumps(plist).decode()
        return _SYSTEMD_UNIT.format(
            exec_start=" ".join(_systemd_quote(a) for a in argv),
            environment="\n".join(
                f"Environment={_systemd_quote(f'{k}={v}')}" for k, v in env.items()
            ),
            log=_systemd_quote(str(log_file)),
        )

    def activation(self, enable: bool) -> list[list[str]]:
        """The commands that make the manager (stop) run the file at login."""
        if self.platform == "launchd":
            return [["launchctl", "load" if enable else "unload", "-w", str(self.path)]]
        if enable:
            return [
                ["systemctl", "--user", "daemon-reload"],
                ["systemctl", "--user", "enable", UNIT],
            ]
        return [["systemctl", "--user", "disable", "--now", UNIT]]


def login_service(
    platform: str | None = None, environ: Mapping[str, str] | None = None
) -> LoginService:
    """This machine's login service (or ``platform``'s), found through ``environ``'s HOME."""
    env = os.environ if environ is None else environ
    home = Path(env.get("HOME") or Path.home())
    platform = platform or ("launchd" if sys.platform == "darwin" else "systemd")
    if platform == "launchd":
        return LoginService(platform, home / "Library" / "LaunchAgents" / f"{LABEL}.plist")
    config = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    return LoginService(platform, config / "systemd" / "user" / UNIT)


@click.group("service")
def service_group() -> None:
    """Start mlxd at login: a systemd user unit (Linux) or a launchd agent (macOS)."""


@service_group.command("install", context_settings={"ignore_unknown_options": True})
@click.option(
    "--platform",
    default=None,
    metavar="|".join(PLATFORMS),
    help="Default: launchd on macOS, systemd elsewhere.",
)
@click.option(
    "--enable/--no-enable",
    default=True,
    show_default=True,
    help="Also tell the service manager (else only write the file).",
)
@click.argument("start_options", nargs=-1, type=click.UNPROCESSED)
def install_command(platform: str | None, enable: bool, start_options: tuple[str, ...]) -> None:
    """Run `mlxd start START_OPTIONS` at every login (e.g. --model M --port 8000)."""
    service = login_service(_platform(platform))
    _check_start_options(list(start_options))
    home = data_dir()
    log_file = home / LOG_NAME
    argv = [sys.executable, "-m", "mlxd", "start", *start_options]
    service.path.parent.mkdir(parents=True, exist_ok=True)
    service.path.write_text(service.render(argv, log_file, home))
    shown = shlex.join(["mlxd", "start", *start_options])
    click.echo(f"wrote {service.path}: runs `{shown}` at login; log: {log_file}")
    if enable:
        _run(service.activation(enable=True))


@service_group.command("uninstall")
@click.option(
    "--platform",
    default=None,
    metavar="|".join(PLATFORMS),
    help="Default: launchd on macOS, systemd elsewhere.",
)
def uninstall_command(platform: str | None) -> None:
    """Stop starting mlxd at login and remove the file (a running daemon keeps running)."""
    service = login_service(_platform(platform))
    if not service.path.exists():
        raise click.ClickException(f"no mlxd login service is installed ({service.path})")
    if shutil.which(service.activation(enable=False)[0][0]):
        _run(service.activation(enable=False))
    service.path.unlink()
    click.echo(f"removed {service.path}")


# Internal helpers

_SYSTEMD_UNIT = """\
[Unit]
Description=mlxd: MLX models over the OpenAI API (written by `mlxd service install`)

[Service]
Type=simple
ExecStart={exec_start}
{environment}
StandardOutput=append:{log}
StandardError=append:{log}
Restart=on-failure
RestartSec=5
TimeoutStopSec=60

[Install]
WantedBy=default.target
"""


def _platform(platform: str | None) -> str | None:
    if platform is not None and platform not in PLATFORMS:
        raise click.ClickException(
            f"--platform must be one of {', '.join(PLATFORMS)}, not {platform!r}"
        )
    return platform


def _check_start_options(args: list[str]) -> None:
    """Parse ``args`` as `mlxd start` would, so a typo fails now rather than at every login."""
    from mlxd.cli.start import start_command

    if bad := [a for a in args if a in _NOT_IN_A_SERVICE]:
        raise click.ClickException(
            f"{bad[0]} makes no sense here: the service manager runs mlxd in the foreground"
        )
    try:
        start_command.make_context("start", list(args))
    except click.exceptions.Exit:
        raise click.ClickException("give `mlxd start` options, not --help") from None
    except click.UsageError as exc:
        raise click.ClickException(f"not an `mlxd start` option: {exc.format_message()}") from None


def _run(commands: list[list[str]]) -> None:
    for cmd in commands:
        if shutil.which(cmd[0]) is None:
            raise click.ClickException(
                f"{cmd[0]} not found: the file is written; run `{' '.join(cmd)}` where it exists"
            )
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            reason = " ".join((done.stderr or done.stdout).split()) or f"exit {done.returncode}"
            raise click.ClickException(f"`{' '.join(cmd)}` failed: {reason}")
        click.echo(f"ran `{' '.join(cmd)}`", err=True)


def _systemd_quote(arg: str) -> str:
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not any(c in arg for c in " \t\"'\\;"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
