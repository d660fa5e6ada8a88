"""Images on every surface, through remote backends, from URLs, within the image settings.

A tiny random LLaVA served by one daemon (``--max-images 2``, ``--max-image-pixels``,
``--image-fetch-timeout 2``, ``--allow-private-image-urls``): the same image and prompt through
the official ``anthropic`` (messages), ``openai`` (responses) and ``ollama`` (chat, generate)
clients answer what the OpenAI chat path answers greedily (which equals mlx-vlm's own
``generate``: test_vision.py). A front daemon relays images to it as two cloud backends
(``openai`` and ``anthropic`` kinds), and refuses loopback image URLs (the default). Image URLs
are fetched from a real HTTP server on 127.0.0.1: slow, huge, redirecting forever or not an
image is a 400; a too large or too small picture is a 400 and the worker serves on.
Needs the ``vision`` extra (mlx-vlm); skipped without it.
"""

from __future__ import annotations

import base64
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon
from tests.e2e.vision_parity import data_url, made, png

pytest.importorskip("mlx_vlm")
pytestmark = pytest.mark.e2e

QUESTION = "What is in this picture? Describe it."
N = 16  # greedy tokens (the Responses API's least max_output_tokens)
FETCH_TIMEOUT_S = 2


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header says ``width`` x ``height`` (its pixels are never decoded)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


IMAGE = png(11)


# The image server: a real HTTP server on 127.0.0.1


class _Images(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        routes = {
            "/a.png": lambda: self._send(IMAGE),
            "/moved.png": lambda: self._redirect("/a.png"),
            "/loop.png": lambda: self._redirect("/loop.png"),
            "/text.png": lambda: self._send(b"<html>not an image</html>"),
            "/slow.png": self._slow,
            "/huge.png": self._huge,
        }
        routes.get(self.path, lambda: self.send_error(404))()

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, to: str) -> None:
        self.send_response(302)
        self.send_header("Location", to)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _slow(self) -> None:
        time.sleep(FETCH_TIMEOUT_S + 3)
        try:
            self._send(IMAGE)
        except OSError:
            pass  # the gateway gave up at its timeout, as it should

    def _huge(self) -> None:
        """A PNG that never ends (no Content-Length): the fetch must stop at the cap."""
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        try:
            self.wfile.write(IMAGE[:64])
            for _ in range(64 * 1024):  # 1 GiB at most, should the cap fail
                self.wfile.write(b"\0" * 16384)
        except OSError:
            pass  # the gateway hung up at its cap

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def image_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# Daemons


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made(tmp_path_factory, "llava")


@pytest.fixture(scope="module")
def vlm(llava: Path) -> Iterator[Daemon]:
    d = start_daemon(
        llava,
        "--max-images",
        "2",
        "--max-image-bytes",
        "200000",
        "--max-image-pixels",
        "4000000",
        "--image-fetch-timeout",
        str(FETCH_TIMEOUT_S),
        "--allow-private-image-urls",
        name="llava",
    )
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


@pytest.fixture(scope="module")
def front(vlm: Daemon, tiny_model: Path) -> Iterator[Daemon]:
    """Remote models on the VLM daemon: ``gpt`` (an openai backend), ``claude`` (anthropic)."""
    d = start_daemon(
        tiny_model,
        "--max-context",
        "256",
        "--backend",
        f"up=openai:{vlm.base_url}/v1",
        "--model",
        "gpt=up:llava",
        "--backend",
        f"ant=anthropic:{vlm.base_url}/v1",
        "--model",
        "claude=ant:llava",
    )
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def _openai(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.base_url}/v1", api_key="x", max_retries=0)


def _anthropic(d: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=d.base_url, api_key="x", max_retries=0)


def _chat(d: Daemon, *urls: str, model: str = "llava") -> str:
    parts: list[Any] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    answer = _openai(d).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}],
        max_tokens=N,
        temperature=0,
    )
    return answer.choices[0].message.content or ""


def _messages(d: Daemon, image: bytes, model: str = "llava") -> str:
    data = base64.b64encode(image).decode()
    source = {"type": "base64", "media_type": "image/png", "data": data}
    answer = _anthropic(d).messages.create(
        model=model,
        max_tokens=N,
        extra_body={"temperature": 0},  # this client version has no temperature argument
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": source},  # type: ignore[typeddict-item]
                    {"type": "text", "text": QUESTION},
                ],
            }
        ],
    )
    return "".join(b.text for b in answer.content if b.type == "text")


