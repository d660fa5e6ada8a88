"""What a request's images are held to (``ImageLimits``, from `mlxd start`'s image options),
and the limits in force while a surface parses a request.

A surface's parser is a plain function of the body (``request.Parser``); the limits reach the
``ImageParts`` it builds through a context variable that ``ApiRequest.parsed`` sets around the
parse, so no parser signature carries them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from mlxd.serve_knobs import (
    ALLOW_PRIVATE_IMAGE_URLS,
    IMAGE_FETCH_TIMEOUT,
    MAX_IMAGE_BYTES,
    MAX_IMAGES,
)

MAX_REDIRECTS = 3  # an image URL may redirect this often; more is a 400


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """How many images a request may carry, how large each may be, and how image URLs are
    fetched (how long, whether private addresses are allowed)."""

    max_images: int = MAX_IMAGES.default
    max_bytes: int = MAX_IMAGE_BYTES.default
    fetch_timeout_s: float = IMAGE_FETCH_TIMEOUT.default
    allow_private: bool = ALLOW_PRIVATE_IMAGE_URLS.default
    max_redirects: int = MAX_REDIRECTS


_DEFAULT = ImageLimits()
_LIMITS: ContextVar[ImageLimits | None] = ContextVar("image_limits", default=None)


def current_limits() -> ImageLimits:
    """The limits of the request being parsed (the defaults outside a request)."""
    return _LIMITS.get() or _DEFAULT


@contextmanager
def parsing_with(limits: ImageLimits) -> Iterator[None]:
    """Parse with ``limits`` in force."""
    token = _LIMITS.set(limits)
    try:
        yield
    finally:
        _LIMITS.reset(token)
