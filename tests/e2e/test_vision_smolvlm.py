"""Images through the daemon on a tiny random SmolVLM (and Idefics3): tiled images, fast path.

SmolVLM's processor splits an image into tiles: each tile's 16 image tokens follow its
``<row_R_col_C>`` marker and the whole image shrunk to one tile comes last, after
``<global-img>``, so one image is several placeholder runs and its count follows its aspect
ratio (80 for a squarish image, 48 for a wide one). Greedy output equals mlx-vlm's own
``generate`` for the same image(s) and prompt, token for token: alone, in a busy batch beside
text requests, after a prefix hit that covers the whole image, for another image with the same
text (no false hit), for text alone, for two images of different tile counts (either order),
in a later turn, and after preemption. Needs the ``vision`` extra (mlx-vlm); skipped without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import openai
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon
from tests.e2e.vision_parity import (
    BLOCK,
    LONG_QUESTION,
    Family,
    Parity,
    cached,
    client_of,
    image_part,
    made,
    png,
    served,
    story,
    tokens,
)

pytest.importorskip("mlx_vlm")
pytestmark = [pytest.mark.e2e, pytest.mark.families]

SQUARE = (130, 90)  # 2 x 2 tiles and the global one: 80 image tokens
WIDE = (120, 50)  # 1 x 2 tiles and the global one: 48
# Its processor's pixels and which of them are real.
FAMILY = Family(
    name="smolvlm",
    question=LONG_QUESTION,
    max_tokens=12,
    image_keys=("pixel_values", "pixel_attention_mask"),
)


@pytest.fixture(scope="module")
def smolvlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made(tmp_path_factory, "smolvlm")


@pytest.fixture(scope="module")
def daemon(smolvlm: Path) -> Iterator[Daemon]:
    yield from served(smolvlm, name="smolvlm")


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> openai.OpenAI:
    return client_of(daemon)


@pytest.fixture(scope="module")
def parity(smolvlm: Path) -> Parity:
    return Parity(smolvlm, FAMILY)


def test_an_image_answer_equals_mlx_vlm_generate(client: openai.OpenAI, parity: Parity) -> None:
    answer = parity.check_image(client, png(1, SQUARE))
    assert answer.usage.prompt_tokens > 80  # five runs of 16 image tokens among them


def test_a_text_request_to_the_vlm_equals_mlx_vlm_generate(
    client: openai.OpenAI, parity: Parity
) -> None:
    parity.check_text(client, story(0))


def test_images_in_a_busy_batch_with_text_requests(client: openai.OpenAI, parity: Parity) -> None:
    """Three image requests (two tile layouts) and three text requests at once: one decode
    batch, prefill chunks with and without images side by side; each answer is its own alone."""
    images = [png(10, SQUARE), png(11, WIDE), png(12, (50, 110))]
    parity.check_batch(client, images, [story(n + 1) for n in range(3)])


def test_the_same_image_twice_hits_past_the_image_and_another_never_does(
    client: openai.OpenAI, parity: Parity
) -> None:
    from mlxd.models.smolvlm_maker import IMAGE_TOKEN, TOKEN_IDS

    first, second = png(3, SQUARE), png(4, SQUARE)
    last_image_token = parity.last_image_position(first, TOKEN_IDS[IMAGE_TOKEN])
    parity.check_hit_and_miss(client, first, second, least_hit=last_image_token + 1)


def test_two_images_of_different_tile_counts(client: openai.OpenAI, parity: Parity) -> None:
    """80 and 48 image tokens: each image's own count keys its placeholders (an even split
    would key a tile of the first image by the second's digest)."""
    second = png(9, WIDE)
    answer = parity.check_two_images(client, png(8, SQUARE), second)
    assert answer.usage.prompt_tokens > 128  # both images' tokens
    # the wide image alone, after both: its features come from the feature cache
    parity.check_image(client, second)


def test_text_after_the_image_in_a_later_turn(client: openai.OpenAI, parity: Parity) -> None:
    parity.check_later_turn(client, png(7, WIDE))


# Preemption: a KV pool of a few requests' worth


@pytest.fixture(scope="module")
def tight(smolvlm: Path) -> Iterator[Daemon]:
    # 512 bytes a token (2 layers, 2 KV heads of 16, float32 K and V): about 400 tokens,
    # room for four ~140-token image prompts' worth at most, not their answers
    yield from served(smolvlm, "--kv-cache-gb", "0.0002", "--kv-block-size", "16", name="smolvlm")


def test_image_requests_preempted_and_resumed_answer_as_mlx_vlm(
    tight: Daemon, parity: Parity
) -> None:
    parity.check_preempted(tight, [png(20 + n, WIDE) for n in range(4)])


# Idefics3: the same checkpoint under Idefics3's names (its processor, its model type)


@pytest.fixture(scope="module")
def idefics3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made(tmp_path_factory, "idefics3")


def test_idefics3_answers_equal_mlx_vlm_generate(idefics3: Path) -> None:
    parity = Parity(idefics3, replace(FAMILY, name="idefics3"))
    d = start_daemon(idefics3, name="idefics3")
    try:
        client = client_of(d)
        first, second = png(30, SQUARE), png(31, WIDE)
        content = [image_part(first), image_part(second), {"type": "text", "text": LONG_QUESTION}]
        messages = [{"role": "user", "content": content}]
        answer = parity.ask(client, messages)
        assert tokens(answer) == parity.expected([first, second], messages)
        again = parity.ask(client, messages)
        assert cached(again) >= 128 + BLOCK  # both images' blocks
        assert tokens(again) == tokens(answer)
    finally:
        stop_daemon(d)