@pytest.fixture(scope="module")
def expected(vlm: Daemon) -> str:
    """The OpenAI chat path's greedy answer for IMAGE and QUESTION."""
    text = _chat(vlm, data_url(IMAGE))
    assert text
    return text


# Every surface


def test_anthropic_image_blocks(vlm: Daemon, expected: str) -> None:
    assert _messages(vlm, IMAGE) == expected


def test_responses_input_image(vlm: Daemon, expected: str) -> None:
    response = _openai(vlm).responses.create(
        model="llava",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": data_url(IMAGE), "detail": "auto"},
                    {"type": "input_text", "text": QUESTION},
                ],
            }
        ],
        max_output_tokens=N,
        temperature=0,
    )
    assert response.output_text == expected


def test_ollama_images_in_chat_and_generate(vlm: Daemon, expected: str) -> None:
    client = ollama.Client(host=vlm.base_url, timeout=60)
    options = {"temperature": 0, "num_predict": N}
    chat = client.chat(
        model="llava",
        messages=[{"role": "user", "content": QUESTION, "images": [IMAGE]}],
        options=options,
    )
    assert chat.message.content == expected
    generated = client.generate(model="llava", prompt=QUESTION, images=[IMAGE], options=options)
    client._client.close()
    assert generated.response == expected


# Remote backends relay images


def test_remote_backends_relay_images(front: Daemon, expected: str) -> None:
    assert _chat(front, data_url(IMAGE), model="claude") == expected  # as an image block
    assert _messages(front, IMAGE, model="gpt") == expected  # as an image_url part


# The settings


def test_max_images_is_the_flag(vlm: Daemon) -> None:
    with pytest.raises(openai.BadRequestError, match="at most 2 images"):
        _chat(vlm, *[data_url(IMAGE)] * 3)


def test_max_image_bytes_is_the_flag(vlm: Daemon) -> None:
    big = png(12, (300, 300))  # random pixels: ~270 KB, over --max-image-bytes 200000
    with pytest.raises(openai.BadRequestError, match="200000"):
        _chat(vlm, data_url(big))


def test_too_many_or_too_few_pixels_are_400s_and_the_worker_serves_on(
    vlm: Daemon, expected: str
) -> None:
    with pytest.raises(openai.BadRequestError, match="20000x20000 pixels"):
        _chat(vlm, data_url(_png_header_only(20_000, 20_000)))
    with pytest.raises(openai.BadRequestError, match="3000x2000 pixels; at most 4000000"):
        _chat(vlm, data_url(_png_header_only(3000, 2000)))  # the flag's limit, not PIL's
    with pytest.raises(openai.BadRequestError, match="1x1 pixels"):
        _chat(vlm, data_url(png(13, (1, 1))))
    assert _chat(vlm, data_url(IMAGE)) == expected


# Image URLs


def test_an_image_url_is_fetched(vlm: Daemon, image_server: str, expected: str) -> None:
    assert _chat(vlm, f"{image_server}/a.png") == expected
    assert _chat(vlm, f"{image_server}/moved.png") == expected  # one redirect


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/slow.png", "took over"),
        ("/huge.png", "over 200000 bytes"),
        ("/loop.png", "redirects more than"),
        ("/text.png", "not an image"),
        ("/missing.png", "404"),
    ],
)
def test_bad_image_urls_are_400s(vlm: Daemon, image_server: str, path: str, words: str) -> None:
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError, match=words):
        _chat(vlm, f"{image_server}{path}")
    assert time.monotonic() - started < FETCH_TIMEOUT_S + 2  # nothing hangs


def test_a_loopback_url_is_refused_without_the_flag(front: Daemon, image_server: str) -> None:
    r = httpx.post(
        f"{front.base_url}/v1/messages",
        json={
            "model": "gpt",
            "max_tokens": N,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "url", "url": f"{image_server}/a.png"}}
                    ],
                }
            ],
        },
        timeout=30,
    )
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and "private" in r.json()["error"]["message"]
