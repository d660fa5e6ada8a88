"""Summary statistics of benchmark timings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


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
    """One request as the client saw it (seconds, relative to the level's start)."""

    start: float
    first_token: float | None = None
    end: float | None = None
    output_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    def inter_token(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


def summarize(concurrency: int, timings: list[RequestTiming]) -> dict[str, float | int]:
    """Aggregate output tok/s, per-request tok/s and latency percentiles for one level."""
    ok = [t for t in timings if t.error is None and t.end is not None]
    wall = max((t.end for t in ok), default=0.0) - min((t.start for t in ok), default=0.0)  # type: ignore[type-var]
    tokens = sum(t.output_tokens for t in ok)
    ttfts = [t.ttft for t in ok if t.ttft is not None]
    itls = [x for t in ok for x in t.inter_token()]
    e2e = [t.end - t.start for t in ok]  # type: ignore[operator]
    per_req = [t.output_tokens / (t.end - t.start) for t in ok if t.end > t.start]  # type: ignore[operator]
    out: dict[str, float | int] = {
        "concurrency": concurrency,
        "requests": len(timings),
        "ok": len(ok),
        "failed": len(timings) - len(ok),
        "output_tokens": tokens,
        "wall_s": wall,
        "output_tok_s": tokens / wall if wall > 0 else 0.0,
        "per_request_tok_s": sum(per_req) / len(per_req) if per_req else 0.0,
    }
    for name, xs in (("ttft", ttfts), ("itl", itls), ("e2e", e2e)):
        for q in (50, 95, 99):
            out[f"{name}_p{q}_ms"] = percentile(xs, q) * 1000.0
    return out
