"""Images through the daemon on a tiny random Qwen3.5: a hybrid VLM on the hybrid runner.

Qwen3.5's language model is Gated DeltaNet layers (a recurrent state per sequence, snapshot on
the prefix cache's nodes) beside gated attention layers with Qwen's multimodal RoPE. Greedy
output equals mlx-vlm's own ``generate`` for the same image(s) and prompt, token for token:
alone, text only, in a busy batch beside text requests, after a prefix hit on the same image
(its state restored from a snapshot past the image), in a later turn, with two images of
different sizes, preempted and resumed; a different image with the same text never hits. An
image feature spliced into the wrong span, or a position slip, moves the recurrent state and
the answer. Needs the ``vision`` extra (mlx-vlm); skipped without it.
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
MAX_TOKENS = 16
PREEMPT_TOKENS = 64  # long enough answers to outgrow the tight pool
SQUARE = (224, 224)  # 49 image tokens at 4..52: a 75-token prompt, its hit two 32-token blocks


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlxd.models.vlm_maker import make_vlm

    path = tmp_path_factory.mktemp("vlm") / "qwen35"
    return make_vlm(path, arch="qwen3_5_vl", progress=lambda line: None)


@pytest.fixture(scope="module")
def daemon(qwen: Path) -> Iterator[Daemon]:
    d = start_daemon(qwen, name="qwen")
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(qwen: Path) -> Any:
    return _reference(qwen)


def _reference(path: Path) -> Any:
    """mlx-vlm's own greedy ``generate`` on the made model: token ids for a chat's images (in
    prompt order; none for a text chat) and its messages."""
    import mlx.core as mx
    from mlx_vlm import generate, load

    model, processor = load(str(path))

    def ids_for(
        pngs: list[bytes], messages: list[dict[str, Any]], max_tokens: int = MAX_TOKENS
    ) -> list[int]:
        from PIL import Image

        pictures = [Image.open(io.BytesIO(png)).convert("RGB") for png in pngs]
        text = processor.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        inputs = processor(images=pictures or None, text=[text])
        images = {}
        if pictures:
            images = {
                "pixel_values": mx.array(inputs["pixel_values"]),
                "image_grid_thw": mx.array(inputs["image_grid_thw"]),
            }
        out = generate(
            model,
            processor,
            text,
            input_ids=mx.array(inputs["input_ids"]),
            max_tokens=max_tokens,
            temperature=0.0,
            verbose=False,
            **images,
        )
        return list(out.token_ids)

    return ids_for


def _png(seed: int, size: tuple[int, int] = SQUARE) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _image_part(png: bytes) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def _messages(png: bytes) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [_image_part(png), {"type": "text", "text": QUESTION}]}]


def _ask(
    client: openai.OpenAI,
    messages: list[dict[str, Any]],
    max_tokens: int = MAX_TOKENS,
    model: str = "qwen",
) -> Any:
    return client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=0,
        logprobs=True,
    )


def _tokens(answer: Any) -> list[str]:
    """The answer's tokens, one string each (from its logprobs)."""
    return [t.token for t in answer.choices[0].logprobs.content]


def _text_of(ids: list[int], qwen: Path) -> list[str]:
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(qwen)
    return [tokenizer.decode([i]) for i in ids]


def _cached(answer: Any) -> int:
    details = answer.usage.prompt_tokens_details
    return 0 if details is None else details.cached_tokens or 0


def test_an_image_answer_equals_mlx_vlm_generate(
    client: openai.OpenAI, reference: Any, qwen: Path
) -> None:
    png = _png(1, (200, 150))  # 30 image tokens at 4..33: the image straddles a block edge
    answer = _ask(client, _messages(png))
    assert _tokens(answer) == _text_of(reference([png], _messages(png)), qwen)
    assert answer.usage.prompt_tokens > 35


def test_text_only_requests_to_the_vlm(client: openai.OpenAI, reference: Any, qwen: Path) -> None:
    messages = [{"role": "user", "content": "Tell me a story about the sea."}]
    answer = _ask(client, messages)
    assert _tokens(answer) == _text_of(reference([], messages), qwen)


def test_images_in_a_busy_batch_beside_text_requests(
    client: openai.OpenAI, reference: Any, qwen: Path
) -> None:
    """Image rows (each its own negative delta) and text rows prefill and decode together."""
    pngs = [_png(2), _png(3, (120, 200)), _png(4, (90, 60))]
    texts = [
        [{"role": "user", "content": f"Count the numbers up to {n * 7}, please."}] for n in (1, 2)
    ]
    asks = [_messages(p) for p in pngs] + texts
    answers: dict[int, Any] = {}

    def ask(n: int) -> None:
        answers[n] = _ask(client, asks[n])

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = [reference([p], m) for p, m in zip(pngs, asks[: len(pngs)], strict=True)]
    expected += [reference([], m) for m in texts]
    assert [_tokens(answers[n]) for n in range(len(asks))] == [_text_of(e, qwen) for e in expected]


