"""The vision tower in bounded slices (``ImageEncoder.encode_ahead``) on the made tiny LLaVA:
a step runs the tower on as many images as its budget buys (one at least) and splices them in
that step's chunk, which stops before the first image left for a later step; one image's
features alone are the joint pass's (to a threaded BLAS's last bits)."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlx_vlm")
pytestmark = pytest.mark.model

IMAGES = 3


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from mlxd.models.vlm_maker import make_vlm
    from mlxd.worker.vision.encoder import ImageEncoder
    from mlxd.worker.vision.model import load_vlm

    path = make_vlm(tmp_path_factory.mktemp("vlm") / "llava", progress=lambda line: None)
    text, _, (vlm, processor) = load_vlm(str(Path(path)))
    enc = ImageEncoder(vlm, processor, text)
    yield enc
    enc.close()


def _image(seed: int) -> Any:
    import numpy as np
    from PIL import Image

    from mlxd.protocol.messages import ImageData

    pixels = np.random.default_rng(seed).integers(0, 256, (90, 130, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return ImageData(data=buf.getvalue(), digest=hashlib.sha256(buf.getvalue()).hexdigest())


def _sequence(encoder: Any, seed: int) -> Any:
    from mlxd.protocol.messages import SamplingParams
    from mlxd.worker.sched.sequence import Sequence

    parts: list[dict[str, str]] = [{"type": "image"} for _ in range(IMAGES)]
    messages = [{"role": "user", "content": [*parts, {"type": "text", "text": "Compare them."}]}]
    text = encoder.processor.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    prepared = encoder.prepare(text, [_image(seed + k) for k in range(IMAGES)]).result()
    seq = Sequence(
        request_id=f"r{seed}",
        client=b"c",
        prompt_ids=prepared.prompt_ids,
        sampling=SamplingParams(),
        max_tokens=4,
        arrival=0.0,
    )
    seq.images, seq.prompt_keys = prepared.images, prepared.keys
    return seq


def test_a_step_encodes_one_image_when_its_budget_buys_one(encoder: Any) -> None:
    import mlx.core as mx

    from mlxd.worker.sched.scheduler import PrefillChunk

    seq = _sequence(encoder, 100)
    img, n = seq.images, len(seq.prompt_ids)
    before = encoder.counters.encoded
    edges = [0] + [img.first_position(k) for k in range(1, IMAGES)] + [n]
    for step in range(IMAGES):  # each step's chunk runs from where the last one stopped
        kept = encoder.encode_ahead([PrefillChunk(seq, edges[step], n)], budget=1)
        # image ``step`` ran through the tower and is spliced in this step; the chunk stops
        # before the next (the budget buys one); the last one runs through to the end
        assert kept == [PrefillChunk(seq, edges[step], edges[step + 1])]
        assert encoder.counters.encoded - before == step + 1
    whole = encoder._encode(seq, img)  # the joint pass, all images at once
    ahead = encoder._from_parts(img)
    # equal but for the last bits: a threaded BLAS splits a product's rows by the batch's size
    # (OpenBLAS 0.3.21 on 2 cores: 1.2e-6 apart; MLX's own BLAS: bit for bit)
    assert mx.allclose(ahead, whole, rtol=1e-5, atol=1e-5).item()


def test_a_large_budget_encodes_every_image_in_one_step(encoder: Any) -> None:
    from mlxd.worker.sched.scheduler import PrefillChunk

    seq = _sequence(encoder, 200)
    before = encoder.counters.encoded
    kept = encoder.encode_ahead([PrefillChunk(seq, 0, len(seq.prompt_ids))], budget=10_000)
    assert encoder.counters.encoded - before == IMAGES
    assert kept == [PrefillChunk(seq, 0, len(seq.prompt_ids))]  # all spliced in this step
    again = encoder.encode_ahead([PrefillChunk(seq, 0, len(seq.prompt_ids))], 1)
    assert encoder.counters.encoded - before == IMAGES  # no tower: all are at hand
    assert again == kept


def test_images_in_the_feature_cache_cost_nothing(encoder: Any) -> None:
    from mlxd.worker.sched.scheduler import PrefillChunk

    first = _sequence(encoder, 300)
    encoder.encode_ahead([PrefillChunk(first, 0, len(first.prompt_ids))], budget=10_000)
    repeat = _sequence(encoder, 300)  # the same images: their features are cached
    before = encoder.counters.encoded
    kept = encoder.encode_ahead([PrefillChunk(repeat, 0, len(repeat.prompt_ids))], budget=1)
    assert encoder.counters.encoded == before
    assert kept == [PrefillChunk(repeat, 0, len(repeat.prompt_ids))]
