"""`mlxd start --detach`: run the daemon in the background and return once it is healthy.

The same command runs again as a child in a new session (no terminal), with its output appended
to the data dir's log file and ``--claim-data-dir``, so the child writes and later removes the
pidfile itself. Meanwhile the parent passes the new log lines on as progress and polls ``/health``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from mlxd.daemon.daemon_files import DaemonFiles
from mlxd.errors import MlxdError

HEALTHY_WITHIN_S = 900.0  # a first start may download or make a model


def detach(files: DaemonFiles, url: str, args: list[str], progress: Callable[[str], None]) -> int:
    """Run ``python -m mlxd ARGS`` in the background; its pid once ``url`` is healthy.

    Args:
        files: the data dir's daemon files (the child's output goes to ``files.log_file``).
        url: where the child will listen.
        args: the child's command line after ``python -m mlxd``.
        progress: gets each new log line, and one line for each notable event.

    Raises:
        MlxdError: the child exited first, or was not healthy in time.
    """
    files.directory.mkdir(parents=True, exist_ok=True)
    with open(files.log_file, "ab") as log:
        offset = log.tell()
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlxd", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    progress(f"started (pid {proc.pid}); log: {files.log_file}")
    deadline = time.monotonic() + HEALTHY_WITHIN_S
    while time.monotonic() < deadline:
        offset = _pass_new_lines(files, offset, progress)
        if proc.poll() is not None:
            _pass_new_lines(files, offset, progress)
            raise MlxdError(
                f"mlxd exited with code {proc.returncode} before it was healthy; "
                f"see {files.log_file}"
            )
        if _healthy(url, progress) and files.running() is not None:
            return proc.pid
        time.sleep(0.25)
    raise MlxdError(
        f"mlxd (pid {proc.pid}) was not healthy within {HEALTHY_WITHIN_S:g} s; see {files.log_file}"
    )


def _healthy(url: str, progress: Callable[[str], None]) -> bool:
    """The daemon answers: ok, degraded (200: a model failed, it says which) or down (503: every
    model failed); either way the daemon runs and says why."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:  # noqa: S310 - ours
            body = resp.read()
            ok: bool = resp.status == 200
    except urllib.error.HTTPError as exc:
        if exc.code != 503:
            return False
        body, ok = exc.read(), True
    except (urllib.error.URLError, OSError):
        return False
    try:
        report = json.loads(body)
    except ValueError:
        return ok
    if isinstance(report, dict) and report.get("status") in ("degraded", "down"):
        progress(f"{report['status']}: {json.dumps(report.get('failed'))}")
    return ok


def _pass_new_lines(files: DaemonFiles, offset: int, progress: Callable[[str], None]) -> int:
    with open(files.log_file, "rb") as log:
        log.seek(offset)
        data = log.read()
    complete = data[: data.rfind(b"\n") + 1]
    for line in complete.decode(errors="replace").splitlines():
        progress(line)
    return offset + len(complete)
