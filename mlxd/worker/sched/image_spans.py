"""Image spans: the placeholders of one image whose tokens attend each other both ways.

A Gemma 4 checkpoint with ``use_bidirectional_attention: vision`` (the larger real ones) lets
each image's tokens see the later ones of the same image in prefill (mlx-vlm groups a run of
consecutive image tokens as one image). One forward must hold such a span whole: a prefill
chunk never ends inside one (``chunk_end``), and a prefix-cache hit never stops inside one
(``hit_end``: the rest of the image would attend keys that a window layer gave back). The
runner's masks let a span's queries see its keys (``kv.paged_cache.PagedStep.with_spans``).
A causal model's prompts have no spans, and nothing here changes for them.

Pure Python on ints, as the scheduler.
"""

from __future__ import annotations

Span = tuple[int, int]  # prompt positions [start, end)


def runs(positions: list[int]) -> list[Span]:
    """The runs of consecutive ``positions`` (ascending), each as ``[start, end)``."""
    spans: list[Span] = []
    for p in positions:
        if spans and spans[-1][1] == p:
            spans[-1] = (spans[-1][0], p + 1)
        else:
            spans.append((p, p + 1))
    return spans


def straddled(spans: list[Span], boundary: int) -> Span | None:
    """The span that a cut before position ``boundary`` would split, if any."""
    return next((s for s in spans if s[0] < boundary < s[1]), None)


def chunk_end(spans: list[Span], start: int, end: int) -> int:
    """Where a chunk from ``start`` meant to end at ``end`` ends with its spans whole: before
    the span it would cut, or after it when the chunk starts there (a span longer than a
    chunk's budget grows the chunk)."""
    span = straddled(spans, end)
    if span is None:
        return end
    return span[0] if span[0] > start else span[1]


def shrunk_end(spans: list[Span], start: int, end: int) -> int:
    """Where a chunk from ``start`` that can reach ``end`` at most ends with its spans whole:
    ``start`` (no tokens this step) when it starts at the span ``end`` cuts."""
    span = straddled(spans, end)
    return end if span is None else max(start, span[0])


def hit_end(spans: list[Span], hit: int, block_size: int) -> int:
    """The longest prefix of a ``hit`` tokens long, block-aligned one that splits no span."""
    while (span := straddled(spans, hit)) is not None:
        hit = span[0] // block_size * block_size
    return hit
