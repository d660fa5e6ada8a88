"""Benchmark statistics on recorded timings: percentiles, tok/s, groups, runs, speedup."""

from __future__ import annotations

import math

import pytest

from mlxd.bench.stats import (
    RequestTiming,
    add_speedup,
    percentile,
    summarize,
    summarize_groups,
    summarize_runs,
)


def _timing(start: float, tokens: list[float], group: str = "all") -> RequestTiming:
    """A streamed request: one token at each time in ``tokens``; it ends at the last one."""
    return RequestTiming(
        start=start,
        first_token=tokens[0],
        end=tokens[-1],
        output_tokens=len(tokens),
        token_times=tokens,
        group=group,
    )


def test_percentile_interpolates_between_ranks() -> None:
    xs = [float(x) for x in range(1, 11)]  # 1..10
    assert percentile(xs, 50) == pytest.approx(5.5)
    assert percentile(xs, 95) == pytest.approx(9.55)
    assert percentile([3.0, 1.0, 2.0], 0) == 1.0 and percentile([3.0, 1.0, 2.0], 100) == 3.0
    assert math.isnan(percentile([], 50))


def test_tok_s_is_all_tokens_over_first_start_to_last_end() -> None:
    a = _timing(0.0, [0.5, 1.0, 1.5, 2.0])  # 4 tokens in 2 s
    b = _timing(1.0, [1.2, 2.0, 3.0, 4.0])  # 4 tokens in 3 s, ends at 4 s
    row = summarize(2, [a, b])
    assert row["output_tokens"] == 8 and row["wall_s"] == pytest.approx(4.0)
    assert row["output_tok_s"] == pytest.approx(2.0)
    assert row["per_request_tok_s"] == pytest.approx((4 / 2 + 4 / 3) / 2)


def test_latency_percentiles_in_ms() -> None:
    a = _timing(0.0, [0.1, 0.2, 0.4])  # ttft 100 ms, gaps 100 and 200 ms, e2e 400 ms
    b = _timing(0.0, [0.3, 0.4, 0.5])  # ttft 300 ms, gaps 100 and 100 ms, e2e 500 ms
    row = summarize(2, [a, b])
    assert row["ttft_p50_ms"] == pytest.approx(200.0) and row["ttft_p99_ms"] == pytest.approx(298.0)
    assert row["itl_p50_ms"] == pytest.approx(100.0) and row["itl_p95_ms"] == pytest.approx(185.0)
    assert row["e2e_p50_ms"] == pytest.approx(450.0)


def test_failures_are_counted_not_measured() -> None:
    ok = _timing(0.0, [0.5, 1.0])
    bad = RequestTiming(start=0.0, end=9.0, error="HTTP 429: queue full")
    row = summarize(2, [ok, bad, RequestTiming(start=0.0, end=9.0, error="HTTP 429: queue full")])
    assert (row["requests"], row["ok"], row["failed"]) == (3, 1, 2)
    assert row["output_tok_s"] == pytest.approx(2.0) and row["e2e_p99_ms"] == pytest.approx(1000.0)
    assert row["errors"] == {"HTTP 429: queue full": 2}


def test_no_successful_request_gives_zero_throughput_and_nan_latency() -> None:
    row = summarize(1, [RequestTiming(start=0.0, end=1.0, error="ConnectError")])
    assert row["output_tok_s"] == 0.0 and row["per_request_tok_s"] == 0.0
    assert math.isnan(row["ttft_p50_ms"])


def test_runs_average_throughput_and_pool_percentiles() -> None:
    run1 = [_timing(0.0, [0.5, 1.0])]  # 2 tok/s, ttft 500 ms
    run2 = [_timing(0.0, [0.1, 0.25, 0.5])]  # 6 tok/s, ttft 100 ms
    row = summarize_runs(1, [run1, run2])
    assert row["output_tok_s"] == pytest.approx(4.0)
    assert row["output_tok_s_runs"] == pytest.approx([2.0, 6.0]) and row["runs"] == 2
    assert row["requests"] == 2 and row["ttft_p50_ms"] == pytest.approx(300.0)


def test_groups_get_their_own_rows_after_the_whole_level() -> None:
    runs = [[_timing(0.0, [1.0, 2.0], "low"), _timing(0.0, [0.2, 2.0], "high")]]
    rows = summarize_groups(2, runs, {"prefix_tokens": 500})
    assert [r["group"] for r in rows] == ["all", "high", "low"]
    assert [r["ttft_p50_ms"] for r in rows[1:]] == pytest.approx([200.0, 1000.0])
    assert all(r["prefix_tokens"] == 500 and r["concurrency"] == 2 for r in rows)


def test_a_single_group_gives_one_row_named_after_it() -> None:
    rows = summarize_groups(1, [[_timing(0.0, [1.0], "cold")]])
    assert [r["group"] for r in rows] == ["cold"]


def test_speedup_is_over_concurrency_one_of_the_same_series() -> None:
    rows = [
        {"concurrency": 1, "group": "hit", "prefix_tokens": 500, "output_tok_s": 50.0},
        {"concurrency": 1, "group": "cold", "prefix_tokens": 500, "output_tok_s": 25.0},
        {"concurrency": 8, "group": "hit", "prefix_tokens": 500, "output_tok_s": 300.0},
        {"concurrency": 8, "group": "cold", "prefix_tokens": 500, "output_tok_s": 100.0},
        {"concurrency": 8, "group": "cold", "prefix_tokens": 2000, "output_tok_s": 100.0},
    ]
    speedups = [r["speedup"] for r in add_speedup(rows)]
    assert speedups[:4] == pytest.approx([1.0, 1.0, 6.0, 4.0])
    assert math.isnan(speedups[4]), "no concurrency-1 row for that series"
