"""The snapshot prefix cache's disk tier: whole-cache snapshots of hybrid and sliding-window
models as files, size-capped, under the data directory (``--kv-disk-gb``).

A snapshot leaves memory for disk when the memory cache evicts it, when the prefix cache is
flushed and when the worker stops, so a restarted worker still hits it. One file per snapshot,
written with mlx-lm's own ``save_prompt_cache`` (every cache kind mlx-lm has, with its state),
in a directory named by the model's identity (``disk_cache.model_identity``) and named
``<tokens>-<prefix digest>-<content digest>.safetensors``: the prefix digest stands for the
token ids it holds (also in the file's metadata), the content digest for the file's bytes, so a
corrupt, truncated or foreign file is deleted with a warning and never loaded. Least recently
used files go first when the cap is reached (``capped_files``).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from mlxd.worker.prefix.capped_files import CappedFiles

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"


def prefix_digest(identity: str, tokens: tuple[int, ...]) -> str:
    h = hashlib.blake2b(identity.encode(), digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.hexdigest()


class DiskSnapshots:
    """Snapshot files of one model under ``root``, at most ``cap_bytes`` of them in all."""

    def __init__(self, root: Path, identity: str, cap_bytes: int) -> None:
        self.identity = identity
        self.files = CappedFiles(root, SUFFIX, cap_bytes, keep=_named_as_snapshot)
        # (tokens, prefix digest) -> its file's name
        self._names = {_key(name): name for name in self.files}

    def __len__(self) -> int:
        return len(self.files)

    @property
    def nbytes(self) -> int:
        return self.files.nbytes

    def save(self, tokens: tuple[int, ...], caches: list[Any]) -> bool:
        """Write a snapshot of exactly ``tokens`` (kept if there is one already)."""
        from mlx_lm.models.cache import save_prompt_cache

        key = (len(tokens), prefix_digest(self.identity, tokens))
        if key in self._names:
            return True
        tmp = self.files.path(f".{key[1]}.{os.getpid()}.tmp{SUFFIX}")
        try:
            save_prompt_cache(str(tmp), caches, {"model": self.identity, "digest": key[1]})
            fits = self.files.make_room(tmp.stat().st_size)
        except (ValueError, OSError) as exc:  # a cache kind mlx-lm cannot serialize
            log.warning("KV disk cache: a snapshot was not saved: %s", exc)
            fits = False
        if not fits:
            tmp.unlink(missing_ok=True)
            return False
        name = f"{key[0]}-{key[1]}-{_content_digest(tmp)}{SUFFIX}"
        tmp.replace(self.files.path(name))
        self.files.added(name)
        self._names[key] = name
        return True

    def match(self, tokens: list[int]) -> tuple[int, list[Any] | None]:
        """The longest snapshot on disk that is a proper prefix of ``tokens``: (its length, its
        caches), or (0, None). A bad file met on the way is deleted and the search goes on."""
        for n in sorted({n for n, _ in self._names}, reverse=True):
            if n >= len(tokens):
                continue
            key = (n, prefix_digest(self.identity, tuple(tokens[:n])))
            if key in self._names and (caches := self._load(key)) is not None:
                return n, caches
        return 0, None

    # Internal helpers

    def _load(self, key: tuple[int, str]) -> list[Any] | None:
        from mlx_lm.models.cache import load_prompt_cache

        name = self._names[key]
        path = self.files.path(name)
        if name.split("-")[2][: -len(SUFFIX)] != _content_digest(path):
            return self._forget(key, "its bytes do not match its digest (corrupt or truncated)")
        try:
            caches, meta = load_prompt_cache(str(path), return_metadata=True)
        except Exception as exc:  # noqa: BLE001 (any reader error means: not this file)
            return self._forget(key, f"unreadable ({exc})")
        if meta.get("model") != self.identity or meta.get("digest") != key[1]:
            return self._forget(key, "another model's or another prefix's snapshot")
        self.files.used(name)
        return list(caches)

    def _forget(self, key: tuple[int, str], why: str) -> None:
        name = self._names.pop(key)
        log.warning("KV disk cache: skipped %s: %s", name, why)
        self.files.drop(name)
        return None


def _named_as_snapshot(name: str) -> bool:
    parts = name[: -len(SUFFIX)].split("-")
    if len(parts) == 3 and parts[0].isdigit():
        return True
    log.warning("KV disk cache: skipped %s: a file not named as a snapshot", name)
    return False


def _key(name: str) -> tuple[int, str]:
    tokens, digest, _ = name[: -len(SUFFIX)].split("-")
    return int(tokens), digest


def _content_digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=12)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
