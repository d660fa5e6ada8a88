"""Image formats by their leading bytes: what an image file is, without decoding it."""

from __future__ import annotations

import hashlib

from mlxd.errors import InvalidRequest
from mlxd.protocol.messages import ImageData

# Leading bytes of the formats the worker's decoder (PIL) reads.
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
)


def image_format(data: bytes) -> str | None:
    """The image format ``data`` starts like, or None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((name for magic, name in _MAGIC if data.startswith(magic)), None)


def media_type(image: ImageData) -> str:
    """The image's MIME type (``image/png``...), from its leading bytes."""
    return f"image/{image_format(image.data) or 'png'}"


def image_data(data: bytes) -> ImageData:
    """``data`` with its content digest, which keys its placeholders in the prefix cache."""
    return ImageData(data=data, digest=hashlib.blake2b(data, digest_size=16).hexdigest())


def checked_image(data: bytes, where: str, max_bytes: int) -> ImageData:
    """``data`` as an image of a request, once it is within ``max_bytes`` and starts like an
    image file; else ``InvalidRequest`` naming ``where``."""
    if len(data) > max_bytes:
        raise InvalidRequest(
            f"'{where}' is {len(data)} bytes; at most {max_bytes} per image", param=where
        )
    if image_format(data) is None:
        raise InvalidRequest(
            f"'{where}' is not an image (PNG, JPEG, WebP, GIF or BMP)", param=where
        )
    return image_data(data)
