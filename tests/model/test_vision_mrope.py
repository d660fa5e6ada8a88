"""Qwen-VL's multimodal positions: the prompt's rows as mlx-vlm's ``get_rope_index`` gives them
(images of different sizes, text before, between and after), and any forward's rows from them:
padding, prompt positions, and index + delta past the prompt."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mlx_vlm")
pytestmark = pytest.mark.model

IMAGE = 8194


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlxd.models.vlm_maker import make_vlm

    path = tmp_path_factory.mktemp("vlm") / "qwen"
    return make_vlm(path, arch="qwen2_5_vl", progress=lambda line: None)


def _prompt(grids: list[tuple[int, int, int]]) -> list[int]:
    """Text, then each image's placeholders between vision start/end tokens, then text."""
    ids = [1, 70, 71]
    for t, h, w in grids:
        ids += [8192] + [IMAGE] * (t * h * w // 4) + [8193, 72]
    return ids + [73, 74, 75]


def test_prompt_positions_equal_mlx_vlms_rope_index(qwen: Path) -> None:
    import mlx.core as mx
    from mlx_vlm import load

    from mlxd.worker.vision.mrope import prompt_positions

    model, _ = load(str(qwen))
    grids = [(1, 10, 14), (1, 6, 4), (1, 4, 4)]
    ids = _prompt(grids)
    expected, delta = model.language_model.get_rope_index(mx.array([ids]), mx.array(grids))
    positions, own_delta = prompt_positions(ids, np.array(grids), IMAGE, 2)
    assert np.array_equal(positions, np.asarray(expected)[:, 0])
    assert own_delta == int(delta.item()) < 0


def _seq(positions: Any, delta: int, computed: int = 0) -> Any:
    images = SimpleNamespace(mrope=positions, delta=delta)
    return SimpleNamespace(images=images, num_computed=computed)


def test_rows_of_a_forward() -> None:
    from mlxd.worker.vision.mrope import PAD, MRope

    table = np.array([[0, 1, 2, 2, 3], [0, 1, 2, 3, 3], [0, 1, 1, 2, 3]])
    seq = _seq(table, delta=-1, computed=6)
    text = SimpleNamespace(images=None, num_computed=4)
    ids = MRope().position_ids([(seq, [PAD, 3, 4, 5]), (text, [1, 2, 3, 4])])
    assert ids is not None and ids.shape == (3, 2, 4)
    got = np.asarray(ids)
    assert got[:, 0].tolist() == [[0, 2, 3, 4], [0, 3, 3, 4], [0, 2, 3, 4]]  # 5 -> 5 + delta
    assert (got[:, 1] == [1, 2, 3, 4]).all()
    step = MRope().decode([seq, text])
    assert step is not None and np.asarray(step)[:, :, 0].tolist() == [[5, 4]] * 3
    assert MRope().decode([text]) is None  # text rows only: the cache offsets serve
