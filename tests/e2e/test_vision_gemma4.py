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

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.conftest import Daemon
from tests.e2e.vision_parity import (
    BLOCK,
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
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.families,
    # mlx-vlm's processor builds Gemma 4's audio feature extractor too, which warns so
    pytest.mark.filterwarnings("ignore:At least one mel filter:UserWarning"),
]

# Its processor's pixels: one array, or a list of images of different sizes (each keeps its
# aspect ratio), as mlx-vlm's tower takes them.
FAMILY = Family(
    name="gemma4",
    question=LONG_QUESTION,
    max_tokens=12,
    image_keys=("pixel_values",),
    ragged_pixels=True,
)


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made(tmp_path_factory, "gemma4")


@pytest.fixture(scope="module")
def daemon(gemma4: Path) -> Iterator[Daemon]:
    yield from served(gemma4, name="gemma4")


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> openai.OpenAI:
    return client_of(daemon)


@pytest.fixture(scope="module")
def parity(gemma4: Path) -> Parity:
    return Parity(gemma4, FAMILY)


def test_an_image_answer_equals_mlx_vlm_generate(client: openai.OpenAI, parity: Parity) -> None:
    answer = parity.check_image(client, png(1))
    # 54 image tokens among them (130 x 90 pixels scaled to 72 x 48); past the third block
    assert answer.usage.prompt_tokens > 3 * BLOCK


def test_a_text_request_to_the_vlm_equals_mlx_vlm_generate(
    client: openai.OpenAI, parity: Parity
) -> None:
    parity.check_text(client, story(0))


def test_images_in_a_busy_batch_with_text_requests(client: openai.OpenAI, parity: Parity) -> None:
    """Three image requests and three text requests at once: one decode batch, prefill chunks
    with and without images side by side; each answer is its own alone."""
    parity.check_batch(client, [png(10 + n) for n in range(3)], [story(n + 1) for n in range(3)])


def test_the_same_image_twice_hits_past_the_image_and_another_never_does(
    client: openai.OpenAI, parity: Parity
) -> None:
    from mlxd.models.vlm_maker import GEMMA3_IMAGE_TOKEN, GEMMA3_TOKEN_IDS

    first, second = png(3), png(4)
    last_image_token = parity.last_image_position(first, GEMMA3_TOKEN_IDS[GEMMA3_IMAGE_TOKEN])
    # the hit covers every image token (and the window layers' slabs before its end)
    parity.check_hit_and_miss(client, first, second, least_hit=last_image_token + 1)


def test_two_images_of_different_sizes_in_one_request(
    client: openai.OpenAI, parity: Parity
) -> None:
    second = png(9, size=(90, 90))  # 54 image tokens in the first, then 64
    answer = parity.check_two_images(client, png(8), second, swapped=False)
    assert answer.usage.prompt_tokens > 54 + 64  # both images' tokens, each its own count
    # the second alone: its features from the feature cache, split from the first's by counts
    parity.check_image(client, second)


# Preemption: a KV pool of a few requests' worth


@pytest.fixture(scope="module")
def tight(gemma4: Path) -> Iterator[Daemon]:
    # 512 bytes a token in the full layer's blocks (2 KV heads of 32, float32 K and V), beside
    # the window layer's slabs: a few requests' worth, so four answers outgrow it
    yield from served(gemma4, "--kv-cache-gb", "0.00025", "--kv-block-size", "16", name="gemma4")


def test_image_requests_preempted_and_resumed_answer_as_mlx_vlm(
    tight: Daemon, parity: Parity
) -> None:
    """Preempted image requests recompute their prompts (the image's K/V from the prefix cache
    or the tower again, the window layers' slabs taken anew) and their answers so far."""
    parity.check_preempted(tight, [png(20 + n) for n in range(4)])
