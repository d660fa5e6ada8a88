"""The request log file: every access-log line, with its time, in a size-capped rotating file.

The daemon appends one JSON object per request to ``$MLXD_HOME/requests.log`` (``--request-log``)
and rotates it at ``--request-log-size`` (default 10 MiB) into ``requests.log.1`` ..
``requests.log.3``, so the files never hold more than four times the cap. `mlxd logs` reads them
back, oldest line first. The file never holds a prompt, even with ``--log-prompts`` (that option
is for the terminal log), nor a key: the access line carries the key's name only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

from mlxd.config import REQUEST_LOG_MAX_BYTES

BACKUP_COUNT = 3
FILE_NAME = "requests.log"
_ACCESS_LOGGER = "mlxd.access"
_NEVER_WRITTEN = ("prompt",)


class RequestLogFile:
    """The rotating request log at ``path``: ``attach`` writes it (daemon), ``lines`` reads it.

    Args:
        path: the current file; rotated ones are ``path.1`` (newest) .. ``path.N``.
        max_bytes: rotate once the current file would grow past this.
    """

    def __init__(self, path: Path, max_bytes: int = REQUEST_LOG_MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes

    def attach(self) -> logging.Handler:
        """Write every ``mlxd.access`` line to the file from now on, whatever the log level.

        Below ``--log-level info`` the access logger is raised to INFO for the file's sake and
        stops propagating, so the terminal log stays as quiet as it was asked to be.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handler = RotatingFileHandler(
            self.path, maxBytes=self.max_bytes, backupCount=BACKUP_COUNT, encoding="utf-8"
        )
        handler.setFormatter(_LineFormatter())
        logger = logging.getLogger(_ACCESS_LOGGER)
        if not logger.isEnabledFor(logging.INFO):
            logger.setLevel(logging.INFO)
            logger.propagate = False
        logger.addHandler(handler)
        return handler

    def files(self) -> list[Path]:
        """The files that exist, oldest first (``path.3`` .. ``path.1``, ``path``)."""
        names = [self.path.with_name(f"{self.path.name}.{i}") for i in range(BACKUP_COUNT, 0, -1)]
        return [p for p in (*names, self.path) if p.is_file()]

    def lines(self) -> Iterator[dict[str, Any]]:
        """Every request in the files, oldest first; a line cut short by a crash is skipped."""
        for path in self.files():
            with open(path, encoding="utf-8", errors="replace") as f:
                for text in f:
                    try:
                        line = json.loads(text)
                    except ValueError:
                        continue
                    if isinstance(line, dict):
                        yield line


class _LineFormatter(logging.Formatter):
    """The access line with its UTC time first, and without the fields the file never holds."""

    def format(self, record: logging.LogRecord) -> str:
        try:
            fields = json.loads(record.getMessage())
        except ValueError:
            return json.dumps({"time": _iso(record.created), "message": record.getMessage()})
        for name in _NEVER_WRITTEN:
            fields.pop(name, None)
        line = {"time": _iso(record.created), **fields}
        return json.dumps(line, ensure_ascii=False, separators=(",", ":"))


def _iso(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
