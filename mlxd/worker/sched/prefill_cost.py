"""What a prompt chunk costs while streams wait on it, counted in tokens at position 0.

A prompt token's projections cost the same at any position; its attention grows with the keys
before it. At ``knee`` keys its attention costs as much as its projections: with P parameters in
the layers (embeddings aside), H query heads of d dims and L layers, a token's projections take
2P FLOPs and its attention over c keys 4HdLc, so ``knee = P / (2HdL)`` (about 3,800 for
Qwen3-0.6B). A chunk of n tokens after s cached ones costs ``n * (1 + s / knee)``: its own
keys are left out, so a prompt's first chunk (and every short prompt) costs its tokens.

A fixed token budget per step (``--prefill-chunk``) let a chunk deep in a long prompt cost many
times one at its start, and the streams decoding between chunks waited that long: beside a
32k-token prompt their ITL p99 was 3.8 s against 81 ms alone (docs/PERFORMANCE.md, CPU). While
streams run, the scheduler therefore spends the budget as cost, which shortens the chunks as the
prompt goes on, never below 1/4 of the budget (the scheduler's ``MAX_SHRINK``: each step
also decodes, so a prompt cut into too many chunks would wait on as many decode steps); with no
stream waiting, a chunk takes the whole budget in tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PrefillCost:
    """Chunk costs for one model (``knee``: infinite when its shape is unknown)."""

    knee: float = math.inf

    def of(self, start: int, n: int) -> float:
        """The cost of prefilling positions ``start .. start + n``."""
        return n * (1.0 + start / self.knee)

    def tokens_within(self, budget: int, start: int) -> int:
        """The most tokens from ``start`` whose cost stays within ``budget`` (at least 1)."""
        return max(1, math.floor(budget / (1.0 + start / self.knee)))

    @classmethod
    def for_model(cls, model: Any) -> PrefillCost:
        """From ``model``'s layer weights and its attention heads (mlx-lm's ``args``)."""
        args = getattr(model, "args", None)
        heads = getattr(args, "num_attention_heads", None)
        hidden = getattr(args, "hidden_size", None)
        layers = getattr(model, "layers", None)
        if not heads or not hidden or not layers:
            return cls()
        head_dim = getattr(args, "head_dim", None) or hidden // heads
        params = sum(_weights(m) for layer in layers for _, m in layer.named_modules())
        return cls(params / (2 * heads * head_dim * len(layers)))


def _weights(module: Any) -> int:
    """The multiply-adds a token spends on ``module``'s own weight (a quantized one unpacked;
    a mixture of experts counted whole, which errs toward the plain token budget)."""
    weight = module.get("weight") if hasattr(module, "get") else None
    if weight is None or getattr(weight, "ndim", 0) < 2:  # none, or a norm's scale vector
        return 0
    bits = getattr(module, "bits", None)
    return int(weight.size * 32 // bits) if bits else int(weight.size)
