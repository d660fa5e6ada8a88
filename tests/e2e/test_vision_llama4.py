"""Images through the daemon on a tiny random Llama 4: tiles, experts, the paged runner.

Llama 4's processor picks the tiling that fits an image best and lays it out as its tiles'
``<|patch|>`` runs between separators, then ``<|image|>`` and the whole image shrunk to one
tile, then ``<|image_end|>``: 16 image tokens for a square image, 48 for a 2:1 one, 80 for a
5:1 one. Its decoder's chunked layers (and its NoPE layer's position scale) equal plain causal
layers within the first attention chunk, so mlxd serves it on the paged runner with its
context capped there (255 tokens in the tiny model; a longer prompt is refused). Greedy output
equals mlx-vlm's own ``generate`` for the same image(s) and prompt, token for token: alone, in
a busy batch beside text requests, after a prefix hit that covers the whole image, for another
image with the same text (no false hit), for text alone, for two images of different tile
counts (either order), in a later turn, and after preemption. Needs the ``vision`` extra
(mlx-vlm); skipped without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

SQUARE = (90, 90)  # one tile: 16 image tokens
WIDE = (120, 60)  # 1 x 2 tiles and the global one: 48
LONG = (300, 60)  # 1 x 4 tiles and the global one: 80
CONTEXT = 255  # the tiny model's first attention chunk, less one


def _add_global_tiles(processor: Any) -> None:
    """Each tiled image's global tile added as transformers' processor adds it (mlx-vlm
    0.7.10's leaves it out, and its merge then reads past the tower's features: a different
    answer on every call)."""
    from mlxd.worker.vision.llama4 import add_global_tiles

    add_global_tiles(processor)


# Its processor's pixels: every image's tiles.
FAMILY = Family(
    name="llama4",
    question=LONG_QUESTION,
    max_tokens=12,
    image_keys=("pixel_values",),
    prepare=_add_global_tiles,
)


@pytest.fixture(scope="module")
def llama4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made(tmp_path_factory, "llama4")


@pytest.fixture(scope="module")
def daemon(llama4: Path) -> Iterator[Daemon]:
    yield from served(llama4, name="llama4")


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> openai.OpenAI:
    return client_of(daemon)


@pytest.fixture(scope="module")
def parity(llama4: Path) -> Parity:
    return Parity(llama4, FAMILY)


def test_an_image_answer_equals_mlx_vlm_generate(client: openai.OpenAI, parity: Parity) -> None:
    answer = parity.check_image(client, png(1, LONG))
    assert answer.usage.prompt_tokens > 80 + 6  # five runs of image tokens, their markers


def test_a_text_request_to_the_vlm_equals_mlx_vlm_generate(
    client: openai.OpenAI, parity: Parity
) -> None:
    parity.check_text(client, story(0))


def test_images_in_a_busy_batch_with_text_requests(client: openai.OpenAI, parity: Parity) -> None:
    """Three image requests (three sizes) and three text requests at once: one decode
    batch, prefill chunks with and without images side by side; each answer is its own alone."""
    images = [png(10, SQUARE), png(11, WIDE), png(12, LONG)]
    parity.check_batch(client, images, [story(n + 1) for n in range(3)])


def test_the_same_image_twice_hits_past_the_image_and_another_never_does(
    client: openai.OpenAI, parity: Parity
) -> None:
    from mlxd.models.llama4_maker import PATCH_TOKEN, TOKEN_IDS

    first, second = png(3, WIDE), png(4, WIDE)
    last_image_token = parity.last_image_position(first, TOKEN_IDS[PATCH_TOKEN])
    parity.check_hit_and_miss(client, first, second, least_hit=last_image_token + 1)


def test_two_images_of_different_sizes(client: openai.OpenAI, parity: Parity) -> None:
    """80 and 48 image tokens: each image's own count keys its placeholders (an even split
    would key a tile of the first image by the second's digest)."""
    second = png(9, WIDE)
    answer = parity.check_two_images(client, png(8, LONG), second)
    assert answer.usage.prompt_tokens > 128  # both images' tokens
    # the wide image alone, after both: its features come from the feature cache
    parity.check_image(client, second)


def test_a_prompt_past_the_first_chunk_is_refused(client: openai.OpenAI, parity: Parity) -> None:
    """Past the first attention chunk the chunked layers would need chunk-aligned masks: the
    context is capped there, and a longer prompt is refused rather than answered wrongly."""
    long = [{"role": "user", "content": "Tell me about the sea. " * 60}]
    with pytest.raises(openai.BadRequestError, match=f"context is {CONTEXT} tokens"):
        parity.ask(client, long)


def test_text_after_the_image_in_a_later_turn(client: openai.OpenAI, parity: Parity) -> None:
    parity.check_later_turn(client, png(7, WIDE))


# Preemption: a KV pool of a few requests' worth


@pytest.fixture(scope="module")
def tight(llama4: Path) -> Iterator[Daemon]:
    # 1 KiB a token (4 layers, 2 KV heads of 16, float32 K and V): about 290 tokens, room
    # for one ~100-token image prompt and its answer and a bit, not four
    yield from served(llama4, "--kv-cache-gb", "0.0003", "--kv-block-size", "16", name="llama4")


def test_image_requests_preempted_and_resumed_answer_as_mlx_vlm(
    tight: Daemon, parity: Parity
) -> None:
    parity.check_preempted(tight, [png(20 + n, WIDE) for n in range(4)])
