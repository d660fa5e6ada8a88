"""Images in chat requests: a client's image reference to the bytes a worker receives.

Every surface that takes images (OpenAI ``image_url`` parts today) hands the worker an
``ImageData``: the encoded file and its content digest, never a URL. Here the gateway checks
what it can without decoding pixels (the gateway never imports an image library): the
``data:`` URL's shape and base64, the size cap, the per-request count, and that the bytes start
like an image file; the worker decodes them off its MLX thread and refuses a corrupt one.
``http(s)`` URLs are refused for now (fetching them, with caps, is the next step).
"""

from __future__ import annotations

import base64
import binascii
import hashlib

from mlxd.errors import InvalidRequest
from mlxd.protocol.messages import ImageData
from mlxd.serve_knobs import MAX_IMAGE_BYTES, MAX_IMAGES

# Leading bytes of the formats the worker's decoder (PIL) reads.
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
)


class ImageParts:
    """The images of one request, in the order their parts appear, within the limits."""

    def __init__(
        self, max_images: int = MAX_IMAGES.default, max_bytes: int = MAX_IMAGE_BYTES.default
    ) -> None:
        self.images: list[ImageData] = []
        self.max_images = max_images
        self.max_bytes = max_bytes

    def add_url(self, url: object, where: str) -> None:
        """An ``image_url``'s ``url``: a ``data:`` URL with base64 image bytes."""
        if not isinstance(url, str) or not url:
            raise InvalidRequest(f"'{where}' must be a non-empty string", param=where)
        if url.startswith(("http://", "https://")):
            raise InvalidRequest(
                f"'{where}': image URLs are not fetched yet; send the image inline as a "
                "data: URL (data:image/png;base64,...)",
                param=where,
            )
        if not url.startswith("data:"):
            raise InvalidRequest(f"'{where}' must be a data: URL", param=where)
        self.add_bytes(_data_url_bytes(url, where, self.max_bytes), where)

    def add_bytes(self, data: bytes, where: str) -> None:
        if len(self.images) >= self.max_images:
            raise InvalidRequest(f"at most {self.max_images} images per request", param=where)
        if len(data) > self.max_bytes:
            raise InvalidRequest(
                f"'{where}' is {len(data)} bytes; at most {self.max_bytes} per image", param=where
            )
        if image_format(data) is None:
            raise InvalidRequest(
                f"'{where}' is not an image (PNG, JPEG, WebP, GIF or BMP)", param=where
            )
        digest = hashlib.blake2b(data, digest_size=16).hexdigest()
        self.images.append(ImageData(data=data, digest=digest))


def image_format(data: bytes) -> str | None:
    """The image format ``data`` starts like, or None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((name for magic, name in _MAGIC if data.startswith(magic)), None)


def _data_url_bytes(url: str, where: str, max_bytes: int) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise InvalidRequest(f"'{where}' must be a base64 data: URL", param=where)
    if len(payload) > (max_bytes + 2) // 3 * 4 + 4:  # refuse before decoding a huge string
        raise InvalidRequest(f"'{where}' is over {max_bytes} bytes per image", param=where)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"'{where}' has invalid base64", param=where) from None
