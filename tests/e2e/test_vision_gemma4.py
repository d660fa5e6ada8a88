"""Images through the daemon on Gemma 4: a tiny random Gemma 4 VLM on the window runner.

Its language model has a sliding-window layer beside a full one (wider heads), per-layer token
inputs and tied, soft-capped logits, so it is served by the paged window runner, with each
image's features (its own aspect ratio, its own token count) spliced into prefill scaled as
mlx-vlm's merge leaves them (``vision.gemma4``). Greedy output equals mlx-vlm's own
``generate`` for the same image and prompt: alone, in a batch beside text requests, after a
prefix hit that covers the whole image, for another image with the same text (no false hit),
for text alone, for two images of different sizes in one prompt, and after preemption. Needs
the ``vision`` extra (mlx-vlm); skipped without it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon
from tests.e2e.test_vision import _image_part, _png

pytest.importorskip("mlx_vlm")
pytestmark = [
    pytest.mark.e2e,
    # mlx-vlm's processor builds Gemma 4's audio feature extractor too, which warns so
    pytest.mark.filterwarnings("ignore:At least one mel filter:UserWarning"),
]

# Long enough that the prompt's last whole block lies past the image: a hit covers it all.
QUESTION = (
    "What is in this picture? Describe it in detail: the colours, the shapes, the light "
    "and anything written on it."
)
MAX_TOKENS = 12
PREEMPT_TOKENS = 64  # long enough answers to outgrow the tight pool
BLOCK = 32  # the daemon's default KV block size


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlxd.models.vlm_maker import make_vlm

    out = tmp_path_factory.mktemp("vlm") / "gemma4"
    return make_vlm(out, arch="gemma4", progress=lambda line: None)


@pytest.fixture(scope="module")
def daemon(gemma4: Path) -> Iterator[Daemon]:
    d = start_daemon(gemma4, name="gemma4")
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(gemma4: Path) -> Any:
    """mlx-vlm's own greedy ``generate`` on the made model: token ids for a chat's images (none
    for a text request) and its messages, with the inputs its processor makes of them."""
    import io

    import mlx.core as mx
    from mlx_vlm import generate, load
    from PIL import Image

    model, processor = load(str(gemma4))

    def ids_for(
        pngs: list[bytes], messages: list[dict[str, Any]], max_tokens: int = MAX_TOKENS
    ) -> list[int]:
        pictures = [Image.open(io.BytesIO(png)).convert("RGB") for png in pngs]
        text = processor.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        inputs = processor(images=pictures or None, text=[text])
        out = generate(
            model,
            processor,
            text,
            input_ids=mx.array(inputs["input_ids"]),
            pixel_values=_pixels(inputs["pixel_values"]) if pictures else None,
            mask=mx.array(inputs["attention_mask"]),
            max_tokens=max_tokens,
            temperature=0.0,
            verbose=False,
        )
        return list(out.token_ids)

    return ids_for


def _pixels(values: Any) -> Any:
    """The processor's pixels as mlx-vlm's tower takes them: one array, or a list of images of
    different sizes (each keeps its aspect ratio)."""
    import mlx.core as mx

    return [mx.array(v) for v in values] if isinstance(values, list) else mx.array(values)


@pytest.fixture(scope="module")
def text_of(gemma4: Path) -> Any:
    """Token ids as the answer's logprobs give them: each token's own text."""
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(gemma4)
    return lambda ids: [tokenizer.decode([i]) for i in ids]


def _messages(png: bytes) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [_image_part(png), {"type": "text", "text": QUESTION}]}]


def _text_messages(n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Tell me story number {n} about the sea."}]


def _ask(client: openai.OpenAI, messages: list[dict[str, Any]]) -> Any:
    return client.chat.completions.create(
        model="gemma4",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
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
    png = _png(1)
    answer = _ask(client, _messages(png))
    assert _tokens(answer) == text_of(reference([png], _messages(png)))
    # 54 image tokens among them (130 x 90 pixels scaled to 72 x 48); past the third block
    assert answer.usage.prompt_tokens > 3 * BLOCK


def test_a_text_request_to_the_vlm_equals_mlx_vlm_generate(
    client: openai.OpenAI, reference: Any, text_of: Any
) -> None:
    answer = _ask(client, _text_messages(0))
    assert _tokens(answer) == text_of(reference([], _text_messages(0)))


def test_images_in_a_busy_batch_with_text_requests(
    client: openai.OpenAI, reference: Any, text_of: Any
) -> None:
    """Three image requests and three text requests at once: one decode batch, prefill chunks
    with and without images side by side; each answer is its own alone."""
    pngs = [_png(10 + n) for n in range(3)]
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
    client: openai.OpenAI, reference: Any, text_of: Any, gemma4: Path
) -> None:
    first, second = _png(3), _png(4)
    once = _ask(client, _messages(first))
    again = _ask(client, _messages(first))
    last_image_token = _last_image_position(gemma4, first)
    # the hit covers every image token (and the window layers' slabs before its end)
    assert _cached(again) > last_image_token, (_cached(again), last_image_token)
    expected = text_of(reference([first], _messages(first)))
    assert _tokens(again) == _tokens(once) == expected
    other = _ask(client, _messages(second))  # same text, same positions, another image
    assert _cached(other) < BLOCK  # the first block holds image tokens: no block matches
    assert _tokens(other) == text_of(reference([second], _messages(second)))
    assert _tokens(other) != expected


def _last_image_position(gemma4: Path, png: bytes) -> int:
    """Where the prompt's last image token sits, as the model's processor lays it out."""
    import io

    from mlx_vlm.utils import load_processor
    from PIL import Image

    from mlxd.models.vlm_maker import GEMMA3_IMAGE_TOKEN, GEMMA3_TOKEN_IDS

    processor = load_processor(gemma4)
    text = processor.tokenizer.apply_chat_template(
        _messages(png), add_generation_prompt=True, tokenize=False
    )
    picture = Image.open(io.BytesIO(png)).convert("RGB")
    ids = [int(i) for i in processor(images=[picture], text=[text])["input_ids"][0].tolist()]
    return max(p for p, i in enumerate(ids) if i == GEMMA3_TOKEN_IDS[GEMMA3_IMAGE_TOKEN])


def test_two_images_of_different_sizes_in_one_request(
    client: openai.OpenAI, reference: Any, text_of: Any
) -> None:
    first, second = _png(8), _png(9, size=(90, 90))  # 54 image tokens, then 64
    content = [
        _image_part(first),
        {"type": "text", "text": "This is the first one. And the second:"},
        _image_part(second),
        {"type": "text", "text": QUESTION},
    ]
    messages = [{"role": "user", "content": content}]
    answer = _ask(client, messages)
    assert _tokens(answer) == text_of(reference([first, second], messages))
    assert answer.usage.prompt_tokens > 54 + 64  # both images' tokens, each its own count
    # the second alone: its features from the feature cache, split from the first's by counts
    alone = _messages(second)
    assert _tokens(_ask(client, alone)) == text_of(reference([second], alone))


# Preemption: a KV pool of a few requests' worth


@pytest.fixture(scope="module")
def tight(gemma4: Path) -> Iterator[Daemon]:
    # 512 bytes a token in the full layer's blocks (2 KV heads of 32, float32 K and V), beside
    # the window layer's slabs: a few requests' worth, so four answers outgrow it
    d = start_daemon(gemma4, "--kv-cache-gb", "0.00025", "--kv-block-size", "16", name="gemma4")
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def test_image_requests_preempted_and_resumed_answer_as_mlx_vlm(
    tight: Daemon, reference: Any, text_of: Any
) -> None:
    """Preempted image requests recompute their prompts (the image's K/V from the prefix cache
    or the tower again, the window layers' slabs taken anew) and their answers so far."""
    client = openai.OpenAI(base_url=f"{tight.base_url}/v1", api_key="unused", max_retries=0)
    pngs = [_png(20 + n) for n in range(4)]
    answers: dict[int, Any] = {}

    def ask(n: int) -> None:
        answers[n] = client.chat.completions.create(
            model="gemma4",
            messages=_messages(pngs[n]),  # type: ignore[arg-type]
            max_tokens=PREEMPT_TOKENS,
            temperature=0,
            logprobs=True,
        )

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(len(pngs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = tight.admin_get("/admin/models/gemma4/stats").json()
    assert stats["preemptions"] > 0, stats
    for n, png in enumerate(pngs):
        expected = text_of(reference([png], _messages(png), PREEMPT_TOKENS))
        assert _tokens(answers[n]) == expected, n
