"""Qwen3-VL's prompt positions and deepstack inputs: its image positions are Qwen2.5-VL's (mlxd's
``prompt_positions`` equals its ``get_rope_index``), and a forward's deepstack arguments hold
each layer's features of the picked image tokens in row order, at their columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlx_vlm")
pytestmark = pytest.mark.model

IMAGE = 8194


@pytest.fixture(scope="module")
def qwen3_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlxd.models.vlm_maker import make_vlm

    path = tmp_path_factory.mktemp("vlm") / "qwen3vl"
    return make_vlm(path, arch="qwen3_vl", progress=lambda line: None)


def test_prompt_positions_equal_qwen3_vls_rope_index(qwen3_vl: Path) -> None:
    import mlx.core as mx
    from mlx_vlm import load

    from mlxd.worker.vision.deepstack import takes_deepstack
    from mlxd.worker.vision.mrope import prompt_positions

    model, _ = load(str(qwen3_vl))
    assert takes_deepstack(model.language_model)
    grids = [(1, 10, 12), (1, 6, 4), (1, 4, 4)]
    ids = [1, 70, 71]
    for t, h, w in grids:
        ids += [8192] + [IMAGE] * (t * h * w // 4) + [8193, 72]
    ids += [73, 74, 75]
    expected, delta = model.language_model.get_rope_index(mx.array([ids]), mx.array(grids))
    positions, own_delta = prompt_positions(ids, np.array(grids), IMAGE, 2)
    assert np.array_equal(positions, np.asarray(expected)[:, 0])
    assert own_delta == int(delta.item()) < 0


def test_forward_inputs_split_each_layer_in_row_order() -> None:
    import mlx.core as mx

    from mlxd.worker.vision.deepstack import forward_inputs

    hidden, layers = 2, 3
    # two rows' picked tokens: each row is [own features, layer 0, layer 1, layer 2]
    first = mx.array([[0, 0, 10, 10, 20, 20, 30, 30], [1, 1, 11, 11, 21, 21, 31, 31]])
    second = mx.array([[2, 2, 12, 12, 22, 22, 32, 32]])
    mask = np.array([[False, True, True], [False, False, True]])
    out = forward_inputs(mask, [first, second], hidden, layers)
    assert np.array_equal(np.asarray(out["visual_pos_masks"]), mask)
    per_layer = [np.asarray(x)[:, 0].tolist() for x in out["deepstack_visual_embeds"]]
    assert per_layer == [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
