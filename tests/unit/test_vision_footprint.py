"""A vision-language model's footprint: its tower's weights split out of the files' headers,
and the encoder's peak activations (``vision_layout``) reserved in the headroom."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from mlxd.config import ModelSpec, ServeConfig
from mlxd.daemon.footprint import RUNTIME_BYTES, device_share, footprint
from mlxd.models.vision_layout import (
    FEATURE_CACHE_BYTES,
    encoder_peak_bytes,
    vision_weight_bytes,
)

# LLaVA 1.5's CLIP ViT-L/14 at 336 pixels: 24 x 24 = 576 patches.
CLIP_L = {
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "intermediate_size": 4096,
    "num_attention_heads": 16,
    "image_size": 336,
    "patch_size": 14,
}


def _safetensors(path: Path, tensors: dict[str, int]) -> None:
    """A safetensors file of float32 tensors ``name: values`` (zeros)."""
    header: dict[str, Any] = {}
    offset = 0
    for name, n in tensors.items():
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [offset, offset + 4 * n]}
        offset += 4 * n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def test_the_encoders_peak_is_one_images_pass_through_the_tower() -> None:
    t, h = 576, 1024
    expected = 2 * (t * h * 26 + t * 4096 + 16 * t * t)  # states, the MLP, the scores
    assert encoder_peak_bytes({"vision_config": CLIP_L}, 2) == expected
    assert 40 * 2**20 < expected < 60 * 2**20  # about 46 MiB in float16
    assert encoder_peak_bytes({"vision_config": CLIP_L}, 4) == 2 * expected


def test_a_tower_sized_per_image_counts_a_448_pixel_image() -> None:
    qwen = {"depth": 32, "hidden_size": 1280, "num_heads": 16, "intermediate_size": 3420}
    t = (448 // 14) ** 2
    expected = 2 * (t * 1280 * 34 + t * 3840 + 16 * t * t)  # 3 x hidden is wider than 3420
    assert encoder_peak_bytes({"vision_config": {**qwen, "patch_size": 14}}, 2) == expected


def test_a_text_model_or_an_unknown_tower_has_no_peak() -> None:
    assert encoder_peak_bytes({"hidden_size": 64}, 2) == 0
    assert encoder_peak_bytes({"vision_config": {}}, 2) == 0


def test_the_towers_weights_come_from_the_files_headers(tmp_path: Path) -> None:
    _safetensors(
        tmp_path / "model.safetensors",
        {
            "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight": 100,
            "multi_modal_projector.linear_1.weight": 20,
            "language_model.model.layers.0.mlp.up_proj.weight": 1000,
            "model.visual.blocks.0.attn.qkv.weight": 5,
        },
    )
    (tmp_path / "junk.safetensors").write_bytes(b"x" * 64)  # not one: counted as nothing
    assert vision_weight_bytes(tmp_path) == 4 * (100 + 20 + 5)
    assert vision_weight_bytes(None) == 0


def test_a_vision_models_footprint_reserves_the_peak_and_shows_the_tower(tmp_path: Path) -> None:
    text = {"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 16}
    config = {"text_config": {**text, "torch_dtype": "float32"}, "vision_config": CLIP_L}
    (tmp_path / "config.json").write_text(json.dumps(config))
    _safetensors(
        tmp_path / "model.safetensors",
        {"vision_tower.a.weight": 256, "language_model.b.weight": 1024},
    )
    spec = ModelSpec(name="m", path=str(tmp_path), kv_cache_gb=0.5)
    size = footprint(spec, ServeConfig(models=(spec,), dtype="file"))
    files = (tmp_path / "model.safetensors").stat().st_size
    peak = encoder_peak_bytes(config, 4)
    assert size.weights_bytes == files  # the tower was counted before: all files are weights
    assert size.vision_weights_bytes == 4 * 256
    assert size.encoder_peak_bytes == peak
    share = (files + size.kv_bytes) // 10
    assert size.headroom_bytes == RUNTIME_BYTES + share + FEATURE_CACHE_BYTES + peak
    assert size.total_bytes == size.weights_bytes + size.kv_bytes + size.headroom_bytes
    half = device_share(size, 2)  # each rank runs the whole tower: its peak is not split
    assert half.encoder_peak_bytes == peak
    assert half.headroom_bytes == RUNTIME_BYTES + -(-(share + FEATURE_CACHE_BYTES) // 2) + peak
