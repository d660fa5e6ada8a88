"""Reading a GGUF file that ``mx.load`` refuses (quant types its loader cannot convert: Q5_0,
Q5_1, most K-quants, IQ types), in the layout ``mx.load`` gives.

The ``gguf`` package (llama.cpp's own reader) maps the file and dequantizes every GGML type in
numpy. Q4_0, Q4_1 and Q8_0 blocks are rewritten exactly as ``mx.load`` writes them (MLX affine
triplets, 32 weights a group: ``w = scale * q + bias``); every other quant type is dequantized
once, to float16 as ``mx.load`` does for the types it converts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize

_FLOAT = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


def read(path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """Tensors and metadata of a GGUF file, as ``mx.load(path, return_metadata=True)``."""
    reader = GGUFReader(path)
    metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors: dict[str, mx.array] = {}
    for tensor in reader.tensors:
        tensors.update(_arrays(tensor))
    return tensors, metadata


def _arrays(tensor: ReaderTensor) -> dict[str, mx.array]:
    kind = GGMLQuantizationType(tensor.tensor_type)
    name = tensor.name.removesuffix(".weight")
    if kind in _FLOAT:  # the reader gives F32/F16 as such; BF16 as float32
        data = tensor.data if kind != GGMLQuantizationType.BF16 else dequantize(tensor.data, kind)
        return {tensor.name: mx.array(np.ascontiguousarray(data))}
    if kind not in (
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q8_0,
    ):
        return {tensor.name: mx.array(dequantize(tensor.data, kind).astype(np.float16))}
    rows = tensor.data.shape[0]
    blocks = tensor.data.reshape(rows, -1, _block_bytes(kind))
    scale = blocks[..., :2].copy().view(np.float16)[..., 0]
    if kind == GGMLQuantizationType.Q8_0:  # int8 q: w = d*q = d*(q+128) - 128*d
        packed = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        bias = -128 * scale
    else:  # 4 bits, byte i holds weights i (low nibble) and i+16 (high nibble)
        offset = 4 if kind == GGMLQuantizationType.Q4_1 else 2
        nibbles = blocks[..., offset:]
        q = np.concatenate([nibbles & 0xF, nibbles >> 4], axis=-1).reshape(rows, -1, 8)
        packed = np.bitwise_or.reduce(
            q.astype(np.uint32) << (4 * np.arange(8, dtype=np.uint32)), -1
        )
        bias = blocks[..., 2:4].copy().view(np.float16)[..., 0] if offset == 4 else -8 * scale
    return {
        f"{name}.weight": mx.array(np.ascontiguousarray(packed).reshape(rows, -1).view(np.uint32)),
        f"{name}.scales": mx.array(scale),
        f"{name}.biases": mx.array(bias.astype(np.float16)),
    }


def _block_bytes(kind: GGMLQuantizationType) -> int:
    return {
        GGMLQuantizationType.Q4_0: 18,
        GGMLQuantizationType.Q4_1: 20,
        GGMLQuantizationType.Q8_0: 34,
    }[kind]
