"""The memory a vision-language model needs beyond its weights and KV: one rule, read by the
daemon's footprint and the worker's feature cache (no mlx here, as in ``kv_layout``).

The encoder's peak: the worker runs the tower on one image at a time (``ImageEncoder``'s
bounded slices; a family that tiles an image runs a prompt's images at once), evaluated whole,
so its peak is one image's pass: mlx-vlm keeps every layer's output (``output_hidden_states``:
LLaVA picks a layer from them) beside the input and the residual, and one layer's widest
intermediate (its MLP, or Q, K and V) and its attention scores (heads x patches squared) are
alive at a time. With ``t`` patches, ``H`` hidden, ``L`` layers, ``I`` MLP width and ``A``
heads: ``bytes x (t·H·(L + 2) + t·max(I, 3H) + A·t²)``. Patches are the config's fixed
``image_size`` over ``patch_size``, squared; a family that sizes its patches per image
(Qwen-VL) counts a 448x448 image (``DEFAULT_IMAGE_SIDE``), the class the benchmarks send.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

# The vision tower's features kept by image digest (worker/vision/encoder.py), at most this many
# bytes: a follow-up turn about one image never runs the tower again.
FEATURE_CACHE_BYTES = 64 * 2**20


def vision_headroom(model_config: dict[str, Any]) -> int:
    """The bytes a model's vision side holds at most: its feature cache; 0 for a text model."""
    return FEATURE_CACHE_BYTES if isinstance(model_config.get("vision_config"), dict) else 0


_MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own cap on a header
DEFAULT_IMAGE_SIDE = 448  # pixels: the image a family without a fixed size is counted at
# Weight names of the vision side (the tower, its projector), as mlx-vlm and transformers
# name them: any dotted component of a tensor's name (Gemma 4's projector: ``embed_vision``).
VISION_WEIGHT_PARTS = frozenset(
    {"vision_tower", "vision_model", "visual", "multi_modal_projector", "mm_projector"}
    | {"embed_vision"}
)


def encoder_peak_bytes(model_config: dict[str, Any], dtype_bytes: int) -> int:
    """The vision tower's peak activation bytes for one image (the module docstring's rule), in
    ``dtype_bytes`` per value; 0 for a text model or a tower whose shape the config lacks."""
    vision = model_config.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    hidden = int(vision.get("hidden_size") or vision.get("embed_dim") or 0)
    layers = int(vision.get("num_hidden_layers") or vision.get("depth") or 0)
    if not hidden or not layers:
        return 0
    width = max(int(vision.get("intermediate_size") or 4 * hidden), 3 * hidden)
    heads = int(vision.get("num_attention_heads") or vision.get("num_heads") or 1)
    t = image_patches(vision)
    return dtype_bytes * (t * hidden * (layers + 2) + t * width + heads * t * t)


def image_patches(vision: dict[str, Any]) -> int:
    """The patches the tower sees per image (one class token more, where it has one, is
    within the estimate's slack)."""
    patch = int(vision.get("patch_size") or 14)
    side = int(vision.get("image_size") or DEFAULT_IMAGE_SIDE)
    return max(1, side // patch) ** 2


def vision_weight_bytes(directory: Path | None) -> int:
    """The bytes of the vision tower's and projector's tensors in ``directory``'s
    ``*.safetensors`` files, from their headers (part of the weights, counted with them)."""
    if directory is None:
        return 0
    return sum(_vision_tensor_bytes(f) for f in directory.glob("*.safetensors"))


def _vision_tensor_bytes(path: Path) -> int:
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > _MAX_HEADER_BYTES:
                return 0
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error):
        return 0  # not a readable safetensors file: counted as weights, not split out
    return sum(
        int(t["data_offsets"][1]) - int(t["data_offsets"][0])
        for name, t in header.items()
        if name != "__metadata__" and VISION_WEIGHT_PARTS & set(name.split("."))
    )
