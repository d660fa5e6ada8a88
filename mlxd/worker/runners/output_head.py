"""The model's output projection, applied to each row's last position only.

mlx-lm models project every position to the vocabulary, and the engine then keeps the last
one: it samples from it and serves no prompt logprobs. MLX evaluates lazily but does not push a
slice through a matmul, so a prefill chunk of L tokens paid L projections and an
``L x vocab`` logits array: for Qwen3-0.6B (151,936 tokens) a 1,024-token chunk is 318 GFLOP
and 311 MB of bf16 logits for one row's worth of use. On the CPU machine's tiny model the
projection of a 16-token suffix was most of a prefix hit's prefill. Rows of a prefill batch
are left-padded, so the last position is every row's last token.

A speculative verification (``verification``) needs every position's logits: ``all_positions``
lifts the restriction for one forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn


class LastPosition(nn.Module):
    """Wraps an output projection: ``(B, L, D) -> (B, 1, V)``."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head
        self.every = False  # project every position (``all_positions``)

    def __call__(self, x: mx.array) -> mx.array:
        return self.head(x if self.every else x[:, -1:, :])  # type: ignore[no-any-return]


class _LastPositionLinear:
    """A tied embedding's ``as_linear`` on the last position only (``every``: on all)."""

    def __init__(self, as_linear: Callable[[mx.array], mx.array]) -> None:
        self.as_linear = as_linear
        self.every = False

    def __call__(self, x: mx.array) -> mx.array:
        return self.as_linear(x if self.every else x[:, -1:, :])


@contextmanager
def all_positions(model: Any) -> Iterator[None]:
    """Within this block ``model`` projects every position, as mlx-lm made it (a verification
    forward samples at each of its draft tokens)."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    # ``vars`` of the embedding: its instance attributes (a model without one, e.g. gpt2's
    # layout, has none; ``vars(object())`` would raise).
    own = getattr(embed, "__dict__", {})
    wrapper = head if isinstance(head, LastPosition) else own.get("as_linear")
    if not isinstance(wrapper, LastPosition | _LastPositionLinear):
        yield
        return
    wrapper.every = True
    try:
        yield
    finally:
        wrapper.every = False


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
        # An instance attribute shadows the class's method; it is no parameter of the module.
        embed.as_linear = _LastPositionLinear(embed.as_linear)

        def unwrap_embed() -> None:
            del embed.as_linear

        return unwrap_embed
    return lambda: None
