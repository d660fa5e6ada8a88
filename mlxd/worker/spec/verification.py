"""Speculative verification: the target model scores every row's draft tokens in one forward,
and each row keeps the drafts its own samples agree with.

A row enters with its next input ``p`` (the last token sampled, not in the KV yet) and ``k``
draft tokens ``d1..dk`` (``k`` differs per row, 0 for rows that do not speculate). One forward
over ``[p, d1..dk]`` gives the target's distribution after each of them. At each position ``j``
the row samples ``t_j`` exactly as a plain decode step would sample that output token: the same
processors, filters and grammar mask, and the same random key, derived from (seed, the token's
index). It keeps ``t_0..t_m`` where ``m`` is the first position whose sample differs from the
draft after it (or ``k``): ``d1..dm`` were right, ``t_m`` is new.

Why this is exact: prompt lookup proposes one token, so its draft distribution is a point mass,
and the standard speculative rule (accept ``d`` with probability ``min(1, p(d)/q(d))`` = ``p(d)``,
else sample from ``p`` without ``d``, renormalized) is the same as sampling ``t ~ p`` and
accepting iff ``t == d``: ``P(t == d) = p(d)`` and, given ``t != d``, ``t`` follows ``p`` without
``d``. Since ``t`` is drawn with the key a plain step would use for that index, a seeded request
gives the very tokens it gives without speculation, whatever the drafts (up to the arithmetic of
a wider forward), and greedy rows keep their argmax.
"""

from __future__ import annotations

import mlx.core as mx

from mlxd.worker.kv import attention_shapes


def window(inputs: list[list[int]]) -> mx.array:
    """Each row's inputs ``[p, *drafts]`` as one ``(B, W)`` left-padded token array."""
    width = attention_shapes.queries(max(len(x) for x in inputs))
    return mx.array([[0] * (width - len(x)) + x for x in inputs])


def real_positions(inputs: list[list[int]]) -> mx.array:
    """Flat indices into ``(B * W)`` of every row's real positions, row by row."""
    width = attention_shapes.queries(max(len(x) for x in inputs))
    return mx.array(
        [b * width + j for b, x in enumerate(inputs) for j in range(width - len(x), width)]
    )


def accept(inputs: list[list[int]], targets: list[int]) -> list[list[int]]:
    """Each row's kept tokens: its samples ``targets`` (flat, row by row, one per input) up to
    and including the first that differs from the draft after it."""
    out, start = [], 0
    for x in inputs:
        kept = []
        for j in range(len(x)):
            t = targets[start + j]
            kept.append(t)
            if j + 1 >= len(x) or t != x[j + 1]:
                break
        out.append(kept)
        start += len(x)
    return out
