"""OpenAI ``image_url`` parts: data: URLs to ``ChatPrompt.images``; a bad one is a 400."""

from __future__ import annotations

import base64

import pytest

from mlxd.errors import InvalidRequest
from mlxd.gateway.images.fetch import PendingImage
from mlxd.gateway.images.formats import image_format
from mlxd.gateway.images.limits import ImageLimits, parsing_with
from mlxd.gateway.surfaces.images import ImageParts
from mlxd.gateway.surfaces.openai.schemas import parse_chat
from mlxd.protocol.messages import ChatPrompt

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 32  # the signature is all the gateway checks


def _url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _body(*urls: str) -> dict[str, object]:
    parts: list[dict[str, object]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    parts.append({"type": "text", "text": "what is this?"})
    return {"model": "m", "messages": [{"role": "user", "content": parts}]}


def test_data_url_images_become_image_parts_and_bytes_in_order() -> None:
    other = PNG + b"x"
    prompt = parse_chat(_body(_url(PNG), _url(other))).prompt
    assert isinstance(prompt, ChatPrompt) and prompt.images is not None
    assert [i.data for i in prompt.images] == [PNG, other]
    assert prompt.images[0].digest != prompt.images[1].digest
    assert prompt.messages[0]["content"] == [
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": "what is this?"},
    ]


def test_text_only_parts_stay_one_string() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
    }
    prompt = parse_chat(body).prompt
    assert isinstance(prompt, ChatPrompt)
    assert prompt.messages[0]["content"] == "a" and prompt.images is None


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("file:///etc/passwd", "data: or http"),
        ("data:image/png,rawbytes", "base64"),
        ("data:image/png;base64,!!!", "invalid base64"),
        (_url(b"GIF1 not really"), "not an image"),
    ],
)
def test_bad_image_urls_are_400s_naming_the_part(url: str, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words) as err:
        parse_chat(_body(url))
    assert err.value.param == "messages[0].content[0].image_url.url"


def test_limits_on_count_and_bytes() -> None:
    parts = ImageParts(ImageLimits(max_images=1, max_bytes=2048))
    parts.add_bytes(PNG, "a")
    with pytest.raises(InvalidRequest, match="at most 1 images"):
        parts.add_bytes(PNG, "b")
    with pytest.raises(InvalidRequest, match="over 2048 bytes"):
        ImageParts(ImageLimits(max_bytes=2048)).add_url(_url(PNG + b"\0" * 4096), "c")


def test_formats_by_their_leading_bytes() -> None:
    assert image_format(PNG) == "png"
    assert image_format(b"\xff\xd8\xff\xe0") == "jpeg"
    assert image_format(b"RIFF\0\0\0\0WEBPVP8 ") == "webp"
    assert image_format(b"II*\0") is None  # TIFF: the worker's processors do not take it


def test_the_limits_in_force_reach_the_parser() -> None:
    with parsing_with(ImageLimits(max_images=1)):
        with pytest.raises(InvalidRequest, match="at most 1 images"):
            parse_chat(_body(_url(PNG), _url(PNG)))
    assert len(parse_chat(_body(_url(PNG), _url(PNG))).prompt.images or ()) == 2


def test_an_http_url_is_left_pending_in_its_place() -> None:
    prompt = parse_chat(_body(_url(PNG), "https://example.com/a.png")).prompt
    assert isinstance(prompt, ChatPrompt) and prompt.images is not None
    pending = prompt.images[1]
    assert isinstance(pending, PendingImage) and pending.url == "https://example.com/a.png"
    assert prompt.images[0].data == PNG
