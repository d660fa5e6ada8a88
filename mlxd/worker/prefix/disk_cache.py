"""The prefix cache's disk tier: KV blocks as files, size-capped, under the data directory.

One file per block, named by the block's chained hash (``block_digest``: the hash of its
parent's hash and its own tokens, so a name stands for the whole prefix up to that block), in a
directory named by the model's identity (``model_identity``: its config, weights and KV layout).
A file holds a magic line, a JSON header (model, digest, parent digest, the block's tokens, the
arrays' shapes and dtype, the payload's SHA-256) and the payload. A file is used only when every
one of those agrees; a corrupt, truncated or foreign file is deleted with a warning, never
loaded. Least recently used files go first when the cap is reached (``capped_files``). Pure
Python and NumPy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from pathlib import Path

import numpy as np

from mlxd.worker.prefix.capped_files import CappedFiles

log = logging.getLogger(__name__)

MAGIC = b"MLXDKV01"
SUFFIX = ".kvb"
_LEN = struct.Struct("<I")
_SAMPLE = 1 << 20  # bytes of each weight file's start and end hashed into the identity


def block_digest(parent: bytes, tokens: tuple[int, ...]) -> bytes:
    """The chained hash of a block: its parent's digest and its own token ids."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


def model_identity(model_dir: Path, layout: str) -> str:
    """A hash of ``model_dir``'s config.json and weight files (name, size, and the first and
    last MiB of each: hashing gigabytes at every start would cost seconds) and ``layout`` (the
    KV arrays' shapes, dtype and block size), so blocks never load into another model."""
    h = hashlib.sha256(layout.encode())
    for path in sorted(model_dir.glob("*.json")) + sorted(model_dir.glob("*.safetensors")):
        h.update(path.name.encode())
        size = path.stat().st_size
        h.update(str(size).encode())
        with path.open("rb") as f:
            h.update(f.read(_SAMPLE))
            if size > 2 * _SAMPLE:
                f.seek(-_SAMPLE, os.SEEK_END)
                h.update(f.read(_SAMPLE))
    return h.hexdigest()[:32]


class DiskKVCache:
    """Block files of one model under ``root``, at most ``cap_bytes`` of them in all.

    Args:
        root: the directory for this model's files (created).
        model_id: ``model_identity`` of the model; every file's header must carry it.
        cap_bytes: the most bytes the files may take.
    """

    def __init__(self, root: Path, model_id: str, cap_bytes: int) -> None:
        self.model_id = model_id
        self.num_skipped = 0  # files found bad and deleted
        self.files = CappedFiles(root, SUFFIX, cap_bytes)

    # Public API

    @property
    def nbytes(self) -> int:
        return self.files.nbytes

    def __contains__(self, digest: bytes) -> bool:
        return _name(digest) in self.files

    def __len__(self) -> int:
        return len(self.files)

    def save(
        self, digest: bytes, parent: bytes, tokens: tuple[int, ...], arrays: list[np.ndarray]
    ) -> bool:
        """Write one block (already there: only marked used); returns whether it is on disk."""
        name = _name(digest)
        if name in self.files:
            self.files.used(name)
            return True
        payload = b"".join(a.tobytes() for a in arrays)
        header = json.dumps(
            {
                "model": self.model_id,
                "digest": digest.hex(),
                "parent": parent.hex(),
                "tokens": list(tokens),
                "arrays": [[list(a.shape), str(a.dtype)] for a in arrays],
                "sha256": hashlib.sha256(payload).hexdigest(),
            }
        ).encode()
        if not self.files.make_room(len(MAGIC) + _LEN.size + len(header) + len(payload)):
            return False
        tmp = self.files.path(f".{name}.tmp")
        try:
            with tmp.open("wb") as f:
                f.write(MAGIC + _LEN.pack(len(header)) + header + payload)
            tmp.replace(self.files.path(name))
        except OSError as exc:
            log.warning("KV disk cache: could not write %s: %s", name, exc)
            tmp.unlink(missing_ok=True)
            return False
        self.files.added(name)
        return True

    def load(
        self, digest: bytes, parent: bytes, tokens: tuple[int, ...]
    ) -> list[np.ndarray] | None:
        """The arrays of one block, or None: absent, or bad (then deleted, with a warning)."""
        name = _name(digest)
        if name not in self.files:
            return None
        try:
            arrays = self._read(digest, parent, tokens)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("KV disk cache: skipped %s (%s); it is deleted", self.files.path(name), exc)
            self.num_skipped += 1
            self.files.drop(name)
            return None
        self.files.used(name)
        return arrays

    # Internal helpers

    def _read(self, digest: bytes, parent: bytes, tokens: tuple[int, ...]) -> list[np.ndarray]:
        data = self.files.path(_name(digest)).read_bytes()
        if not data.startswith(MAGIC):
            raise ValueError("not a block file")
        (n,) = _LEN.unpack_from(data, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        header = json.loads(data[start : start + n])
        payload = data[start + n :]
        expected = {
            "model": self.model_id,
            "digest": digest.hex(),
            "parent": parent.hex(),
            "tokens": list(tokens),
        }
        for key, value in expected.items():
            if header[key] != value:
                raise ValueError(f"{key} differs: another model or prefix")
        if hashlib.sha256(payload).hexdigest() != header["sha256"]:
            raise ValueError("checksum mismatch: truncated or corrupt")
        arrays, offset = [], 0
        for shape, dtype in header["arrays"]:
            count = int(np.prod(shape))
            a = np.frombuffer(payload, dtype=np.dtype(dtype), count=count, offset=offset)
            arrays.append(a.reshape(shape))
            offset += a.nbytes
        if offset != len(payload):
            raise ValueError("payload size differs from its arrays")
        return arrays


def _name(digest: bytes) -> str:
    return f"{digest.hex()}{SUFFIX}"
