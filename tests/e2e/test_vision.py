"""Images through the daemon: a tiny random LLaVA served on the paged fast path.

Greedy output equals mlx-vlm's own ``generate`` for the same image and prompt, alone and in a
batch beside a text stream; the prefix cache hits on a repeated image and never on a different
one; bad images and images for a text-only model are 400s that leave a running stream alone.
Needs the ``vision`` extra (mlx-vlm); skipped without it.
"""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytest.importorskip("mlx_vlm")
pytestmark = pytest.mark.e2e

QUESTION = "What is in this picture? Describe it."
MAX_TOKENS = 12
PREEMPT_TOKENS = 64  # long enough answers to outgrow the tight pool


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlxd.models.vlm_maker import make_vlm

    return make_vlm(tmp_path_factory.mktemp("vlm") / "llava", progress=lambda line: None)


@pytest.fixture(scope="module")
def vlm_daemon(llava: Path, tiny_model: Path) -> Iterator[Daemon]:
    d = start_daemon(llava, "--model", f"text={tiny_model}", name="llava")
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


@pytest.fixture(scope="module")
def client(vlm_daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{vlm_daemon.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(llava: Path) -> Any:
    """mlx-vlm's own greedy ``generate`` on the made model: token ids for a chat's images
    (one image, or a list in prompt order) and its messages (``_messages``' by default)."""
    import mlx.core as mx
    from mlx_vlm import generate, load

    model, processor = load(str(llava))

    def ids_for(
        pngs: bytes | list[bytes],
        messages: list[dict[str, Any]] | None = None,
        max_tokens: int = MAX_TOKENS,
    ) -> list[int]:
        from PIL import Image

        pngs = [pngs] if isinstance(pngs, bytes) else pngs
        pictures = [Image.open(io.BytesIO(png)).convert("RGB") for png in pngs]
        # The template renders an image_url part as an image part: the image token.
        text = processor.tokenizer.apply_chat_template(
            messages or _messages(None), add_generation_prompt=True, tokenize=False
        )
        # The processor's own inputs: its LlavaProcessor cannot take generate's padding=True
        # under transformers 5 (docs/decisions/0005-*.md).
        inputs = processor(images=pictures, text=[text])
        out = generate(
            model,
            processor,
            text,
            input_ids=mx.array(inputs["input_ids"]),
            pixel_values=mx.array(inputs["pixel_values"]),
            max_tokens=max_tokens,
            temperature=0.0,
            verbose=False,
        )
        return list(out.token_ids)

    return ids_for


def _png(seed: int, size: tuple[int, int] = (130, 90)) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _messages(png: bytes | None) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [_image_part(png), {"type": "text", "text": QUESTION}]}]


def _image_part(png: bytes | None) -> dict[str, Any]:
    """An OpenAI image part (a bare image part, as mlx-vlm's template takes it, for None)."""
    if png is None:
        return {"type": "image"}
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def _ask(
    client: openai.OpenAI,
    png: bytes,
    model: str = "llava",
    messages: list[dict[str, Any]] | None = None,
    max_tokens: int = MAX_TOKENS,
) -> Any:
    return client.chat.completions.create(
        model=model,
        messages=messages or _messages(png),  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=0,
        logprobs=True,
    )


def _tokens(answer: Any) -> list[str]:
    """The answer's tokens, one string each (from its logprobs)."""
    return [t.token for t in answer.choices[0].logprobs.content]


def _text_of(ids: list[int], llava: Path) -> list[str]:
    """``ids`` as ``_tokens`` gives them: each token's own text."""
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(llava)
    return [tokenizer.decode([i]) for i in ids]


def test_an_image_answer_equals_mlx_vlm_generate(
    client: openai.OpenAI, reference: Any, llava: Path
) -> None:
    png = _png(1)
    answer = _ask(client, png)
    assert _tokens(answer) == _text_of(reference(png), llava)
    assert answer.usage.prompt_tokens > 64  # the image's 64 placeholders are prompt tokens


def test_an_image_in_a_batch_beside_a_text_stream(
    client: openai.OpenAI, reference: Any, llava: Path
) -> None:
    png = _png(2)
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
    images = [_ask(client, png) for _ in range(2)]
    thread.join()
    expected = _text_of(reference(png), llava)
    assert [_tokens(a) for a in images] == [expected, expected]
    assert answers["text"].usage.completion_tokens > 0


