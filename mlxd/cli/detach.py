"""`mlxd start --detach`: run the daemon in the background and return once it is healthy.

The same command runs again as a child in a new session (no terminal), with its output appended
to the data dir's log file and ``--claim-data-dir``, so the child writes and later removes the
pidfile itself. Meanwhile the parent prints the new log lines as progress and polls ``/health``.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request

import click

from mlxd.daemon.daemon_files import DaemonFiles

HEALTHY_WITHIN_S = 900.0  # a first start may download or make a model


def detach(files: DaemonFiles, url: str) -> int:
    """Start the daemon in the background; 0 once ``url`` is healthy, 1 if it exits first."""
    files.directory.mkdir(parents=True, exist_ok=True)
    args = [a for a in sys.argv[1:] if a != "--detach"] + ["--claim-data-dir"]
    with open(files.log_file, "ab") as log:
        offset = log.tell()
        proc = subprocess.Popen([sys.executable, "-m", "mlxd", *args], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True)  # fmt: skip
    click.echo(f"mlxd: started (pid {proc.pid}); log: {files.log_file}", err=True)
    deadline = time.monotonic() + HEALTHY_WITHIN_S
    while time.monotonic() < deadline:
        offset = _echo_new_lines(files, offset)
        if proc.poll() is not None:
            _echo_new_lines(files, offset)
            raise click.ClickException(f"mlxd exited with code {proc.returncode} before it was "
                                       f"healthy; see {files.log_file}")  # fmt: skip
        if _healthy(url) and files.running() is not None:
            click.echo(f"mlxd is running at {url} (pid {proc.pid})")
            return 0
        time.sleep(0.25)
    raise click.ClickException(f"mlxd (pid {proc.pid}) was not healthy within "
                               f"{HEALTHY_WITHIN_S:g} s; see {files.log_file}")  # fmt: skip


def _healthy(url: str) -> bool:
    """The daemon answers: ok, or degraded (a model failed; it says which, and the daemon runs)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:  # noqa: S310 - ours
            return bool(resp.status == 200)
    except urllib.error.HTTPError as exc:
        if exc.code != 503:
            return False
        click.echo(f"mlxd: degraded: {exc.read().decode(errors='replace')}", err=True)
        return True
    except (urllib.error.URLError, OSError):
        return False


def _echo_new_lines(files: DaemonFiles, offset: int) -> int:
    with open(files.log_file, "rb") as log:
        log.seek(offset)
        data = log.read()
    complete = data[: data.rfind(b"\n") + 1]
    for line in complete.decode(errors="replace").splitlines():
        click.echo(f"mlxd: {line}", err=True)
    return offset + len(complete)
