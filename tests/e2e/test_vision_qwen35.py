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

from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon
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

SQUARE = (224, 224)  # 49 image tokens at 4..52: a 75-token prompt, its hit two 32-token blocks
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
    return made(tmp_path_factory, "qwen3_5_vl")


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
    # 30 image tokens at 4..33: the image straddles a block edge
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
    # 256 bytes a token (one attention layer, 2 KV heads of 16, float32 K and V); of 200 kB,
    # a quarter for the prefix cache's snapshots and 44 kB for four rows' recurrent states
    # (two each): about 400 tokens, room for four 75-token image prompts but not their answers
    yield from served(
        qwen,
        *("--kv-cache-gb", "0.0002", "--kv-block-size", "16", "--max-num-seqs", "4"),
        name="qwen",
    )


def test_image_requests_preempted_and_resumed_answer_as_mlx_vlm(
    tight: Daemon, parity: Parity
) -> None:
    """A resumed sequence prefills its prompt and its answer so far: the answer's tokens sit
    past the prompt, at index + delta."""
    parity.check_preempted(tight, [png(20 + n, SQUARE) for n in range(4)])


# Qwen3.5-MoE: the same hybrid, sparse MLPs (routed experts and a shared one) in every layer


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made(tmp_path_factory, "qwen3_5_moe_vl")


@pytest.fixture(scope="module")
def moe_client(moe: Path) -> Iterator[openai.OpenAI]:
    d = start_daemon(moe, name="moe")
    yield client_of(d)
    if d.proc.poll() is None:
        stop_daemon(d)


def test_moe_images_beside_text_and_a_hit_answer_as_mlx_vlm(
    moe_client: openai.OpenAI, moe: Path
) -> None:
    """Two images and a text request at once, then the first image again (a prefix hit)."""
    parity = Parity(moe, replace(FAMILY, name="moe"))
    images = [png(30, SQUARE), png(31, (120, 200))]
    asks = [parity.messages(i) for i in images] + [
        [{"role": "user", "content": "Name three rivers."}]
    ]
    answers = together([partial(parity.ask, moe_client, m) for m in asks])
    again = parity.ask(moe_client, asks[0])
    expected = [parity.expected([i], m) for i, m in zip(images, asks, strict=False)]
    expected.append(parity.expected([], asks[2]))
    assert [tokens(a) for a in answers] == expected
    assert cached(again) >= 64
    assert tokens(again) == expected[0]