def test_the_same_image_twice_hits_the_prefix_cache_and_another_never_does(
    client: openai.OpenAI, reference: Any, llava: Path
) -> None:
    first, second = _png(3), _png(4)
    once = _ask(client, first)
    again = _ask(client, first)
    details = again.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens >= 64  # the image's blocks
    # The hit's K/V is the image's: the answer is the cold one, and mlx-vlm's.
    assert _tokens(again) == _tokens(once) == _text_of(reference(first), llava)
    other = _ask(client, second)  # same text, same positions, another image
    assert _tokens(other) == _text_of(reference(second), llava)
    other_details = other.usage.prompt_tokens_details
    assert other_details is None or (other_details.cached_tokens or 0) < 32  # no image block


def test_an_image_in_a_later_turn(client: openai.OpenAI, reference: Any, llava: Path) -> None:
    png = _png(7)
    messages = [
        {"role": "user", "content": "Hello there."},
        {"role": "assistant", "content": "Hi! Send me a picture."},
        {"role": "user", "content": [_image_part(png), {"type": "text", "text": QUESTION}]},
    ]
    answer = _ask(client, png, messages=messages)
    assert _tokens(answer) == _text_of(reference(png, messages), llava)


def test_two_images_in_one_request(client: openai.OpenAI, reference: Any, llava: Path) -> None:
    first, second = _png(8), _png(9, size=(90, 140))
    content = [
        _image_part(first),
        {"type": "text", "text": "This is the first one. And the second:"},
        _image_part(second),
        {"type": "text", "text": QUESTION},
    ]
    messages = [{"role": "user", "content": content}]
    answer = _ask(client, first, messages=messages)
    assert _tokens(answer) == _text_of(reference([first, second], messages), llava)
    assert answer.usage.prompt_tokens > 128  # both images' placeholders
    swapped = [{"role": "user", "content": [content[2], content[1], content[0], content[3]]}]
    other = _ask(client, first, messages=swapped)  # the same images the other way round
    assert _tokens(other) == _text_of(reference([second, first], swapped), llava)


def test_images_and_encoder_time_in_stats_and_metrics(
    client: openai.OpenAI, vlm_daemon: Daemon
) -> None:
    """Each image counts once per request; the vision tower runs for the cold one only (the
    repeat's last placeholders lie past its prefix hit's last whole block: their features
    come from the feature cache); /metrics shows the worker's counts."""
    from prometheus_client.parser import text_string_to_metric_families

    before = vlm_daemon.admin_get("/admin/models/llava/stats").json()
    png = _png(10)
    cold = _ask(client, png)
    _ask(client, png)
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
    client: openai.OpenAI, tiny_model: Path
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
    corrupt = _png(5)[:60]  # a PNG's signature and header, then nothing
    with pytest.raises(openai.BadRequestError, match="image"):
        _ask(client, corrupt)
    with pytest.raises(openai.BadRequestError, match="not an image"):
        _ask(client, b"hello, not an image at all")
    with pytest.raises(openai.BadRequestError, match="does not take images"):
        _ask(client, _png(6), model="text")
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
    d = start_daemon(llava, "--kv-cache-gb", "0.0002", "--kv-block-size", "16", name="llava")
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def test_image_requests_preempted_and_resumed_answer_as_mlx_vlm(
    tight: Daemon, reference: Any, llava: Path
) -> None:
    """A preempted image request recomputes its prompt (its image's K/V from the prefix
    cache or the vision tower again) and its answer so far: the answer is mlx-vlm's."""
    client = openai.OpenAI(base_url=f"{tight.base_url}/v1", api_key="unused", max_retries=0)
    pngs = [_png(20 + n) for n in range(4)]
    answers: dict[int, Any] = {}

    def ask(n: int) -> None:
        answers[n] = _ask(client, pngs[n], max_tokens=PREEMPT_TOKENS)

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(len(pngs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = tight.admin_get("/admin/models/llava/stats").json()
    assert stats["preemptions"] > 0, stats
    for n, png in enumerate(pngs):
        expected = _text_of(reference(png, max_tokens=PREEMPT_TOKENS), llava)
        assert _tokens(answers[n]) == expected, n
