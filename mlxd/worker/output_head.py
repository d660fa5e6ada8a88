"""The model's output projection, applied to each row's last position only.

mlx-lm models project every position to the vocabulary, and the engine then keeps the last
one: it samples from it and serves no prompt logprobs. MLX evaluates lazily but does not push a
slice through a matmul, so a prefill chunk of L tokens paid L projections and an
``L x vocab`` logits array: for Qwen3-0.6B (151,936 tokens) a 1,024-token chunk is 318 GFLOP
and 311 MB of bf16 logits for one row's worth of use. On the CPU machine's tiny model the
projection of a 16-token suffix was most of a prefix hit's prefill. Rows of a prefill batch
are left-padded, so the last position is every row's last token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn


class LastPosition(nn.Module):
    """Wraps an output projection: ``(B, L, D) -> (B, 1, V)``."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def __call__(self, x: mx.array) -> mx.array:
        return self.head(x[:, -1:, :])  # type: ignore[no-any-return]


def last_position_only(model: Any) -> Callable[[], None]:
    """Make ``model`` (an mlx-lm ``Model``) project only the last position: its ``lm_head``, or
    with tied embeddings ``model.model.embed_tokens.as_linear``. In place and idempotent;
    returns a function that undoes it (benchmarks run mlx-lm on the model as it made it)."""
    head = getattr(model, "lm_head", None)
    if isinstance(head, nn.Module) and not isinstance(head, LastPosition):
        model.lm_head = LastPosition(head)

        def unwrap_head() -> None:
            model.lm_head = head

        return unwrap_head
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None and embed is not None and "as_linear" not in vars(embed):
        as_linear = embed.as_linear
        # An instance attribute shadows the class's method; it is no parameter of the module.
        embed.as_linear = lambda x: as_linear(x[:, -1:, :])

        def unwrap_embed() -> None:
            del embed.as_linear

        return unwrap_embed
    return lambda: None
