"""The detached daemon's files in the data dir: ``mlxd.pid``, ``mlxd.json`` and ``mlxd.log``.

The daemon itself claims the pidfile (``O_EXCL``, so two starts cannot both win) and removes it
when it exits; a pidfile whose process is gone (SIGKILL, a crash) is stale and is replaced.
``mlxd.json`` says where the daemon listens, so `mlxd status|stop|load` find it without --url.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlxd.errors import ConfigError


@dataclass(frozen=True)
class DaemonRecord:
    """What ``mlxd.json`` holds about a running daemon."""

    pid: int
    url: str
    log_file: str
    started_at: float  # time.time()


class DaemonFiles:
    """The pidfile, record and log file of the daemon that owns ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.pidfile = directory / "mlxd.pid"
        self.record_file = directory / "mlxd.json"
        self.log_file = directory / "mlxd.log"

    def running(self) -> DaemonRecord | None:
        """The live daemon that owns the data dir, or None (no pidfile, or a stale one)."""
        pid = _read_pid(self.pidfile)
        if pid is None or not is_mlxd(pid):
            return None
        try:
            data: dict[str, Any] = json.loads(self.record_file.read_text())
            return DaemonRecord(**data)
        except (OSError, ValueError, TypeError):
            return DaemonRecord(pid=pid, url="", log_file=str(self.log_file), started_at=0.0)

    def claim(self, url: str) -> None:
        """Write our pid (exclusively) and our record; ``ConfigError`` if a daemon owns it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.pidfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                other = self.running()
                if other is not None:
                    raise ConfigError(busy_message(self.directory, other)) from None
                self.pidfile.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as f:
                f.write(f"{os.getpid()}\n")
            record = DaemonRecord(os.getpid(), url, str(self.log_file), time.time())
            tmp = self.record_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(record)))
            tmp.replace(self.record_file)
            return
        raise ConfigError(f"cannot claim {self.pidfile}: another start is racing this one")

    def release(self) -> None:
        """Remove the pidfile and record if they are ours."""
        if _read_pid(self.pidfile) == os.getpid():
            self.record_file.unlink(missing_ok=True)
            self.pidfile.unlink(missing_ok=True)

    def remove_stale(self) -> None:
        """Remove the files of a daemon that is gone (after `mlxd stop --force`)."""
        if self.running() is None:
            self.record_file.unlink(missing_ok=True)
            self.pidfile.unlink(missing_ok=True)


def busy_message(directory: Path, other: DaemonRecord) -> str:
    where = f" at {other.url}" if other.url else ""
    return (
        f"mlxd is already running{where} (pid {other.pid}, data dir {directory}); "
        "stop it with `mlxd stop`"
    )


def is_mlxd(pid: int) -> bool:
    """Whether ``pid`` is alive and an mlxd process (a recycled pid is not ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True  # no /proc (macOS): trust the pid
    return b"mlxd" in cmdline and state != "Z"


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
