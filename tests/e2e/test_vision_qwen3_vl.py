"""Images through the daemon on a tiny random Qwen3-VL: interleaved multimodal RoPE and
deepstack features on the paged fast path.

Greedy output equals mlx-vlm's own ``generate`` for the same image(s) and prompt, token for
token: alone, text only, in a busy batch beside text requests, after a prefix hit on the same
image, in a later turn, with two images of different sizes, with the image split over several
prefill chunks, and preempted; a different image with the same text never hits. Qwen3-VL adds
each image token's deepstack features into the first decoder layers' outputs, so a feature
added at the wrong column, twice, or not at all (a chunk's slice, left padding, a resumed
prefill) changes the answer, as a position slip does. Needs the ``vision`` extra (mlx-vlm);
skipped without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Daemon
from tests.e2e.vision_parity import (
    SHORT_QUESTION,
    Family,
    Parity,
    cached,
    client_of,
    made,
    png,
    served,
    together,
    tokens,
)

pytest.importorskip("mlx_vlm")
pytestmark = [pytest.mark.e2e, pytest.mark.families]

SQUARE = (256, 256)  # 64 image tokens: two whole 32-token blocks with the text before them
CHUNK = 16  # prefill tokens a step in the chunked daemon: an image spans five chunks
# Its processor's pixels and each image's patch grid (time, height, width); no attention mask.
FAMILY = Family(
    name="qwen",
    question=SHORT_QUESTION,
    max_tokens=16,
    image_keys=("pixel_values", "image_grid_thw"),
    mask=False,
)


@pytest.fixture(scope="module", params=["qwen3_vl", "qwen3_vl_moe"])
def qwen(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """The dense checkpoint, then the MoE one (experts in every decoder layer)."""
    return made(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def daemon(qwen: Path) -> Iterator[Daemon]:
    yield from served(qwen, name="qwen")


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> openai.OpenAI:
    return client_of(daemon)


@pytest.fixture(scope="module")
def parity(qwen: Path) -> Parity:
    return Parity(qwen, FAMILY)


def test_an_image_answer_equals_mlx_vlm_generate(client: openai.OpenAI, parity: Parity) -> None:
    # 30 image tokens: the image straddles a block edge
    answer = parity.check_image(client, png(1, (200, 150)))
    assert answer.usage.prompt_tokens > 30


def test_text_only_requests_to_the_vlm(client: openai.OpenAI, parity: Parity) -> None:
    parity.check_text(client, [{"role": "user", "content": "Tell me a story about the sea."}])


def test_images_in_a_busy_batch_beside_text_requests(client: openai.OpenAI, parity: Parity) -> None:
    """Image rows (each its own negative delta) and text rows prefill and decode together."""
    images = [png(2, SQUARE), png(3, (120, 200)), png(4, (90, 60))]
    parity.check_batch(client, images, [_count(n) for n in (1, 2)], images_differ=False)


def _count(n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Count the numbers up to {n * 7}, please."}]


def test_the_same_image_twice_hits_and_another_never_does(
    client: openai.OpenAI, parity: Parity
) -> None:
    # the image's blocks: prefill resumes past the image; no block holding another matches
    parity.check_hit_and_miss(client, png(5, SQUARE), png(6, SQUARE), 64, answers_differ=False)


def test_text_after_the_image_in_a_later_turn(client: openai.OpenAI, parity: Parity) -> None:
    """The second turn hits the first's blocks (image included) and its new text runs at
    index + delta."""
    parity.check_later_turn(client, png(7, SQUARE))


def test_two_images_of_different_sizes(client: openai.OpenAI, parity: Parity) -> None:
    parity.check_two_images(client, png(8, (200, 150)), png(9, (90, 140)))


# Preemption: a KV pool of a few requests' worth


@pytest.fixture(scope="module")
def tight(qwen: Path) -> Iterator[Daemon]:
    # 512 bytes a token (2 layers, 2 KV heads of 16, float32 K and V): about 400 tokens,
    # room for four ~85-token image prompts but not their answers
    yield from served(qwen, "--kv-cache-gb", "0.0002", "--kv-block-size", "16", name="qwen")


def test_image_requests_preempted_and_resumed_answer_as_mlx_vlm(
    tight: Daemon, parity: Parity
) -> None:
    """A resumed sequence prefills its prompt and its answer so far: the answer's tokens sit
    past the prompt, at index + delta."""
    parity.check_preempted(tight, [png(20 + n, SQUARE) for n in range(4)])


# Prefill in chunks smaller than an image


@pytest.fixture(scope="module")
def chunked(qwen: Path) -> Iterator[Daemon]:
    yield from served(qwen, "--prefill-chunk", str(CHUNK), name="qwen")


def test_an_image_over_several_prefill_chunks(chunked: Daemon, parity: Parity) -> None:
    """Each chunk adds the deepstack features of its own placeholders only, at its own columns:
    two image prompts whose images start at different chunk offsets (one image in five chunks,
    one straddling three) and a text request, prefilled together; then the first again (a
    prefix hit whose remaining chunks take the features from the feature cache)."""
    client = client_of(chunked)
    images = [png(30, SQUARE), png(31, (200, 150))]
    text = _count(3)
    asks = [parity.messages(images[0]), parity.messages(images[1]), text]
    answers = together([partial(parity.ask, client, m) for m in asks])
    expected = [parity.expected([i], m) for i, m in zip(images, asks[:2], strict=True)]
    expected.append(parity.expected([], text))
    assert [tokens(a) for a in answers] == expected
    again = parity.ask(client, asks[0])
    assert cached(again) >= 64
    assert tokens(again) == tokens(answers[0])
