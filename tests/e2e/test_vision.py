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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytest.importorskip("mlx_vlm")
pytestmark = pytest.mark.e2e

QUESTION = "What is in this picture? Describe it."
MAX_TOKENS = 12


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
    """mlx-vlm's own greedy ``generate`` on the made model: token ids for an image."""
    import mlx.core as mx
    from mlx_vlm import generate, load

    model, processor = load(str(llava))

    def ids_for(png: bytes) -> list[int]:
        from PIL import Image

        picture = Image.open(io.BytesIO(png)).convert("RGB")
        text = processor.tokenizer.apply_chat_template(
            _messages(None), add_generation_prompt=True, tokenize=False
        )
        # The processor's own inputs: its LlavaProcessor cannot take generate's padding=True
        # under transformers 5 (docs/decisions/0005-*.md).
        inputs = processor(images=[picture], text=[text])
        out = generate(
            model,
            processor,
            text,
            input_ids=mx.array(inputs["input_ids"]),
            pixel_values=mx.array(inputs["pixel_values"]),
            max_tokens=MAX_TOKENS,
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
    image: dict[str, Any] = {"type": "image"}
    if png is not None:
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        image = {"type": "image_url", "image_url": {"url": url}}
    return [{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}]


def _ask(client: openai.OpenAI, png: bytes, model: str = "llava") -> Any:
    return client.chat.completions.create(
        model=model,
        messages=_messages(png),  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
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
    _ask(client, first)
    again = _ask(client, first)
    details = again.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens >= 64  # the image's blocks
    other = _ask(client, second)  # same text, same positions, another image
    assert _tokens(other) == _text_of(reference(second), llava)
    other_details = other.usage.prompt_tokens_details
    assert other_details is None or (other_details.cached_tokens or 0) < 32  # no image block


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
