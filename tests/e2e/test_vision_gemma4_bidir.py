"""Images through the daemon on a Gemma 4 whose image tokens attend each other both ways.

The larger real Gemma 4s set ``use_bidirectional_attention: vision``: in prefill each image's
tokens see the later ones of the same image too (mlx-vlm overlays its causal masks with each
run of image tokens). The tiny ``gemma4_bidirectional`` checkpoint is the maker's Gemma 4 with
that flag; the daemon keeps each image in one prefill forward and overlays the pool's masks
(``sched.image_spans``). Greedy output equals mlx-vlm's own ``generate`` given the processor's
``mm_token_type_ids`` (which is how mlx-vlm turns the overlay on), token for token: one image,
two, in a batch beside text requests, and after a prefix hit. The answers differ from the
causal ones, so a causal mask fails these tests. Needs the ``vision`` extra (mlx-vlm).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Daemon
from tests.e2e.test_vision_gemma4 import FAMILY
from tests.e2e.vision_parity import (
    BLOCK,
    LONG_QUESTION,
    cached,
    client_of,
    image_part,
    made,
    png,
    served,
    story,
    together,
    tokens,
)

pytest.importorskip("mlx_vlm")
QUESTION = LONG_QUESTION
MAX_TOKENS = FAMILY.max_tokens
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.families,
    pytest.mark.filterwarnings("ignore:At least one mel filter:UserWarning"),
]


@pytest.fixture(scope="module")
def bidir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made(tmp_path_factory, "gemma4_bidirectional")


@pytest.fixture(scope="module")
def daemon(bidir: Path) -> Iterator[Daemon]:
    yield from served(bidir, name="gemma4")


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> openai.OpenAI:
    return client_of(daemon)


def _messages(image: bytes) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [image_part(image), {"type": "text", "text": QUESTION}]}]


def _ask(client: openai.OpenAI, messages: list[dict[str, Any]]) -> Any:
    return client.chat.completions.create(
        model="gemma4",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=True,
    )


def _pixels(values: Any) -> Any:
    """The processor's pixels as mlx-vlm's tower takes them: one array, or a list of images of
    different sizes."""
    import mlx.core as mx

    return [mx.array(v) for v in values] if isinstance(values, list) else mx.array(values)


@pytest.fixture(scope="module")
def reference(bidir: Path) -> Any:
    """mlx-vlm's own greedy ``generate``: token ids for a chat's images and messages, with the
    inputs its processor makes of them; ``both_ways=False`` leaves out ``mm_token_type_ids``
    (mlx-vlm's masks stay causal: the answer a causal server would give)."""
    import io

    import mlx.core as mx
    from mlx_vlm import generate, load
    from PIL import Image

    model, processor = load(str(bidir))

    def ids_for(
        pngs: list[bytes], messages: list[dict[str, Any]], both_ways: bool = True
    ) -> list[int]:
        pictures = [Image.open(io.BytesIO(png)).convert("RGB") for png in pngs]
        text = processor.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        inputs = processor(images=pictures or None, text=[text])
        types = {"mm_token_type_ids": mx.array(inputs["mm_token_type_ids"])} if both_ways else {}
        out = generate(
            model,
            processor,
            text,
            input_ids=mx.array(inputs["input_ids"]),
            pixel_values=_pixels(inputs["pixel_values"]) if pictures else None,
            mask=mx.array(inputs["attention_mask"]),
            max_tokens=MAX_TOKENS,
            temperature=0.0,
            verbose=False,
            **types,
        )
        return list(out.token_ids)

    return ids_for


@pytest.fixture(scope="module")
def text_of(bidir: Path) -> Any:
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(bidir)
    return lambda ids: [tokenizer.decode([i]) for i in ids]


def test_an_image_answer_equals_mlx_vlm_generate_both_ways(
    client: openai.OpenAI, reference: Any, text_of: Any
) -> None:
    image = png(1)
    expected = reference([image], _messages(image))
    assert expected != reference([image], _messages(image), both_ways=False)  # the flag matters
    assert tokens(_ask(client, _messages(image))) == text_of(expected)


def test_two_images_in_one_request(client: openai.OpenAI, reference: Any, text_of: Any) -> None:
    """Two runs of image tokens, each seeing only itself both ways (54 tokens, then 64)."""
    first, second = png(8), png(9, size=(90, 90))
    content = [
        image_part(first),
        {"type": "text", "text": "This is the first one. And the second:"},
        image_part(second),
        {"type": "text", "text": QUESTION},
    ]
    messages = [{"role": "user", "content": content}]
    expected = reference([first, second], messages)
    assert expected != reference([first, second], messages, both_ways=False)
    assert tokens(_ask(client, messages)) == text_of(expected)


def test_images_in_a_busy_batch_with_text_requests(
    client: openai.OpenAI, reference: Any, text_of: Any
) -> None:
    """Three image requests and three text requests at once: image chunks whose masks are
    overlaid beside text chunks whose masks are causal, in one forward."""
    pngs = [png(10 + n) for n in range(3)]
    chats = [_messages(p) for p in pngs] + [story(n + 1) for n in range(3)]
    answers = together([lambda c=c: _ask(client, c) for c in chats])
    images = [reference([p], c) for p, c in zip(pngs, chats, strict=False)]
    texts = [reference([], c) for c in chats[len(pngs) :]]
    for n, expected in enumerate(images + texts):
        assert tokens(answers[n]) == text_of(expected), n


def test_after_a_prefix_hit(client: openai.OpenAI, reference: Any, text_of: Any) -> None:
    """The same image twice: the hit covers the image (its K/V as one both-ways forward left
    them). Then the same image with other text: that hit would end inside the image, so it
    stops before it and the image is prefilled whole again."""
    image = png(3)
    once = _ask(client, _messages(image))
    again = _ask(client, _messages(image))
    expected = text_of(reference([image], _messages(image)))
    assert cached(again) > 54, cached(again)
    assert tokens(again) == tokens(once) == expected
    other = [{"role": "user", "content": [image_part(image), {"type": "text", "text": "Hm?"}]}]
    answer = _ask(client, other)
    assert cached(answer) < BLOCK, cached(answer)  # the first block already holds the image
    assert tokens(answer) == text_of(reference([image], other))


# Prompt chunks shorter than an image: each image's chunk grows to hold it whole


@pytest.fixture(scope="module")
def chunked(bidir: Path) -> Iterator[Daemon]:
    yield from served(bidir, "--prefill-chunk", "16", name="gemma4")


def test_chunks_shorter_than_an_image_keep_it_whole(
    chunked: Daemon, reference: Any, text_of: Any
) -> None:
    """16-token chunks (as long as the window layer's window) against 54- and 64-token
    images, each in a request of its own and together in one, at once."""
    client = client_of(chunked)
    first, second = png(8), png(9, size=(90, 90))
    both = [
        {
            "role": "user",
            "content": [
                image_part(first),
                {"type": "text", "text": "And:"},
                image_part(second),
                {"type": "text", "text": QUESTION},
            ],
        }
    ]
    chats = [([first], _messages(first)), ([second], _messages(second)), ([first, second], both)]
    answers = together([lambda c=c: _ask(client, c[1]) for c in chats])
    for n, (pngs, messages) in enumerate(chats):
        assert tokens(answers[n]) == text_of(reference(pngs, messages)), n
