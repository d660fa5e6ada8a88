"""Summary statistics of benchmark timings: tok/s, latency percentiles, speedup over one stream.

Pure Python on recorded timings, so every number in a report can be checked by hand.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

ALL = "all"  # the group of a row that covers every request of its level
QUANTILES = (50, 95, 99)
LATENCIES = ("ttft", "itl", "e2e")
# Rows with equal values of these fields are one series; speedup compares within a series.
SERIES_FIELDS = ("group", "prefix_tokens")


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class RequestTiming:
    """One request as the client saw it (seconds, relative to the run's start)."""

    start: float
    first_token: float | None = None
    end: float | None = None
    output_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    error: str | None = None
    group: str = ALL
    prompt_tokens: int = 0  # from the usage the server reports (0: none reported)
    cached_tokens: int = 0  # of those, served from its prefix cache (usage.prompt_tokens_details)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def is_ok(self) -> bool:
        return self.error is None and self.end is not None

    def inter_token(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


def summarize(concurrency: int, timings: list[RequestTiming]) -> dict[str, Any]:
    """Aggregate output tok/s, per-request tok/s and latency percentiles of one run."""
    return summarize_runs(concurrency, [timings])


def summarize_runs(concurrency: int, runs: list[list[RequestTiming]]) -> dict[str, Any]:
    """One row for ``runs`` repeats of a level: tok/s is the mean over runs (each run has its own
    wall clock), counts are summed, percentiles cover every request of every run."""
    pooled = [t for run in runs for t in run]
    ok = [t for t in pooled if t.is_ok]
    per_run = [_throughput(run) for run in runs]
    row: dict[str, Any] = {
        "concurrency": concurrency,
        "requests": len(pooled),
        "ok": len(ok),
        "failed": len(pooled) - len(ok),
        "output_tokens": sum(t.output_tokens for t in ok),
        "wall_s": sum(wall for _, wall in per_run),
        "output_tok_s": sum(tps for tps, _ in per_run) / len(per_run) if per_run else 0.0,
        "per_request_tok_s": _mean([_request_tok_s(t) for t in ok if t.end > t.start]),  # type: ignore[operator]
    }
    prompt = sum(t.prompt_tokens for t in ok)
    if prompt:  # how much of the prompts the server's prefix cache held (replica routing)
        row["prefix_hit_rate"] = sum(t.cached_tokens for t in ok) / prompt
    if len(runs) > 1:
        row["runs"] = len(runs)
        row["output_tok_s_runs"] = [tps for tps, _ in per_run]
    samples = {
        "ttft": [t.ttft for t in ok if t.ttft is not None],
        "itl": [x for t in ok for x in t.inter_token()],
        "e2e": [t.end - t.start for t in ok],  # type: ignore[operator]
    }
    for name in LATENCIES:
        for q in QUANTILES:
            row[f"{name}_p{q}_ms"] = percentile(samples[name], q) * 1000.0
    errors = Counter(t.error for t in pooled if t.error is not None)
    if errors:
        row["errors"] = dict(errors.most_common(5))
    return row


def summarize_groups(
    concurrency: int, runs: list[list[RequestTiming]], tags: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Rows for one level: the whole level (group ``all``) and, when requests carry several
    groups (models, priorities, prompt lengths), one row per group. ``tags`` go on every row."""
    groups = sorted({t.group for run in runs for t in run}, key=_group_order)
    names = groups if len(groups) == 1 else [ALL, *groups]
    rows = []
    for name in names:
        subset = runs if name == ALL else [[t for t in run if t.group == name] for run in runs]
        rows.append({**(tags or {}), "group": name, **summarize_runs(concurrency, subset)})
    return rows


def add_speedup(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set each row's ``speedup``: its output tok/s over the concurrency-1 row of its series
    (NaN when the series has no concurrency-1 row, or that row made no tokens)."""
    base = {_series(r): r["output_tok_s"] for r in rows if r.get("concurrency") == 1}
    for r in rows:
        b = base.get(_series(r))
        r["speedup"] = r["output_tok_s"] / b if b else math.nan
    return rows


# Internal helpers


def _throughput(run: list[RequestTiming]) -> tuple[float, float]:
    """(output tok/s, wall seconds) of one run: tokens over first start to last end."""
    ok = [t for t in run if t.is_ok]
    if not ok:
        return 0.0, 0.0
    wall = max(t.end for t in ok) - min(t.start for t in ok)  # type: ignore[type-var, operator]
    tokens = sum(t.output_tokens for t in ok)
    return (tokens / wall if wall > 0 else 0.0), wall


def _request_tok_s(t: RequestTiming) -> float:
    return t.output_tokens / (t.end - t.start)  # type: ignore[operator]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _series(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(f) for f in SERIES_FIELDS)


def _group_order(name: str) -> tuple[int, str]:
    # "turn 2" before "turn 10", "64 tok" before "512 tok": a leading or trailing number sorts.
    digits = "".join(c for c in name if c.isdigit())
    return (int(digits) if digits else -1, name)
