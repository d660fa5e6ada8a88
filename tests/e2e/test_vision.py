"""Images through the daemon: a tiny random LLaVA served on the paged fast path.

Greedy output equals mlx-vlm's own ``generate`` for the same image and prompt, alone and in a
batch beside a text stream; the prefix cache hits on a repeated image and never on a different
one; bad images and images for a text-only model are 400s that leave a running stream alone.
Needs the ``vision`` extra (mlx-vlm); skipped without it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import Daemon
from tests.e2e.vision_parity import (
    SHORT_QUESTION,
    Family,
    Parity,
    client_of,
    made,
    png,
    served,
    tokens,
)

pytest.importorskip("mlx_vlm")
pytestmark = pytest.mark.e2e

# Its processor's pixels (its LlavaProcessor cannot take generate's padding=True under
# transformers 5: docs/decisions/0005-*.md); no attention mask.
FAMILY = Family(
    name="llava",
    question=SHORT_QUESTION,
    max_tokens=12,
    image_keys=("pixel_values",),
    mask=False,
)


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made(tmp_path_factory, "llava")


@pytest.fixture(scope="module")
def vlm_daemon(llava: Path, tiny_model: Path) -> Iterator[Daemon]:
    yield from served(llava, "--model", f"text={tiny_model}", name="llava")


@pytest.fixture(scope="module")
def client(vlm_daemon: Daemon) -> openai.OpenAI:
    return client_of(vlm_daemon)


@pytest.fixture(scope="module")
def parity(llava: Path) -> Parity:
    return Parity(llava, FAMILY)


def test_an_image_answer_equals_mlx_vlm_generate(client: openai.OpenAI, parity: Parity) -> None:
    answer = parity.check_image(client, png(1))
    assert answer.usage.prompt_tokens > 64  # the image's 64 placeholders are prompt tokens


def test_an_image_in_a_batch_beside_a_text_stream(client: openai.OpenAI, parity: Parity) -> None:
    image = png(2)
    answers: dict[str, Any] = {}

    def text_stream() -> None:
        answers["text"] = client.chat.completions.create(
            model="llava",
            messages=[{"role": "user", "content": "Tell me a long story about the sea."}],
            max_tokens=40,
            temperature=0,
        )

    thread = threading.Thread(target=text_stream)
    thread.start()
    images = [parity.ask(client, parity.messages(image)) for _ in range(2)]
    thread.join()
    expected = parity.expected([image], parity.messages(image))
    assert [tokens(a) for a in images] == [expected, expected]
    assert answers["text"].usage.completion_tokens > 0


def test_the_same_image_twice_hits_the_prefix_cache_and_another_never_does(
    client: openai.OpenAI, parity: Parity
) -> None:
    # the hit's K/V is the image's: the answer is the cold one, and mlx-vlm's
    parity.check_hit_and_miss(client, png(3), png(4), least_hit=64, answers_differ=False)


def test_an_image_in_a_later_turn(client: openai.OpenAI, parity: Parity) -> None:
    image = png(7)
    messages = [
        {"role": "user", "content": "Hello there."},
        {"role": "assistant", "content": "Hi! Send me a picture."},
        *parity.messages(image),
    ]
    answer = parity.ask(client, messages)
    assert tokens(answer) == parity.expected([image], messages)


def test_two_images_in_one_request(client: openai.OpenAI, parity: Parity) -> None:
    answer = parity.check_two_images(client, png(8), png(9, size=(90, 140)))
    assert answer.usage.prompt_tokens > 128  # both images' placeholders


def test_images_and_encoder_time_in_stats_and_metrics(
    client: openai.OpenAI, vlm_daemon: Daemon, parity: Parity
) -> None:
    """Each image counts once per request; the vision tower runs for the cold one only (the
    repeat's last placeholders lie past its prefix hit's last whole block: their features
    come from the feature cache); /metrics shows the worker's counts."""
    from prometheus_client.parser import text_string_to_metric_families

    before = vlm_daemon.admin_get("/admin/models/llava/stats").json()
    chat = parity.messages(png(10))
    cold = parity.ask(client, chat)
    parity.ask(client, chat)
    after = vlm_daemon.admin_get("/admin/models/llava/stats").json()
    assert after["images"] - before["images"] == 2
    assert after["images_encoded"] - before["images_encoded"] == 1
    assert after["vision_encode_s"] > before["vision_encode_s"]
    assert after["prompt_tokens"] - before["prompt_tokens"] == 2 * cold.usage.prompt_tokens
    key = (("model", "llava"),)
    deadline = time.monotonic() + 15
    while True:  # the gateway polls the workers every 2 s
        text = httpx.get(f"{vlm_daemon.base_url}/metrics", timeout=10).text
        samples = {
            (x.name, tuple(sorted(x.labels.items()))): x.value
            for f in text_string_to_metric_families(text)
            for x in f.samples
        }
        images = samples.get(("mlxd_worker_images_total", key), 0)
        if images >= after["images"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert images >= after["images"]
    assert samples[("mlxd_worker_images_encoded_total", key)] >= after["images_encoded"]
    assert samples[("mlxd_worker_vision_encode_seconds_total", key)] > 0
    assert samples[("mlxd_worker_images_total", (("model", "text"),))] == 0


def test_bad_images_are_400s_and_a_running_stream_goes_on(
    client: openai.OpenAI, parity: Parity
) -> None:
    stream = client.chat.completions.create(
        model="llava",
        messages=[{"role": "user", "content": "Count to fifty."}],
        max_tokens=48,
        temperature=0,
        stream=True,
    )
    chunks = iter(stream)
    next(chunks)
    corrupt = png(5)[:60]  # a PNG's signature and header, then nothing
    with pytest.raises(openai.BadRequestError, match="image"):
        parity.ask(client, parity.messages(corrupt))
    with pytest.raises(openai.BadRequestError, match="not an image"):
        parity.ask(client, parity.messages(b"hello, not an image at all"))
    with pytest.raises(openai.BadRequestError, match="does not take images"):
        parity.ask(client, parity.messages(png(6)), model="text")
    with pytest.raises(openai.BadRequestError, match="private"):  # a loopback image URL
        client.chat.completions.create(
            model="llava",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/a.png"}}
                    ],
                }
            ],
        )
    rest = list(chunks)
    assert rest[-1].choices[0].finish_reason == "length"


# Preemption: a KV pool of a few requests' worth


@pytest.fixture(scope="module")
def tight(llava: Path) -> Iterator[Daemon]:
    # 512 bytes a token (2 layers, 2 KV heads of 16, float32 K and V): about 400 tokens,
    # room for three ~110-token image prompts but not their answers
    yield from served(llava, "--kv-cache-gb", "0.0002", "--kv-block-size", "16", name="llava")


def test_image_requests_preempted_and_resumed_answer_as_mlx_vlm(
    tight: Daemon, parity: Parity
) -> None:
    """A preempted image request recomputes its prompt (its image's K/V from the prefix
    cache or the vision tower again) and its answer so far: the answer is mlx-vlm's."""
    parity.check_preempted(tight, [png(20 + n) for n in range(4)])
