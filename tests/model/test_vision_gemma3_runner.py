"""Gemma 3 through mlx-vlm on the worker's side: its language model is served by the window
runner, and a prefill chunk's embeddings (text tokens, image features spliced in) are the ones
the model's own ``get_input_embeddings`` makes. Needs the ``vision`` extra (mlx-vlm)."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

pytest.importorskip("mlx_vlm")
pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlxd.models.vlm_maker import make_vlm

    out = tmp_path_factory.mktemp("vlm") / "gemma3"
    return make_vlm(out, arch="gemma3", progress=lambda line: None)


@pytest.fixture(scope="module")
def loaded(gemma3: Path) -> tuple[Any, Any, Any]:
    """(the runners' language model, the whole mlx-vlm model, its processor)."""
    from mlxd.worker.vision.model import load_vlm

    model, _, (vlm, processor) = load_vlm(str(gemma3))
    return model, vlm, processor


def _png(seed: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (70, 100, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def test_the_window_runner_serves_its_language_model(
    gemma3: Path, loaded: tuple[Any, Any, Any]
) -> None:
    from mlxd.config import CacheConfig, WorkerConfig
    from mlxd.models.vlm_maker import GEMMA3_WINDOW
    from mlxd.worker.build import build_runner
    from mlxd.worker.runners.window import WindowModelRunner

    config = WorkerConfig(
        model=str(gemma3), name="g", endpoint="ipc:///tmp/g", cache=CacheConfig(kv_cache_gb=0.01)
    )
    runner, pool, _ = build_runner(loaded[0], {2}, config, 4096)
    assert isinstance(runner, WindowModelRunner) and pool is not None
    assert runner.window == GEMMA3_WINDOW
    assert len(runner.windows.keys) == len(runner.pool.keys) == 1  # one window, one full layer


def test_text_embeddings_given_equal_the_decoder_s_own(loaded: tuple[Any, Any, Any]) -> None:
    """Gemma scales embeddings by sqrt(hidden) in the decoder: given embeddings (a chunk with
    an image) are scaled as its own are (a chunk of text alone), so the two paths agree."""
    model = loaded[0]
    tokens = mx.array([[1, 2095, 780, 305, 61, 78, 278, 315]])
    assert mx.array_equal(model(tokens), model(tokens, input_embeddings=model.embed(tokens)))


def test_a_chunk_s_embeddings_are_the_model_s_own(loaded: tuple[Any, Any, Any]) -> None:
    """The whole prompt in one row, and a middle chunk of it left-padded in a wider forward:
    text tokens and spliced image features equal ``get_input_embeddings``' at each position."""
    from mlxd.protocol.messages import ImageData, SamplingParams
    from mlxd.worker.sched.sequence import Sequence
    from mlxd.worker.vision.encoder import ImageEncoder

    model, vlm, processor = loaded
    encoder = ImageEncoder(vlm, processor, model)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi."}]}]
    text = processor.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    png = _png(1)
    image = ImageData(data=png, digest=hashlib.sha256(png).hexdigest())
    prepared = encoder.prepare(text, [image]).result()
    ids = mx.array([prepared.prompt_ids])
    seq = Sequence("r", b"", prepared.prompt_ids, SamplingParams(), 1)
    seq.images = prepared.images
    theirs = vlm.get_input_embeddings(
        ids, mx.array(prepared.images.pixel_values), mask=mx.ones(ids.shape, dtype=mx.int32)
    ).inputs_embeds
    n = len(prepared.prompt_ids)
    whole = encoder.embeddings(ids, [(seq, 0, n)])
    assert whole is not None and mx.array_equal(whole, theirs)
    start, end, pad = 20, 60, 8  # placeholders 4 .. 67: the chunk is image tokens only
    row = mx.array([[0] * pad + prepared.prompt_ids[start:end]])
    chunk = encoder.embeddings(row, [(seq, start, end)])
    assert chunk is not None and mx.array_equal(chunk[:, pad:], theirs[:, start:end])
    encoder.close()
