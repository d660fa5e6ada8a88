"""500 concurrent streaming clients against a tiny model: each ends in a full completion or a
clean 429/503, none hangs, ``/health`` stays fast throughout (probed from another process), and
the gateway's file descriptors and memory come back to their baseline."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

NUM_CLIENTS = 500
MAX_TOKENS = 4
REQUEST_TIMEOUT_S = 120.0
HEALTH_P50_MS = 100.0  # a blocked event loop stalls every probe: the median shows it
HEALTH_P95_MS = 2000.0
RAMP_S = 0.002


@pytest.fixture(scope="module")
def loaded(tiny_model: Path) -> Iterator[Daemon]:
    d = start_daemon(
        tiny_model, "--max-context", "256", "--max-num-seqs", "64", "--max-queued", "192"
    )
    yield d
    stop_daemon(d)


async def one_stream(host: str, port: int, model: str, i: int) -> str:
    """One streamed completion over a raw connection: "ok", "429", "503", or what went wrong."""
    body = json.dumps(
        {
            "model": model,
            "prompt": f"hello {i}",
            "max_tokens": MAX_TOKENS,
            "stream": True,
            "ignore_eos": True,
        }
    )
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            f"{body}".encode()
        )
        data = await reader.read()  # to EOF: Connection: close
    finally:
        writer.close()
    status = data[9:12].decode()
    if status in ("429", "503"):
        return status if b'"error"' in data else f"{status} without an error body"
    if status != "200":
        return f"status {status}"
    if (
        b'"finish_reason":"length"' in data
        and data.endswith(b"0\r\n\r\n")
        and (b"data: [DONE]" in data)
    ):
        return "ok"
    return f"incomplete: {data[-200:]!r}"


async def wave(d: Daemon, num_clients: int = NUM_CLIENTS) -> Counter[str]:
    host, port = d.base_url.removeprefix("http://").split(":")

    async def bounded(i: int) -> str:
        await asyncio.sleep(i * RAMP_S)  # arrivals over ~1 s, not one SYN flood in a millisecond
        try:
            return await asyncio.wait_for(
                one_stream(host, int(port), d.model, i), REQUEST_TIMEOUT_S
            )
        except TimeoutError:
            return "hung"
        except OSError as exc:
            return f"connection error: {exc}"

    return Counter(await asyncio.gather(*(bounded(i) for i in range(num_clients))))


def usage(pid: int) -> tuple[int, float]:
    """The process's open file descriptors and resident memory (MiB)."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return fds, int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def settled(pid: int, fds: int | None = None) -> tuple[int, float]:
    """``usage`` once the fd count is back under ``fds`` + 5 (or stops falling), up to 10 s:
    closed connections leave the gateway's table a moment later."""
    deadline = time.monotonic() + 10
    last = usage(pid)
    while time.monotonic() < deadline and (fds is None or last[0] > fds + 5):
        time.sleep(0.2)
        now = usage(pid)
        if fds is None and now[0] >= last[0]:
            return now
        last = now
    return last


def test_500_streaming_clients(loaded: Daemon) -> None:
    warmup = asyncio.run(wave(loaded, 200))  # the first wave grows pools and caches for good
    assert set(warmup) <= {"ok", "429", "503"}, warmup
    wait_for_metrics_poller(loaded)  # its control connection is part of the baseline
    pid = loaded.proc.pid  # the gateway runs in the `mlxd start` process
    base_fds, base_rss = settled(pid)
    host, port = loaded.base_url.removeprefix("http://").split(":")
    script = str(Path(__file__).with_name("probe_health.py"))
    probe = subprocess.Popen(
        [sys.executable, script, host, port], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    started = time.monotonic()
    outcomes = asyncio.run(wave(loaded))
    took = time.monotonic() - started
    latencies = json.loads(probe.communicate(b"", timeout=30)[0])
    assert set(outcomes) <= {"ok", "429", "503"}, outcomes
    assert outcomes["ok"] >= 64, outcomes  # at least a full batch was served
    # On 2 shared cores the load generator, the worker, the prober and other test runs compete
    # for CPU, and each probe's new connection waits in the accept queue behind the wave's
    # arrivals: the odd probe takes 200-800 ms on a loaded machine (p95 205 ms in a CI run at
    # load average 8). A blocked event loop delays them all, so the median carries the budget;
    # the tail is bounded loosely and no probe may wait 5 s (a 10 ms block per request gave
    # 4 probes of up to 3.9 s).
    assert len(latencies) >= 5, latencies
    assert _percentile(latencies, 50) < HEALTH_P50_MS, (took, sorted(latencies))
    assert _percentile(latencies, 95) < HEALTH_P95_MS, (took, sorted(latencies))
    assert max(latencies) < 5000, (took, sorted(latencies))
    fds, rss = settled(pid, base_fds)
    assert fds <= base_fds + 5, (base_fds, fds)
    assert rss <= base_rss + 30, (base_rss, rss)
    print(
        f"500 clients in {took:.1f}s: {dict(outcomes)}; /health p50 "
        f"{_percentile(latencies, 50):.1f} ms, p95 {_percentile(latencies, 95):.0f} ms, max "
        f"{max(latencies):.0f} ms over {len(latencies)} probes; fds {base_fds}->{fds}, "
        f"rss {base_rss:.0f}->{rss:.0f} MiB"
    )


def wait_for_metrics_poller(d: Daemon) -> None:
    """Until /metrics shows the worker's gauges: the gateway's poller (every 2 s) has opened
    its own control connection to the worker, whose file descriptors stay open from then on."""
    deadline = time.monotonic() + 15
    while (
        f'mlxd_running_sequences{{model="{d.model}"}}'
        not in httpx.get(f"{d.base_url}/metrics", timeout=10).text
    ):
        assert time.monotonic() < deadline, "the metrics poller never reached the worker"
        time.sleep(0.2)


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]
