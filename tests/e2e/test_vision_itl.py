"""A running stream beside a request of eight images waits no longer between tokens than beside
a prompt of the same token count (issue 39, engine point 2).

A real daemon on a made LLaVA whose vision tower costs about what its language model does per
token (the made tiny one's tower costs next to nothing, so it would show nothing), one endless
text stream, and in turn, round after round: a chat with eight fresh images (none in the
feature or prefix cache), then a fresh prompt with as many tokens as that chat's prompt. The
stream's worst gap during each is compared by their medians over the rounds, as
tests/e2e/test_embeddings_beside_streams.py does for embeddings. Before the fix the step whose
chunk first reached an image ran the tower on all eight at once, stalling the stream for eight
images' time; now a step encodes the images that fit its prefill budget, one at least.
"""

from __future__ import annotations

import base64
import io
import random
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytest.importorskip("mlx_vlm")
pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.slow]  # a latency bound over rounds

ROUNDS = 3
IMAGES = 8
PREFILL_CHUNK = 64  # one image's placeholders: a step's budget buys one image
TOLERANCE = 3.0  # the images' worst gap over the prompt's (before the fix: about 8)
# The tower and the decoder at one width and depth: an image's 65 patches cost about what 64
# prompt tokens do, so a step with one image costs about one prompt chunk.
SHAPE = {"hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 768}


@pytest.fixture(scope="module")
def heavy_llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlxd.models import vlm_maker

    tiny = vlm_maker.llava_config

    def heavy() -> dict[str, Any]:
        config = tiny()
        config["text_config"].update(SHAPE)
        config["vision_config"].update(SHAPE, num_attention_heads=4, projection_dim=256)
        return config

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vlm_maker, "llava_config", heavy)
        out = tmp_path_factory.mktemp("vlm") / "heavy-llava"
        return vlm_maker.make_vlm(out, progress=lambda line: None)


@pytest.fixture(scope="module")
def daemon(heavy_llava: Path) -> Iterator[Daemon]:
    d = start_daemon(heavy_llava, "--prefill-chunk", str(PREFILL_CHUNK), name="llava")
    yield d
    stop_daemon(d)


def _stream(daemon: Daemon, times: list[float], stop: threading.Event, starts: list[float]) -> None:
    body = {
        "model": daemon.model,
        "prompt": [5, 6, 7, 8],
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    while not stop.is_set():
        starts.append(time.monotonic())  # a new stream waits behind queued work: not a gap
        with httpx.stream("POST", f"{daemon.base_url}/v1/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    times.append(time.monotonic())
                if stop.is_set():
                    return


def _worst_gap(times: list[float], start: float, end: float) -> float:
    edges = [start, *(t for t in list(times) if start <= t <= end), end]
    return max(b - a for a, b in zip(edges, edges[1:], strict=False))


def _png(seed: int) -> str:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (112, 112, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _chat(seed: int) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": _png(seed + k)}} for k in range(IMAGES)
    ]
    parts.append({"type": "text", "text": f"Round {seed}: what do these pictures show?"})
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": 1}


def _ids(n: int, seed: int) -> list[int]:
    """``n`` token ids no earlier round began with (no prefix-cache hit)."""
    rng = random.Random(seed)
    return [rng.randrange(3, 250) for _ in range(n)]


def _timed(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[float, float, Any]:
    t0 = time.monotonic()
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return t0, time.monotonic(), r.json()


def test_a_streams_worst_gap_beside_many_images_is_no_worse_than_beside_a_prompt(
    daemon: Daemon,
) -> None:
    times: list[float] = []
    starts: list[float] = []
    stop = threading.Event()
    stream = threading.Thread(target=_stream, args=(daemon, times, stop, starts), daemon=True)
    stream.start()
    gaps: dict[str, list[float]] = {"images": [], "prompt": []}
    try:
        while len(times) < 20:
            time.sleep(0.05)
        with httpx.Client(base_url=daemon.base_url, timeout=600) as client:
            r = 0  # round 0 builds the kernels of both: not counted
            while len(gaps["images"]) < ROUNDS and r < 2 * ROUNDS + 1:
                body = {"model": daemon.model, **_chat(1000 * r)}
                t0, t1, answer = _timed(client, "/v1/chat/completions", body)
                n = answer["usage"]["prompt_tokens"]
                assert n > IMAGES * PREFILL_CHUNK  # every image's placeholders counted
                prompt = {"model": daemon.model, "prompt": _ids(n, 1000 * r + 500)}
                t2, t3, _ = _timed(client, "/v1/completions", {**prompt, "max_tokens": 1})
                if r and not any(t0 <= t <= t3 for t in starts):
                    gaps["images"].append(_worst_gap(times, t0, t1))
                    gaps["prompt"].append(_worst_gap(times, t2, t3))
                r += 1
        stats = daemon.admin_get(f"/admin/models/{daemon.model}/stats").json()
    finally:
        stop.set()
        stream.join(60)
    assert len(gaps["images"]) == ROUNDS, "the stream restarted in every round"
    assert stats["images_encoded"] >= IMAGES * ROUNDS
    images, prompt_gap = statistics.median(gaps["images"]), statistics.median(gaps["prompt"])
    assert images <= TOLERANCE * prompt_gap, gaps
