"""Images through the daemon on a tiny random Qwen2.5-VL: multimodal RoPE on the paged fast path.

Greedy output equals mlx-vlm's own ``generate`` for the same image(s) and prompt, token for
token: alone, in a busy batch beside text requests, after a prefix hit on the same image, in a
later turn whose text follows the image, with two images of different sizes; a different image
with the same text never hits; text-only requests equal mlx-vlm's text answer. Qwen's image
tokens sit at their grid positions and every later token at its index + a negative delta, so
any position slip (a chunk's start, left padding, a decode row's offset) changes the answer.
Needs the ``vision`` extra (mlx-vlm); skipped without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
)

pytest.importorskip("mlx_vlm")
pytestmark = [pytest.mark.e2e, pytest.mark.families]

SQUARE = (224, 224)  # 64 image tokens: two whole 32-token blocks with the text before them
# Its processor's pixels and each image's patch grid (time, height, width); no attention mask.
FAMILY = Family(
    name="qwen",
    question=SHORT_QUESTION,
    max_tokens=16,
    image_keys=("pixel_values", "image_grid_thw"),
    mask=False,
)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made(tmp_path_factory, "qwen2_5_vl")


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
    # 35 image tokens: the image straddles a block edge
    answer = parity.check_image(client, png(1, (200, 150)))
    assert answer.usage.prompt_tokens > 35


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
