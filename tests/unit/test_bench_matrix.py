"""The class matrix's and the soak's arithmetic (bench/matrix.py, bench/soak_peer.py): the table's
numbers come from the right rows, a server that did not start stays in the table, growth is
measured after the baseline."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import matrix  # noqa: E402
import soak_peer  # noqa: E402


def _row(c: int, tok_s: float, ttft: float, failed: int = 0, group: str = "all") -> dict[str, Any]:
    return {
        "concurrency": c,
        "output_tok_s": tok_s,
        "ttft_p50_ms": ttft,
        "ttft_p99_ms": ttft * 2,
        "failed": failed,
        "ok": c - failed,
        "group": group,
    }


def _result() -> dict[str, Any]:
    legs = {
        "first": {"rows": [_row(1, 10, 1200.0)]},
        "warm": {"rows": [_row(1, 10, 300.0)]},
        "streams": {"rows": [_row(1, 100, 5), _row(16, 900, 9), _row(64, 2000, 20, failed=3)]},
        "prefix": {"rows": [_row(1, 50, 400.0, group="cold"), _row(1, 50, 40.0, group="hit")]},
    }
    return {"class": "dense", "server": "mlxd", "version": "abc", "ready_s": 9.5, "legs": legs}


def test_summary_takes_each_number_from_its_leg() -> None:
    s = matrix.summarize(_result())
    assert (s["first_ttft_ms"], s["warm_ttft_ms"]) == (1200.0, 300.0)
    assert s["c64"] == {"tok_s": 2000, "failed": 3, "ttft_p50_ms": 20, "ttft_p99_ms": 40}
    assert (s["prefix_cold_ms"], s["prefix_hit_ms"]) == (400.0, 40.0)


def test_table_keeps_a_server_that_did_not_start() -> None:
    ok = {**_result(), "summary": matrix.summarize(_result())}
    dead = {"class": "dense", "server": "mlx-vlm", "version": "0.7.10", "ready_s": None}
    dead.update(failed="did not start", legs={})
    dead["summary"] = matrix.summarize(dead)
    lines = matrix.table([dead, ok]).splitlines()
    assert lines[2].startswith(
        "| dense | mlxd abc | 9.5 | 1,200 / 300 | 100 (5/10) | 900 (9/18) | 2,000 (20/40), 3 failed"
    )
    assert lines[3].endswith("| – / – | did not start |")


def test_growth_is_measured_after_the_baseline() -> None:
    samples = [
        {"t": t, "gpu_mb": mb, "tree_rss_mb": 100.0}
        for t, mb in [(0, 100.0), (30, 900.0), (60, 1000.0), (300, 1100.0), (600, 1040.0)]
    ]
    g = soak_peer.growth(samples, baseline_s=60)
    assert (g["measure"], g["baseline_mb"], g["last_mb"]) == ("gpu_mb", 1000.0, 1040.0)
    assert (g["growth_pct"], g["peak_growth_pct"], g["rss_growth_pct"]) == (4.0, 10.0, 0.0)
    # it last rose at 300 s, and from the middle of the run (300 s) it fell
    assert (g["grew_until_t"], g["late_growth_pct"]) == (300, -5.45)


def test_a_memory_that_stops_growing_shows_no_second_half_growth() -> None:
    steps = [(0, 90.0), (60, 100.0), (120, 104.0), (200, 106.0), (400, 106.0), (600, 106.0)]
    samples = [{"t": t, "gpu_mb": mb, "tree_rss_mb": 1.0} for t, mb in steps]
    g = soak_peer.growth(samples, baseline_s=60)
    assert (g["growth_pct"], g["grew_until_t"], g["late_growth_pct"]) == (6.0, 200, 0.0)
    steps[-1] = (600, 116.0)  # still growing at the end
    g = soak_peer.growth([{"t": t, "gpu_mb": mb, "tree_rss_mb": 1.0} for t, mb in steps], 60)
    assert (g["grew_until_t"], g["late_growth_pct"]) == (600, 9.43)


def test_growth_falls_back_to_rss_without_a_gpu() -> None:
    samples = [
        {"t": t, "gpu_mb": None, "tree_rss_mb": mb}
        for t, mb in [(0, 50.0), (80, 200.0), (100, 210.0)]
    ]
    g = soak_peer.growth(samples, baseline_s=60)
    assert (g["measure"], g["baseline_mb"], g["growth_pct"]) == ("tree_rss_mb", 200.0, 5.0)


def test_vision_runs_its_own_legs_as_chat_and_records_what_it_does_not_start() -> None:
    import argparse

    args = argparse.Namespace(
        levels="1,16", prompt_tokens=128, max_tokens=128, client_procs=8, image_size=448
    )
    legs = {leg.name: leg.options for leg in matrix.legs(args, "vision")}
    assert set(legs) == {"streams", "prefix"}
    assert "--image-size" in legs["streams"] and "shared-image" in legs["prefix"]
    skipped = matrix.not_run("vision", "mlx_lm.server")
    assert "refuses images" in skipped["failed"] and skipped["summary"]["failed"]


def test_repeated_passes_turn_the_servers_order() -> None:
    servers = ["mlxd", "vllm-mlx", "rapid-mlx"]
    assert matrix.rotated(servers, 0) == servers
    assert matrix.rotated(servers, 1) == ["vllm-mlx", "rapid-mlx", "mlxd"]
    assert matrix.rotated(servers, 4) == ["vllm-mlx", "rapid-mlx", "mlxd"]
    assert matrix.rotated([], 2) == []
