"""Per-request sampling for a whole batch in one pass.

Every row keeps its own temperature, top-k/top-p/min-p, penalties, logit bias and seed. Random
draws come from a key derived from (the request's seed, the token's index), so a seeded request
gives the same tokens whatever else shares its batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import mlx.core as mx

from mlxd.protocol.messages import SamplingParams

_MASK64 = (1 << 64) - 1
_NEG_INF = float("-inf")
_gumbel_rows = mx.vmap(lambda key, like: mx.random.gumbel(like.shape, key=key), in_axes=(0, 0))


@dataclass(frozen=True, slots=True)
class SampleRow:
    """What the sampler needs to know about one row at one step."""

    params: SamplingParams
    seed: int
    index: int  # how many tokens this request has generated before this one
    history: Seq[int] = ()  # prompt + output so far, only when penalties need it
    output: Seq[int] = ()
    block_ids: Seq[int] = ()  # token ids this step must not produce (eos before min_tokens)
    force_id: int | None = None  # the token this step must produce (a spent thinking budget)


def needs_history(p: SamplingParams) -> bool:
    """Whether sampling this request needs the exact tokens generated so far."""
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def sample(logits: mx.array, rows: list[SampleRow]) -> mx.array:
    """Pick one token per row of ``logits`` (B, V); returns a lazy (B,) uint32 array."""
    tokens = _sample(logits, rows)
    if all(r.force_id is None for r in rows):
        return tokens
    forced = mx.array([r.force_id is not None for r in rows])
    ids = mx.array([r.force_id or 0 for r in rows], dtype=tokens.dtype)
    return mx.where(forced, ids, tokens)


# Internal helpers


def _sample(logits: mx.array, rows: list[SampleRow]) -> mx.array:
    logits = _apply_processors(logits.astype(mx.float32), rows)
    greedy_tokens = mx.argmax(logits, axis=-1)
    temps = [r.params.temperature for r in rows]
    if all(t == 0.0 for t in temps):
        return greedy_tokens
    is_greedy = mx.array([t == 0.0 for t in temps])
    safe_t = mx.array([t if t > 0 else 1.0 for t in temps], dtype=mx.float32)
    logprobs = logits / safe_t[:, None]
    logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
    logprobs = _filter(logprobs, rows)
    noise = _gumbel_rows(_keys(rows), logprobs)
    sampled = mx.argmax(logprobs + noise, axis=-1)
    return mx.where(is_greedy, greedy_tokens, sampled)


def _keys(rows: list[SampleRow]) -> mx.array:
    out = []
    for r in rows:
        k = (r.seed * 0x9E3779B97F4A7C15 + r.index) & _MASK64
        out.append([k >> 32, k & 0xFFFFFFFF])
    return mx.array(out, dtype=mx.uint32)


def _apply_processors(logits: mx.array, rows: list[SampleRow]) -> mx.array:
    """Repetition penalty, presence/frequency penalties, logit bias and banned ids, scattered
    into the flat logits in two passes (multiplicative, then additive)."""
    vocab = logits.shape[-1]
    rep_idx: list[int] = []
    rep_pen: list[float] = []
    add_idx: list[int] = []
    add_val: list[float] = []
    for i, r in enumerate(rows):
        p, base = r.params, i * vocab
        if p.repetition_penalty != 1.0:
            seen = {t for t in r.history if 0 <= t < vocab}
            rep_idx += [base + t for t in seen]
            rep_pen += [p.repetition_penalty] * len(seen)
        if p.presence_penalty or p.frequency_penalty:
            for t, n in Counter(r.output).items():
                if 0 <= t < vocab:
                    add_idx.append(base + t)
                    add_val.append(-(p.presence_penalty + p.frequency_penalty * n))
        for t, b in p.logit_bias.items():
            if 0 <= t < vocab:
                add_idx.append(base + t)
                add_val.append(b)
        for t in r.block_ids:
            if 0 <= t < vocab:
                add_idx.append(base + t)
                add_val.append(_NEG_INF)
    if not rep_idx and not add_idx:
        return logits
    flat = logits.reshape(-1)
    if rep_idx:
        idx, pen = mx.array(rep_idx), mx.array(rep_pen, dtype=mx.float32)
        g = flat[idx]
        flat = flat.at[idx].add(mx.where(g > 0, g / pen, g * pen) - g)
    if add_idx:
        flat = flat.at[mx.array(add_idx)].add(mx.array(add_val, dtype=mx.float32))
    return flat.reshape(logits.shape)


def _filter(logprobs: mx.array, rows: list[SampleRow]) -> mx.array:
    """Mask tokens outside each row's top-k, nucleus (top-p) and min-p sets."""
    ps = [r.params for r in rows]
    if all(p.top_k <= 0 and p.top_p >= 1.0 and p.min_p <= 0.0 for p in ps):
        return logprobs
    vocab = logprobs.shape[-1]
    sorted_desc = -mx.sort(-logprobs, axis=-1)
    # top-k: the k-th best value is the lowest one kept (k <= 0 keeps all)
    k_idx = mx.array([[min(p.top_k, vocab) - 1 if p.top_k > 0 else vocab - 1] for p in ps])
    kth = mx.take_along_axis(sorted_desc, k_idx, axis=-1)
    # top-p: keep the smallest prefix of the sorted tokens whose mass reaches top_p
    probs = mx.exp(sorted_desc)
    before = mx.cumsum(probs, axis=-1) - probs
    top_p = mx.array([[p.top_p] for p in ps], dtype=mx.float32)
    n_keep = mx.maximum(mx.sum(before < top_p, axis=-1, keepdims=True), 1)
    pth = mx.take_along_axis(sorted_desc, n_keep - 1, axis=-1)
    # min-p: relative to the best token's probability
    min_p = mx.array([[p.min_p] for p in ps], dtype=mx.float32)
    mth = sorted_desc[:, :1] + mx.log(min_p)
    threshold = mx.maximum(mx.maximum(kth, pth), mth)
    return mx.where(logprobs < threshold, _NEG_INF, logprobs)
