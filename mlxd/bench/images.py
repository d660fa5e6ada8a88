"""Images a benchmark sends: PNG data URLs drawn from a seed, one of its own for every seed.

Each is a smooth gradient between four seeded corner colours with a seeded grid of tiles over
it, so two seeds never give the same bytes (a server keying its cache by image content must
not hit) and the file stays small (it compresses: a 448 x 448 image is tens of KB, not the
600 KB of noise). Drawn with numpy and the standard library's zlib, before the clock starts.
"""

from __future__ import annotations

import base64
import struct
import zlib
from functools import lru_cache

import numpy as np

_TILES = 8  # tiles a side: the seeded detail over the gradient


@lru_cache(maxsize=256)
def png_data_url(side: int, seed: int) -> str:
    """A ``side`` x ``side`` RGB PNG of ``seed`` as a ``data:`` URL."""
    png = encode_png(draw(side, seed))
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def draw(side: int, seed: int) -> np.ndarray:
    """The image of ``seed``: (side, side, 3) uint8."""
    rng = np.random.default_rng(seed)
    corners = rng.uniform(0, 255, size=(2, 2, 3))
    t = np.linspace(0.0, 1.0, side)[:, None, None]
    left = corners[0, 0] * (1 - t) + corners[1, 0] * t  # down the left edge
    right = corners[0, 1] * (1 - t) + corners[1, 1] * t
    s = np.linspace(0.0, 1.0, side)[None, :, None]
    image = left * (1 - s) + right * s
    tiles = rng.integers(-40, 40, size=(_TILES, _TILES, 3))
    cell = -(-side // _TILES)
    grid = np.repeat(np.repeat(tiles, cell, axis=0), cell, axis=1)[:side, :side]
    return np.clip(image + grid, 0, 255).astype(np.uint8)


def encode_png(pixels: np.ndarray) -> bytes:
    """An RGB uint8 array as PNG bytes (8-bit truecolour, no filter)."""
    height, width, _ = pixels.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), pixels.reshape(height, -1)], axis=1)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + b"".join(
            _chunk(kind, data)
            for kind, data in ((b"IHDR", header), (b"IDAT", zlib.compress(rows.tobytes(), 6)))
        )
        + _chunk(b"IEND", b"")
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)
