"""A directory of cache files held under a byte cap, least recently used out first.

Both disk tiers keep one (``disk_cache``: KV blocks; ``snapshot_disk``: whole-cache snapshots).
The index holds every file's size and last use in memory, read from the directory once at
start (sizes and modification times), so a save or a load costs no directory scan; a use
touches the file too, so a restarted worker keeps the order.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path


class CappedFiles:
    """The files named ``*<suffix>`` in ``root``, at most ``cap_bytes`` of them in all.

    Args:
        root: the directory (created).
        suffix: the files' suffix; other files are not this index's.
        cap_bytes: the most bytes the files may take.
        keep: which names found at start to index; the others are deleted (``keep`` says why
            with its own warning).
    """

    def __init__(
        self, root: Path, suffix: str, cap_bytes: int, keep: Callable[[str], bool] = bool
    ) -> None:
        self.root = root
        self.suffix = suffix
        self.cap_bytes = cap_bytes
        root.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, tuple[int, float]] = {}  # name -> (bytes, last use)
        for path in root.glob(f"*{suffix}"):
            if not keep(path.name):
                path.unlink(missing_ok=True)
                continue
            st = path.stat()
            self._files[path.name] = (st.st_size, st.st_mtime)
        self.nbytes = sum(n for n, _ in self._files.values())

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def __len__(self) -> int:
        return len(self._files)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._files))

    def path(self, name: str) -> Path:
        return self.root / name

    def used(self, name: str) -> None:
        """``name`` was read or wanted again: it goes out last."""
        now = time.time()
        self._files[name] = (self._files[name][0], now)
        os.utime(self.path(name), (now, now))

    def make_room(self, size: int) -> bool:
        """Delete the least recently used files until ``size`` more bytes fit; False when
        ``size`` is over the whole cap (nothing is deleted then)."""
        if size > self.cap_bytes:
            return False
        for name, _ in sorted(self._files.items(), key=lambda kv: kv[1][1]):
            if self.nbytes + size <= self.cap_bytes:
                break
            self.drop(name)
        return True

    def added(self, name: str) -> None:
        """``name`` was just written in ``root`` (after ``make_room`` for its size)."""
        size = self.path(name).stat().st_size
        self._files[name] = (size, time.time())
        self.nbytes += size

    def drop(self, name: str) -> None:
        """Forget ``name`` and delete its file."""
        size, _ = self._files.pop(name)
        self.nbytes -= size
        self.path(name).unlink(missing_ok=True)
