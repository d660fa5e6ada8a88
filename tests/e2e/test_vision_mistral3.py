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

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.conftest import Daemon
from tests.e2e.vision_parity import (
    LONG_QUESTION,
    Family,
    Parity,
    client_of,
    made,
    png,
    served,
    story,
)

pytest.importorskip("mlx_vlm")
pytestmark = [pytest.mark.e2e, pytest.mark.families]

SQUARE = (130, 90)  # 6 rows of 8 image tokens: 48
WIDE = (120, 50)  # 4 rows of 8: 32
SMALL = (20, 20)  # not scaled up: 3 rows of 3
# Its processor's padded pixels and each image's own size.
FAMILY = Family(
    name="mistral3",
    question=LONG_QUESTION,
    max_tokens=12,
    image_keys=("pixel_values", "image_sizes"),
)


@pytest.fixture(scope="module")
def mistral3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made(tmp_path_factory, "mistral3")


@pytest.fixture(scope="module")
def daemon(mistral3: Path) -> Iterator[Daemon]:
    yield from served(mistral3, name="mistral3")


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> openai.OpenAI:
    return client_of(daemon)


@pytest.fixture(scope="module")
def parity(mistral3: Path) -> Parity:
    return Parity(mistral3, FAMILY)


def test_an_image_answer_equals_mlx_vlm_generate(client: openai.OpenAI, parity: Parity) -> None:
    answer = parity.check_image(client, png(1, SQUARE))
    assert answer.usage.prompt_tokens > 48 + 6  # six rows of image tokens, their markers


def test_a_text_request_to_the_vlm_equals_mlx_vlm_generate(
    client: openai.OpenAI, parity: Parity
) -> None:
    parity.check_text(client, story(0))


def test_images_in_a_busy_batch_with_text_requests(client: openai.OpenAI, parity: Parity) -> None:
    """Three image requests (three sizes) and three text requests at once: one decode
    batch, prefill chunks with and without images side by side; each answer is its own alone."""
    images = [png(10, SQUARE), png(11, WIDE), png(12, SMALL)]
    parity.check_batch(client, images, [story(n + 1) for n in range(3)])


def test_the_same_image_twice_hits_past_the_image_and_another_never_does(
    client: openai.OpenAI, parity: Parity
) -> None:
    from mlxd.models.mistral3_maker import IMAGE_TOKEN, TOKEN_IDS

    first, second = png(3, SQUARE), png(4, SQUARE)
    last_image_token = parity.last_image_position(first, TOKEN_IDS[IMAGE_TOKEN])
    parity.check_hit_and_miss(client, first, second, least_hit=last_image_token + 1)


def test_two_images_of_different_sizes(client: openai.OpenAI, parity: Parity) -> None:
    """48 and 32 image tokens: each image's own count keys its placeholders (an even split
    would key a row of the first image by the second's digest)."""
    second = png(9, WIDE)
    answer = parity.check_two_images(client, png(8, SQUARE), second)
    assert answer.usage.prompt_tokens > 80  # both images' tokens
    # the wide image alone, after both: its features come from the feature cache
    parity.check_image(client, second)


def test_text_after_the_image_in_a_later_turn(client: openai.OpenAI, parity: Parity) -> None:
    parity.check_later_turn(client, png(7, WIDE))


# Preemption: a KV pool of a few requests' worth


@pytest.fixture(scope="module")
def tight(mistral3: Path) -> Iterator[Daemon]:
    # 512 bytes a token (2 layers, 2 KV heads of 16, float32 K and V): about 400 tokens,
    # room for four ~75-token image prompts, not their answers
    yield from served(mistral3, "--kv-cache-gb", "0.0002", "--kv-block-size", "16", name="mistral3")


def test_image_requests_preempted_and_resumed_answer_as_mlx_vlm(
    tight: Daemon, parity: Parity
) -> None:
    parity.check_preempted(tight, [png(20 + n, WIDE) for n in range(4)])
