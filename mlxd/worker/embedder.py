"""Sentence embeddings from a causal LM: the mean of the last hidden states, L2-normalized.

``model.model`` is mlx-lm's transformer body without ``lm_head``. Inputs run right-padded in
batches under the causal mask, so a real token never attends to padding and a batched vector
equals the one computed alone (up to float rounding); the mean covers real tokens only.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from mlxd.errors import InvalidRequest
from mlxd.worker.sched.scheduler import EmbedChunk

# Largest padded batch (rows x longest input) per forward pass: bounds the activation memory.
MAX_BATCH_TOKENS = 8192


class Embedder:
    """Embeds token lists with one model; every call runs on the engine thread, a step's
    budget of inputs at a time (``Scheduler.schedule_prefill``)."""

    def __init__(self, model: Any) -> None:
        self.body: Any = getattr(model, "model", None)  # mlx-lm's transformer body

    @property
    def is_supported(self) -> bool:
        return self.body is not None

    def run(self, chunk: EmbedChunk) -> None:
        """Embed the inputs of one step's ``chunk`` into its job's ``vectors``."""
        job = chunk.job
        vectors = self.embed([job.input_ids[i] for i in chunk.input_indices])
        for i, vec in zip(chunk.input_indices, vectors, strict=True):
            job.vectors[i] = vec

    def embed(self, inputs: list[list[int]]) -> list[bytes]:
        """One unit vector per input, as little-endian float32 bytes (OpenAI's base64 layout)."""
        if self.body is None:
            raise InvalidRequest("this model cannot make embeddings", param="model")
        out: list[bytes] = [b""] * len(inputs)
        for batch in _batches(inputs):
            vectors = self._embed_batch([inputs[i] for i in batch])
            for i, vec in zip(batch, vectors, strict=True):
                out[i] = vec.astype("<f4").tobytes()
        return out

    def _embed_batch(self, inputs: list[list[int]]) -> np.ndarray:
        width = max(len(ids) for ids in inputs)
        tokens = mx.array([ids + [0] * (width - len(ids)) for ids in inputs])
        lengths = mx.array([len(ids) for ids in inputs])
        mask = (mx.arange(width)[None, :] < lengths[:, None]).astype(mx.float32)
        hidden = self.body(tokens).astype(mx.float32)  # (B, L, D)
        mean = (hidden * mask[:, :, None]).sum(axis=1) / lengths[:, None].astype(mx.float32)
        unit = mean / mx.maximum(mx.linalg.norm(mean, axis=-1, keepdims=True), 1e-12)
        return np.array(unit)


def _batches(inputs: list[list[int]]) -> list[list[int]]:
    """Input indices grouped by length (similar lengths pad least) under ``MAX_BATCH_TOKENS``."""
    order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
    batches: list[list[int]] = []
    for i in order:
        if batches and len(inputs[i]) * (len(batches[-1]) + 1) <= MAX_BATCH_TOKENS:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches
