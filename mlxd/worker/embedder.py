"""Sentence embeddings from a causal LM: the mean of the last hidden states, L2-normalized.

``model.model`` is mlx-lm's transformer body without ``lm_head``. Inputs run right-padded in
batches under the causal mask, so a real token never attends to padding and a batched vector
equals the one computed alone (up to float rounding); the mean covers real tokens only. An input
longer than a step's budget runs a piece per step over a cache of its keys so far, as a prompt's
chunks do, so the streams decoding meanwhile wait no longer than beside a prompt that long.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from mlxd.errors import InvalidRequest
from mlxd.worker.sched.embed_job import EmbedJob
from mlxd.worker.sched.scheduler import EmbedChunk

# Largest padded batch (rows x longest input) per forward pass: bounds the activation memory.
MAX_BATCH_TOKENS = 8192


@dataclass(slots=True)
class _Partial:
    """A long input embedded a piece per step: its keys so far, and its hidden states' sum."""

    cache: list[Any]
    total: mx.array


class Embedder:
    """Embeds token lists with one model; every call runs on the engine thread, a step's
    budget of inputs at a time (``Scheduler.schedule_prefill``)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.body: Any = getattr(model, "model", None)  # mlx-lm's transformer body
        self._partials: dict[EmbedJob, _Partial] = {}  # the long input each job has begun

    @property
    def is_supported(self) -> bool:
        return self.body is not None

    def run(self, chunk: EmbedChunk) -> None:
        """Embed the inputs of one step's ``chunk`` into its job's ``vectors``."""
        job = chunk.job
        if chunk.piece is not None:
            return self._run_piece(chunk)
        vectors = self.embed([job.input_ids[i] for i in chunk.input_indices])
        for i, vec in zip(chunk.input_indices, vectors, strict=True):
            job.vectors[i] = vec

    def forget(self, job: EmbedJob) -> None:
        """Drop what ``job``'s long input computed so far (cancelled, or it failed)."""
        self._partials.pop(job, None)

    def _run_piece(self, chunk: EmbedChunk) -> None:
        """One piece of a long input through the body over the keys of the pieces before it
        (the same causal attention as the whole input at once); its vector after the last."""
        job, (first, last) = chunk.job, chunk.piece or (0, 0)
        index = chunk.input_indices[0]
        ids = job.input_ids[index]
        part = self._partials.get(job)
        if part is None or first == 0:
            part = self._partials[job] = _Partial(_new_cache(self.model), mx.zeros(()))
        hidden = self.body(mx.array([ids[first:last]]), cache=part.cache).astype(mx.float32)
        part.total = part.total + hidden[0].sum(axis=0)
        mx.eval(part.total, [c.state for c in part.cache])  # this step's work, done in it
        if chunk.ends_input:
            del self._partials[job]
            mean = part.total / len(ids)
            unit = mean / mx.maximum(mx.linalg.norm(mean), 1e-12)
            job.vectors[index] = np.array(unit).astype("<f4").tobytes()

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


def _new_cache(model: Any) -> list[Any]:
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model)


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
