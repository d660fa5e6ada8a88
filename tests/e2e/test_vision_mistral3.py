"""Images through the daemon on a tiny random Mistral 3: Pixtral's tower, the window runner.

Pixtral's processor keeps each image's aspect ratio and lays it out row by row (a row's
``[IMG]`` tokens, ``[IMG_BREAK]`` between rows, ``[IMG_END]`` after the last), so one image is
several placeholder runs whose count follows its size (48 for a 130 x 90 image, 32 for a wide
one, 9 for a small one); its tower takes each image at its own size with 2D rotary positions.
The language model is Ministral 3, whose first layer attends within a 16-token window: the
window runner (slabs that go back behind the window). Greedy output equals mlx-vlm's own
``generate`` for the same image(s) and prompt, token for token: alone, in a busy batch beside
text requests, after a prefix hit that covers the whole image, for another image with the same
text (no false hit), for text alone, for two images of different sizes (either order), in a
later turn, and after preemption. Needs the ``vision`` extra (mlx-vlm); skipped without it.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon
from tests.e2e.test_vision import _image_part, _png

pytest.importorskip("mlx_vlm")
pytestmark = pytest.mark.e2e

# Long enough that the prompt's last whole block lies past the image: a hit covers it all.
QUESTION = (
    "What is in this picture? Describe it in detail: the colours, the shapes, the light "
    "and anything written on it."
)
MAX_TOKENS = 12
PREEMPT_TOKENS = 64  # long enough answers to outgrow the tight pool
BLOCK = 32  # the daemon's default KV block size
SQUARE = (130, 90)  # 6 rows of 8 image tokens: 48
WIDE = (120, 50)  # 4 rows of 8: 32
SMALL = (20, 20)  # not scaled up: 3 rows of 3


def _make(tmp_path_factory: pytest.TempPathFactory, arch: str) -> Path:
    from mlxd.models.vlm_maker import make_vlm

    out = tmp_path_factory.mktemp("vlm") / arch
    return make_vlm(out, arch=arch, progress=lambda line: None)


@pytest.fixture(scope="module")
def mistral3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make(tmp_path_factory, "mistral3")


@pytest.fixture(scope="module")
def daemon(mistral3: Path) -> Iterator[Daemon]:
    d = start_daemon(mistral3, name="mistral3")
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)


def _reference(path: Path) -> Any:
    """mlx-vlm's own greedy ``generate`` on the made model: token ids for a chat's images (in
    prompt order; none for a text chat) and its messages, with the inputs its processor makes
    of them (the padded pixels and each image's own size, ``image_sizes``)."""
    import mlx.core as mx
    from mlx_vlm import generate, load
    from PIL import Image

    model, processor = load(str(path))

    def ids_for(
        pngs: list[bytes], messages: list[dict[str, Any]], max_tokens: int = MAX_TOKENS
    ) -> list[int]:
        pictures = [Image.open(io.BytesIO(png)).convert("RGB") for png in pngs]
        text = processor.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        inputs = processor(images=pictures or None, text=[text])
        images = {}
        if pictures:
            images = {
                "pixel_values": mx.array(inputs["pixel_values"]),
                "image_sizes": mx.array(inputs["image_sizes"]),
            }
        out = generate(
            model,
            processor,
            text,
            input_ids=mx.array(inputs["input_ids"]),
            mask=mx.array(inputs["attention_mask"]),
            max_tokens=max_tokens,
            temperature=0.0,
            verbose=False,
            **images,
        )
        return list(out.token_ids)

    return ids_for


@pytest.fixture(scope="module")
def reference(mistral3: Path) -> Any:
    return _reference(mistral3)


def _text_of(path: Path) -> Any:
    """Token ids as the answer's logprobs give them: each token's own text."""
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(path)
    return lambda ids: [tokenizer.decode([i]) for i in ids]


@pytest.fixture(scope="module")
def text_of(mistral3: Path) -> Any:
    return _text_of(mistral3)


def _messages(png: bytes) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [_image_part(png), {"type": "text", "text": QUESTION}]}]


def _text_messages(n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Tell me story number {n} about the sea."}]


def _ask(
    client: openai.OpenAI,
    messages: list[dict[str, Any]],
    max_tokens: int = MAX_TOKENS,
    model: str = "mistral3",
) -> Any:
    return client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=0,
        logprobs=True,
    )


def _tokens(answer: Any) -> list[str]:
    return [t.token for t in answer.choices[0].logprobs.content]


def _cached(answer: Any) -> int:
    details = answer.usage.prompt_tokens_details
    return 0 if details is None else details.cached_tokens or 0


def test_an_image_answer_equals_mlx_vlm_generate(
    client: openai.OpenAI, reference: Any, text_of: Any
) -> None:
    png = _png(1, SQUARE)
    answer = _ask(client, _messages(png))
    assert _tokens(answer) == text_of(reference([png], _messages(png)))
    assert answer.usage.prompt_tokens > 48 + 6  # six rows of image tokens, their markers


def test_a_text_request_to_the_vlm_equals_mlx_vlm_generate(
    client: openai.OpenAI, reference: Any, text_of: Any
) -> None:
    answer = _ask(client, _text_messages(0))
    assert _tokens(answer) == text_of(reference([], _text_messages(0)))


def test_images_in_a_busy_batch_with_text_requests(
    client: openai.OpenAI, reference: Any, text_of: Any
) -> None:
    """Three image requests (three sizes) and three text requests at once: one decode
    batch, prefill chunks with and without images side by side; each answer is its own alone."""
    pngs = [_png(10, SQUARE), _png(11, WIDE), _png(12, SMALL)]
    chats = [_messages(p) for p in pngs] + [_text_messages(n + 1) for n in range(3)]
    answers: dict[int, Any] = {}

    def ask(n: int) -> None:
        answers[n] = _ask(client, chats[n])

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(len(chats))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    images = [reference([p], c) for p, c in zip(pngs, chats, strict=False)]
    texts = [reference([], c) for c in chats[len(pngs) :]]
    assert len({tuple(ids) for ids in images}) > 1  # the answers depend on the image
    for n, expected in enumerate(images + texts):
        assert _tokens(answers[n]) == text_of(expected), n


def test_the_same_image_twice_hits_past_the_image_and_another_never_does(
    client: openai.OpenAI, reference: Any, text_of: Any, mistral3: Path
) -> None:
    first, second = _png(3, SQUARE), _png(4, SQUARE)
    once = _ask(client, _messages(first))
    again = _ask(client, _messages(first))
    last_image_token = _last_image_position(mistral3, first)
    assert _cached(again) > last_image_token, (_cached(again), last_image_token)
    expected = text_of(reference([first], _messages(first)))
    assert _tokens(again) == _tokens(once) == expected
    other = _ask(client, _messages(second))  # same text, same positions, another image
    assert _cached(other) < BLOCK  # the first block holds image tokens: no block matches
    assert _tokens(other) == text_of(reference([second], _messages(second)))
    assert _tokens(other) != expected


def _last_image_position(path: Path, png: bytes) -> int:
    """Where the prompt's last image token sits, as the model's processor lays it out."""
    from mlx_vlm.utils import load_processor
    from PIL import Image

    from mlxd.models.mistral3_maker import IMAGE_TOKEN, TOKEN_IDS

    processor = load_processor(path)
    text = processor.tokenizer.apply_chat_template(
        _messages(png), add_generation_prompt=True, tokenize=False
    )
    picture = Image.open(io.BytesIO(png)).convert("RGB")
    ids = [int(i) for i in processor(images=[picture], text=[text])["input_ids"][0].tolist()]
    return max(p for p, i in enumerate(ids) if i == TOKEN_IDS[IMAGE_TOKEN])


def test_two_images_of_different_sizes(client: openai.OpenAI, reference: Any, text_of: Any) -> None:
    """48 and 32 image tokens: each image's own count keys its placeholders (an even split
    would key a row of the first image by the second's digest)."""
    first, second = _png(8, SQUARE), _png(9, WIDE)
    content = [
        _image_part(first),
        {"type": "text", "text": "This is the first one. And the second:"},
        _image_part(second),
        {"type": "text", "text": QUESTION},
    ]
    messages = [{"role": "user", "content": content}]
    answer = _ask(client, messages)
    assert _tokens(answer) == text_of(reference([first, second], messages))
    assert answer.usage.prompt_tokens > 80  # both images' tokens
    swapped = [{"role": "user", "content": [content[2], content[1], content[0], content[3]]}]
    other = _ask(client, swapped)  # the same images the other way round: other keys
    assert _tokens(other) == text_of(reference([second, first], swapped))
    # the wide image alone, after both: its features come from the feature cache
    alone = _ask(client, _messages(second))
    assert _tokens(alone) == text_of(reference([second], _messages(second)))


def test_text_after_the_image_in_a_later_turn(
    client: openai.OpenAI, reference: Any, text_of: Any
) -> None:
    png = _png(7, WIDE)
    first = _ask(client, _messages(png))
    messages = [
        *_messages(png),
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And what colour is it? Answer in one long sentence."},
    ]
    later = _ask(client, messages)
    assert _cached(later) >= 2 * BLOCK  # the first turn's blocks, image included
    assert _tokens(later) == text_of(reference([png], messages))


# Preemption: a KV pool of a few requests' worth


@pytest.fixture(scope="module")
def tight(mistral3: Path) -> Iterator[Daemon]:
    # 512 bytes a token (2 layers, 2 KV heads of 16, float32 K and V): about 400 tokens,
    # room for four ~75-token image prompts, not their answers
    d = start_daemon(mistral3, "--kv-cache-gb", "0.0002", "--kv-block-size", "16", name="mistral3")
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def test_image_requests_preempted_and_resumed_answer_as_mlx_vlm(
    tight: Daemon, reference: Any, text_of: Any
) -> None:
    client = openai.OpenAI(base_url=f"{tight.base_url}/v1", api_key="unused", max_retries=0)
    pngs = [_png(20 + n, WIDE) for n in range(4)]
    answers: dict[int, Any] = {}

    def ask(n: int) -> None:
        answers[n] = _ask(client, _messages(pngs[n]), max_tokens=PREEMPT_TOKENS)

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(len(pngs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = tight.admin_get("/admin/models/mistral3/stats").json()
    assert stats["preemptions"] > 0, stats
    for n, png in enumerate(pngs):
        expected = text_of(reference([png], _messages(png), PREEMPT_TOKENS))
        assert _tokens(answers[n]) == expected, n
