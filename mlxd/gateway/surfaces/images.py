"""Images in chat requests: a client's image reference to the bytes a worker receives.

Every surface that takes images (OpenAI ``image_url`` parts, Anthropic ``image`` blocks,
Responses ``input_image`` parts, Ollama ``images``) hands the worker an ``ImageData``: the
encoded file and its content digest, never a URL. Here the gateway checks what it can without
decoding pixels (the gateway never imports an image library): the ``data:`` URL's shape and
base64, the size cap, the per-request count, and that the bytes start like an image file; the
worker decodes them off its MLX thread and refuses a corrupt one. An ``http(s)`` URL is left
pending and fetched once the request is parsed (gateway/images/fetch.py). The limits are the
request's (``current_limits``: `mlxd start`'s --max-images and --max-image-bytes).
"""

from __future__ import annotations

import base64
import binascii

from mlxd.errors import InvalidRequest
from mlxd.gateway.images.fetch import pending_image
from mlxd.gateway.images.formats import checked_image
from mlxd.gateway.images.limits import ImageLimits, current_limits
from mlxd.protocol.messages import ImageData


class ImageParts:
    """The images of one request, in the order their parts appear, within the limits."""

    def __init__(self, limits: ImageLimits | None = None) -> None:
        self.images: list[ImageData] = []
        self.limits = limits or current_limits()

    def add_url(self, url: object, where: str) -> None:
        """An image URL: a ``data:`` URL with base64 image bytes, or an ``http(s)`` URL."""
        if not isinstance(url, str) or not url:
            raise InvalidRequest(f"'{where}' must be a non-empty string", param=where)
        if url.startswith(("http://", "https://")):
            self._count(where)
            self.images.append(pending_image(url, where))
            return
        if not url.startswith("data:"):
            raise InvalidRequest(f"'{where}' must be a data: or http(s) URL", param=where)
        self.add_bytes(_data_url_bytes(url, where, self.limits.max_bytes), where)

    def add_base64(self, text: object, where: str) -> None:
        """Base64 image bytes (Anthropic's and Ollama's inline images)."""
        if not isinstance(text, str) or not text:
            raise InvalidRequest(f"'{where}' must be a non-empty base64 string", param=where)
        self.add_bytes(_base64_bytes(text, where, self.limits.max_bytes), where)

    def add_bytes(self, data: bytes, where: str) -> None:
        self._count(where)
        self.images.append(checked_image(data, where, self.limits.max_bytes))

    def _count(self, where: str) -> None:
        if len(self.images) >= self.limits.max_images:
            raise InvalidRequest(
                f"at most {self.limits.max_images} images per request", param=where
            )


def _data_url_bytes(url: str, where: str, max_bytes: int) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise InvalidRequest(f"'{where}' must be a base64 data: URL", param=where)
    return _base64_bytes(payload, where, max_bytes)


def _base64_bytes(payload: str, where: str, max_bytes: int) -> bytes:
    if len(payload) > (max_bytes + 2) // 3 * 4 + 4:  # refuse before decoding a huge string
        raise InvalidRequest(f"'{where}' is over {max_bytes} bytes per image", param=where)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"'{where}' has invalid base64", param=where) from None
