"""A 32k-token prompt's TTFT, and the inter-token latency of streams running while it prefills
(issue 21 point 4).

Starts `mlxd start` on a made model with a 32,768-token context (qwen3, --size tiny unless
given) in a fresh data directory, then:

1. --streams running streams alone (the ITL baseline), for --baseline-s seconds;
2. the same streams, and one --prompt-tokens prompt sent while they run: its TTFT, and the
   streams' ITL p50 / p99 / max during its prefill (from its send to its first token).

The chunked prefill (--prefill-chunk tokens per step) lets decode steps run between chunks, so
the streams slow but do not stop. Prints one table; --json writes the figures.

    .venv/bin/python bench/long_prompt_itl.py [--size tiny] [--streams 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from kv_memory import free_port, wait  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", help="`mlxd make-model --size` of the qwen3 model")
    ap.add_argument("--prompt-tokens", type=int, default=32_000)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--baseline-s", type=float, default=10.0)
    ap.add_argument("--prefill-chunk", type=int, default=512)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlxd-long-") as home:
        model = _model(Path(home), args.size)
        url, proc = _start(home, model, args.prefill_chunk)
        try:
            name = wait(url)
            result = _measure(url, name, args)
        finally:
            proc.terminate()
            proc.wait(60)
    _print(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


def _model(home: Path, size: str) -> Path:
    from mlxd.models.maker import write_model
    from mlxd.models.presets import model_config

    config = model_config("qwen3", size)
    config["max_position_embeddings"] = 32_768
    return write_model(home / "model-32k", config, progress=lambda line: None)


def _start(home: str, model: Path, chunk: int) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlxd",
        "start",
        "--model",
        f"long={model}",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--prefill-chunk",
        str(chunk),
    ]
    proc = subprocess.Popen(cmd, env={**os.environ, "MLXD_HOME": home})
    return f"http://127.0.0.1:{port}", proc


def _measure(url: str, name: str, args: argparse.Namespace) -> dict[str, object]:
    stop = threading.Event()
    arrivals: list[list[float]] = [[] for _ in range(args.streams)]
    threads = [
        threading.Thread(target=_stream, args=(url, name, arrivals[i], stop), daemon=True)
        for i in range(args.streams)
    ]
    for t in threads:
        t.start()
    # The streams' own prefill and first tokens: on a fresh CUDA worker, first-time kernel
    # builds take seconds (a fixed 2 s wait measured no baseline on an H100).
    deadline = time.monotonic() + 120
    while min(len(a) for a in arrivals) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    b0 = time.monotonic()
    time.sleep(args.baseline_s)
    b1 = time.monotonic()
    prompt = [3 + (7 * j) % 250 for j in range(args.prompt_tokens)]
    body = {"model": name, "prompt": prompt, "max_tokens": 1, "stream": True}
    t0 = time.monotonic()
    ttft = None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=3600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and ttft is None:
                ttft = time.monotonic() - t0
    t1 = t0 + (ttft or 0.0)
    stop.set()
    for t in threads:
        t.join(60)
    return {
        "prompt_tokens": args.prompt_tokens,
        "streams": args.streams,
        "ttft_s": ttft,
        "prefill_chunk": args.prefill_chunk,
        "alone": _gaps(arrivals, b0, b1),
        "during_prefill": _gaps(arrivals, t0, t1),
    }


def _stream(url: str, name: str, times: list[float], stop: threading.Event) -> None:
    """Streams of endless output, one after another until ``stop``: each event's arrival."""
    body = {
        "model": name,
        "prompt": [5, 6, 7, 8],
        "max_tokens": 20_000,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    while not stop.is_set():
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=3600) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    times.append(time.monotonic())
                if stop.is_set():
                    return


def _gaps(arrivals: list[list[float]], start: float, end: float) -> dict[str, float]:
    """Inter-token gaps (ms) of every stream between ``start`` and ``end``, the window's edges
    counted, so a stream that stopped shows its whole stall."""
    gaps: list[float] = []
    for times in arrivals:
        inside = [t for t in times if start <= t <= end]
        edges = [start, *inside, end]
        gaps += [(b - a) * 1e3 for a, b in zip(edges, edges[1:], strict=False)]
    gaps.sort()
    return {
        "events": len(gaps),
        "itl_p50_ms": statistics.median(gaps),
        "itl_p99_ms": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))],
        "itl_max_ms": gaps[-1],
    }


def _print(r: dict[str, object]) -> None:
    print(
        f"{r['prompt_tokens']}-token prompt beside {r['streams']} streams: TTFT "
        f"{r['ttft_s']:.1f} s (prefill chunk {r['prefill_chunk']})"
    )
    for key in ("alone", "during_prefill"):
        g = r[key]
        assert isinstance(g, dict)
        print(
            f"  streams' ITL {key:15} p50 {g['itl_p50_ms']:8.1f} ms  p99 {g['itl_p99_ms']:8.1f}"
            f" ms  max {g['itl_max_ms']:8.1f} ms  ({g['events']} gaps)"
        )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
