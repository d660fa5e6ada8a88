"""What a vision model costs and does, as the daemon shows it, and image URLs' secrets kept.

A real daemon serving the tiny random LLaVA (``--allow-private-image-urls``, a 2 s fetch
timeout) beside a text model:

- `mlxd ps` shows the vision tower's weights (from the checkpoint's headers) and the
  encoder's peak reserved in the footprint (issue 39 point 5); a text model shows none.
- ``/metrics`` has images per second beside the image and encoder-time counters, and the
  status page (a real headless Chromium, where installed) shows images, images/s, the
  encoder's time and the vision memory.
- An image URL's ``user:password@`` and query string (a key) are in no error the official
  ``openai`` client gets back (a 404, a redirect loop, a refused connection, a timeout, a
  malformed port), nor in the daemon's log at debug level.

Needs the ``vision`` extra (mlx-vlm); skipped without it.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import Daemon, free_port, start_daemon, stop_daemon

pytest.importorskip("mlx_vlm")
pytestmark = pytest.mark.e2e

SECRETS = ("hunter2", "sk-live-8f3a", "sig-77c1")
FETCH_TIMEOUT_S = 2


def _png(seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (90, 130, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


class _Server(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?")[0]
        if path == "/loop.png":  # redirects to itself, its key in the Location each time
            self.send_response(302)
            self.send_header("Location", f"/loop.png?key={SECRETS[1]}")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/slow.png":
            time.sleep(FETCH_TIMEOUT_S + 2)
        else:
            self.send_error(404)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlxd.models.vlm_maker import make_vlm

    return make_vlm(tmp_path_factory.mktemp("vlm") / "llava", progress=lambda line: None)


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("log") / "daemon.log"


@pytest.fixture(scope="module")
def vlm(llava: Path, tiny_model: Path, log_file: Path) -> Iterator[Daemon]:
    with log_file.open("wb") as log:
        d = start_daemon(
            llava,
            "--model",
            f"text={tiny_model}",
            "--allow-private-image-urls",
            "--image-fetch-timeout",
            str(FETCH_TIMEOUT_S),
            "--log-level",
            "debug",
            name="llava",
            stderr=log,
        )
        yield d
        if d.proc.poll() is None:
            stop_daemon(d)


@pytest.fixture(scope="module")
def client(vlm: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{vlm.base_url}/v1", api_key="unused", max_retries=0)


def _chat(client: openai.OpenAI, url: str) -> Any:
    content = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is in this picture?"},
    ]
    return client.chat.completions.create(
        model="llava",
        messages=[{"role": "user", "content": content}],  # type: ignore[misc,list-item]
        max_tokens=4,
        temperature=0,
    )


def _mlxd_ps(daemon: Daemon, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("MLXD_URL", "MLXD_ADMIN_KEY")}
    env["MLXD_URL"] = daemon.base_url
    r = subprocess.run(
        [sys.executable, "-m", "mlxd", "ps", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


# The footprint


def test_ps_shows_the_towers_weights_and_the_encoders_peak(vlm: Daemon, llava: Path) -> None:
    from mlxd.models.vision_layout import encoder_peak_bytes, vision_weight_bytes

    rows = {r["name"]: r for r in json.loads(_mlxd_ps(vlm, "--json"))["models"]}
    config = json.loads((llava / "config.json").read_text())
    assert rows["llava"]["vision_weights_bytes"] == vision_weight_bytes(llava) > 0
    assert rows["llava"]["encoder_peak_bytes"] == encoder_peak_bytes(config, 4) > 0  # float32
    assert rows["text"]["vision_weights_bytes"] == rows["text"]["encoder_peak_bytes"] == 0
    status = {m["name"]: m for m in vlm.admin_get("/admin/status").json()["models"]}
    peak = status["llava"]["encoder_peak_bytes"]
    assert status["text"]["memory_bytes"] > 0 and peak == rows["llava"]["encoder_peak_bytes"]
    table = {line.split()[0]: line for line in _mlxd_ps(vlm).splitlines()[1:]}
    assert "encoder peak" in table["llava"] and "vision" not in table["text"]


# Secrets in image URLs


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/missing.png", "answered 404"),
        ("/loop.png", "redirects more than"),
        ("/slow.png", "took over"),
    ],
)
def test_an_image_urls_secrets_are_in_no_error(
    client: openai.OpenAI, server: str, log_file: Path, path: str, words: str
) -> None:
    url = f"http://alice:{SECRETS[0]}@{server}{path}?key={SECRETS[1]}&sig={SECRETS[2]}"
    with pytest.raises(openai.BadRequestError, match=words) as caught:
        _chat(client, url)
    message = json.dumps(caught.value.body)
    assert f"{server}{path}" in message  # where it went is still said
    assert "[redacted]" in message
    for secret in (*SECRETS, "alice"):
        assert secret not in message and secret not in log_file.read_text(errors="replace")


def test_an_unreachable_or_malformed_urls_secrets_are_in_no_error(
    client: openai.OpenAI, log_file: Path
) -> None:
    closed = free_port()
    for url, words in (
        (f"http://alice:{SECRETS[0]}@127.0.0.1:{closed}/a.png?key={SECRETS[1]}", "cannot fetch"),
        (f"http://alice:{SECRETS[0]}@127.0.0.1:99999/a.png?key={SECRETS[1]}", "a.png"),
    ):
        with pytest.raises(openai.BadRequestError, match=words) as caught:
            _chat(client, url)
        message = json.dumps(caught.value.body)
        for secret in (*SECRETS[:2], "alice"):
            assert secret not in message, message
    assert SECRETS[0] not in log_file.read_text(errors="replace")


# Images per second and the encoder's time


def test_metrics_show_images_per_second_and_encoder_time(
    client: openai.OpenAI, vlm: Daemon
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    for seed in range(3):
        url = "data:image/png;base64," + base64.b64encode(_png(seed)).decode()
        _chat(client, url)
    stats = vlm.admin_get("/admin/models/llava/stats").json()
    assert stats["images_per_s_recent"] > 0 and stats["vision_encode_s"] > 0
    deadline = time.monotonic() + 15
    while True:  # the gateway polls the workers every 2 s
        text = httpx.get(f"{vlm.base_url}/metrics", timeout=10).text
        samples = {
            (x.name, x.labels.get("model")): x.value
            for f in text_string_to_metric_families(text)
            for x in f.samples
        }
        if samples.get(("mlxd_worker_images_total", "llava"), 0) >= 3:
            break
        assert time.monotonic() < deadline, "the workers' figures never reached /metrics"
        time.sleep(0.5)
    assert samples[("mlxd_images_per_second", "llava")] > 0
    assert samples[("mlxd_images_per_second", "text")] == 0
    assert samples[("mlxd_worker_vision_encode_seconds_total", "llava")] > 0


def test_the_status_page_shows_images_and_the_encoder(client: openai.OpenAI, vlm: Daemon) -> None:
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.skip("Chromium is not installed (scripts/test installs it)")
    from playwright.sync_api import sync_playwright

    _chat(client, "data:image/png;base64," + base64.b64encode(_png(7)).decode())
    card = '[data-model="llava"]'
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(chromium), headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page()
            page.goto(vlm.base_url)
            page.wait_for_selector(f'{card}[data-state="running"]', timeout=30_000)
            deadline = time.monotonic() + 30
            while "encoder" not in page.inner_text(f"{card} .figures"):
                assert time.monotonic() < deadline, page.inner_text(f"{card} .figures")
                page.wait_for_timeout(200)
            figures = page.inner_text(f"{card} .figures")
            text_figures = page.inner_text('[data-model="text"] .figures')
        finally:
            browser.close()
    assert "/s" in figures and "per image" in figures and "encoder peak" in figures
    assert "encoder" not in text_figures
