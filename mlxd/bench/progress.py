"""A one-line progress bar on stderr: redrawn in place on a terminal, one line per run otherwise
(so logs of unattended runs stay short)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

_WIDTH = 24


class Progress:
    """Counts finished requests of one run.

    Args:
        label: what runs, e.g. ``c=16 run 1/3``.
        total: how many requests the run sends.
        stream: where to draw (stderr).
    """

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label, self.total = label, max(total, 1)
        self.stream = stream or sys.stderr
        self.done = self.failed = 0
        self.t0 = time.perf_counter()
        self.is_tty = self.stream.isatty()
        self._draw()

    def advance(self, failed: bool = False) -> None:
        self.done += 1
        self.failed += failed
        if self.is_tty:
            self._draw()

    def close(self) -> None:
        self._draw(end="\n")

    def line(self) -> str:
        filled = _WIDTH * min(self.done, self.total) // self.total
        bar = "#" * filled + "." * (_WIDTH - filled)
        failed = f", {self.failed} failed" if self.failed else ""
        elapsed = time.perf_counter() - self.t0
        return f"{self.label:<24} [{bar}] {self.done}/{self.total}{failed} {elapsed:6.1f}s"

    def _draw(self, end: str = "") -> None:
        if self.is_tty:
            self.stream.write("\r" + self.line() + end)
        elif end:
            self.stream.write(self.line() + end)
        self.stream.flush()
