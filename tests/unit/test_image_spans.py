"""Image spans kept whole: chunk ends and prefix-hit ends that cut no image (sched.image_spans)."""

from __future__ import annotations

from mlxd.worker.sched import image_spans

SPANS = [(4, 58), (61, 125)]  # two images' placeholders, [start, end)


def test_runs_group_consecutive_positions() -> None:
    positions = list(range(4, 58)) + list(range(61, 125))
    assert image_spans.runs(positions) == SPANS
    assert image_spans.runs([]) == []


def test_a_chunk_ends_before_an_image_it_would_cut_or_grows_to_hold_it() -> None:
    assert image_spans.chunk_end(SPANS, 0, 16) == 4  # stops before the first image
    assert image_spans.chunk_end(SPANS, 4, 20) == 58  # starts at it: grows to its end
    assert image_spans.chunk_end(SPANS, 58, 74) == 61
    assert image_spans.chunk_end(SPANS, 0, 58) == 58  # ends where it ends: unchanged
    assert image_spans.chunk_end([], 0, 16) == 16


def test_a_shrunk_chunk_cuts_no_image_or_waits() -> None:
    assert image_spans.shrunk_end(SPANS, 0, 32) == 4
    assert image_spans.shrunk_end(SPANS, 4, 32) == 4  # no tokens this step


def test_a_hit_inside_an_image_stops_at_the_block_before_it() -> None:
    assert image_spans.hit_end(SPANS, 32, 16) == 0
    assert image_spans.hit_end(SPANS, 64, 16) == 0  # in the second, then 48 in the first
    assert image_spans.hit_end(SPANS, 128, 16) == 128
    assert image_spans.hit_end([(20, 40)], 64, 16) == 64
    assert image_spans.hit_end([(20, 40)], 32, 16) == 16
