"""Benchmark results for people (a table, a few summary lines) and for programs (JSON)."""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path
from typing import Any

from mlxd.bench.stats import ALL

# (row key, header, format); optional columns appear only when some row has the key set.
_COLUMNS = (
    ("concurrency", "conc", "d"),
    ("group", "group", "s"),
    ("prefix_tokens", "prefix", "d"),
    ("ok", "ok", "d"),
    ("failed", "fail", "d"),
    ("output_tok_s", "out tok/s", ".1f"),
    ("per_request_tok_s", "req tok/s", ".1f"),
    ("ttft_p50_ms", "ttft p50", ".0f"),
    ("ttft_p95_ms", "p95", ".0f"),
    ("ttft_p99_ms", "p99", ".0f"),
    ("itl_p50_ms", "itl p50", ".1f"),
    ("itl_p95_ms", "p95", ".1f"),
    ("itl_p99_ms", "p99", ".1f"),
    ("e2e_p50_ms", "e2e p50", ".0f"),
    ("e2e_p95_ms", "p95", ".0f"),
    ("e2e_p99_ms", "p99", ".0f"),
    ("speedup", "speedup", ".2f"),
    ("spec_acceptance", "accept", ".2f"),
    ("tokens_per_forward", "tok/fwd", ".2f"),
    ("prefix_hit_rate", "cached", ".2f"),
)
_OPTIONAL = {"group", "prefix_tokens", "prefix_hit_rate", "spec_acceptance", "tokens_per_forward"}


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as an aligned text table (latencies in ms)."""
    cols = [c for c in _COLUMNS if c[0] not in _OPTIONAL or _shows(rows, c[0])]
    cells = [[h for _, h, _ in cols]] + [[_cell(r.get(k), f) for k, _, f in cols] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(cols))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells
    )


def prefix_summary(rows: list[dict[str, Any]]) -> list[str]:
    """For shared-prefix and shared-image rows: TTFT p50 cold vs hit per prefix (or image)
    and concurrency."""
    cold = {(_shared(r), r["concurrency"]): r for r in rows if r.get("group") == "cold"}
    lines = []
    for r in rows:
        c = cold.get((_shared(r), r["concurrency"]))
        if r.get("group") != "hit" or c is None:
            continue
        ratio = c["ttft_p50_ms"] / r["ttft_p50_ms"] if r["ttft_p50_ms"] > 0 else math.nan
        lines.append(
            f"{_shared(r)} at concurrency {r['concurrency']}: "
            f"TTFT p50 cold {c['ttft_p50_ms']:.0f} ms, hit {r['ttft_p50_ms']:.0f} ms "
            f"({ratio:.2f}x)"
        )
    return lines


def _shared(row: dict[str, Any]) -> str:
    """What a cold/hit row shares: a prefix of N tokens, or an image."""
    if "image_size" in row:
        return f"image {row['image_size']}x{row['image_size']}"
    return f"prefix {row.get('prefix_tokens')} tokens"


def failures(rows: list[dict[str, Any]]) -> list[str]:
    """One line per level with failed requests: the commonest errors."""
    return [
        f"concurrency {r['concurrency']}: {r['failed']} failed: "
        + "; ".join(f"{n}x {e}" for e, n in r.get("errors", {}).items())
        for r in rows
        if r.get("failed") and r.get("group", ALL) == ALL
    ]


def meta(**fields: Any) -> dict[str, Any]:
    """Where and when: goes at the top of every JSON result."""
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return {
        "date": when,
        "host": platform.node(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        **fields,
    }


def write_json(path: Path, payload: dict[str, Any]) -> None:
    # NaN is not JSON: a missing measurement is null.
    path.write_text(json.dumps(_nan_to_none(payload), indent=2) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    if "rows" not in data:
        data["rows"] = data.get("levels", [])  # files written before scenarios existed
    return data


# Internal helpers


def _shows(rows: list[dict[str, Any]], key: str) -> bool:
    return any(r.get(key) not in (None, ALL) for r in rows)


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt) if fmt != "s" else str(value)


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x