def test_the_same_image_twice_hits_and_another_never_does(
    client: openai.OpenAI, reference: Any, qwen: Path
) -> None:
    first, second = _png(5), _png(6)
    once = _ask(client, _messages(first))
    again = _ask(client, _messages(first))
    assert _cached(again) >= 64  # the image's blocks: prefill resumes past the image
    assert _tokens(again) == _tokens(once) == _text_of(reference([first], _messages(first)), qwen)
    other = _ask(client, _messages(second))  # same text and positions, another image
    assert _cached(other) < 32  # no block holding an image matches
    assert _tokens(other) == _text_of(reference([second], _messages(second)), qwen)


def test_text_after_the_image_in_a_later_turn(
    client: openai.OpenAI, reference: Any, qwen: Path
) -> None:
    """The second turn hits the first's blocks (image included) and its new text runs at
    index + delta."""
    png = _png(7)
    first = _ask(client, _messages(png))
    messages = [
        *_messages(png),
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And what colour is it? Answer in one long sentence."},
    ]
    later = _ask(client, messages)
    assert _cached(later) >= 64
    assert _tokens(later) == _text_of(reference([png], messages), qwen)


def test_two_images_of_different_sizes(client: openai.OpenAI, reference: Any, qwen: Path) -> None:
    first, second = _png(8, (200, 150)), _png(9, (90, 140))
    content = [
        _image_part(first),
        {"type": "text", "text": "This is the first one. And the second:"},
        _image_part(second),
        {"type": "text", "text": QUESTION},
    ]
    messages = [{"role": "user", "content": content}]
    answer = _ask(client, messages)
    assert _tokens(answer) == _text_of(reference([first, second], messages), qwen)
    swapped = [{"role": "user", "content": [content[2], content[1], content[0], content[3]]}]
    other = _ask(client, swapped)  # the same images the other way round: other keys
    assert _tokens(other) == _text_of(reference([second, first], swapped), qwen)


# Preemption: a KV pool of a few requests' worth


@pytest.fixture(scope="module")
def tight(qwen: Path) -> Iterator[Daemon]:
    # 256 bytes a token (one attention layer, 2 KV heads of 16, float32 K and V); of 200 kB,
    # a quarter for the prefix cache's snapshots and 44 kB for four rows' recurrent states
    # (two each): about 400 tokens, room for four 75-token image prompts but not their answers
    d = start_daemon(
        qwen,
        *("--kv-cache-gb", "0.0002", "--kv-block-size", "16", "--max-num-seqs", "4"),
        name="qwen",
    )
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def test_image_requests_preempted_and_resumed_answer_as_mlx_vlm(
    tight: Daemon, reference: Any, qwen: Path
) -> None:
    """A resumed sequence prefills its prompt and its answer so far: the answer's tokens sit
    past the prompt, at index + delta."""
    client = openai.OpenAI(base_url=f"{tight.base_url}/v1", api_key="unused", max_retries=0)
    pngs = [_png(20 + n) for n in range(4)]
    answers: dict[int, Any] = {}

    def ask(n: int) -> None:
        answers[n] = _ask(client, _messages(pngs[n]), max_tokens=PREEMPT_TOKENS)

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(len(pngs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = tight.admin_get("/admin/models/qwen/stats").json()
    assert stats["preemptions"] > 0, stats
    for n, png in enumerate(pngs):
        expected = reference([png], _messages(png), max_tokens=PREEMPT_TOKENS)
        assert _tokens(answers[n]) == _text_of(expected, qwen), n


# Qwen3.5-MoE: the same hybrid, sparse MLPs (routed experts and a shared one) in every layer


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlxd.models.vlm_maker import make_vlm

    path = tmp_path_factory.mktemp("vlm") / "qwen35moe"
    return make_vlm(path, arch="qwen3_5_moe_vl", progress=lambda line: None)


@pytest.fixture(scope="module")
def moe_client(moe: Path) -> Iterator[openai.OpenAI]:
    d = start_daemon(moe, name="moe")
    yield openai.OpenAI(base_url=f"{d.base_url}/v1", api_key="unused", max_retries=0)
    if d.proc.poll() is None:
        stop_daemon(d)


def test_moe_images_beside_text_and_a_hit_answer_as_mlx_vlm(
    moe_client: openai.OpenAI, moe: Path
) -> None:
    """Two images and a text request at once, then the first image again (a prefix hit)."""
    reference = _reference(moe)
    pngs = [_png(30), _png(31, (120, 200))]
    asks = [_messages(p) for p in pngs] + [[{"role": "user", "content": "Name three rivers."}]]
    answers: dict[int, Any] = {}

    def ask(n: int) -> None:
        answers[n] = _ask(moe_client, asks[n], model="moe")

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    again = _ask(moe_client, asks[0], model="moe")
    expected = [reference([p], m) for p, m in zip(pngs, asks, strict=False)]
    expected.append(reference([], asks[2]))
    assert [_tokens(answers[n]) for n in range(len(asks))] == [_text_of(e, moe) for e in expected]
    assert _cached(again) >= 64
    assert _tokens(again) == _text_of(expected[0], moe)
