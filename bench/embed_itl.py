"""A running stream's inter-token gaps while a large embeddings request is served, against the
gaps a prompt of the same token count causes (issue 41 point 6).

Starts `mlxd start` on a made model (qwen3, --size tiny unless given) in a fresh data directory,
starts one endless stream, then alternates --rounds times: an embeddings request of --inputs
inputs (short texts, and --long of them --long-tokens token ids long: longer than a step's
budget), and a fresh completions prompt (max_tokens 1, no prefix-cache hit) with as many tokens
as the embeddings request used in all. Round 0 (first-time kernel builds) is not counted. For
each it records the stream's gaps from the request's send to its answer; prints
the stream's mean gap alone and each leg's worst gap, with their medians over the rounds.

    .venv/bin/python bench/embed_itl.py [--size tiny] [--inputs 512] [--rounds 5] [--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
    ap.add_argument("--inputs", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--long", type=int, default=4)
    ap.add_argument("--long-tokens", type=int, default=2000)
    ap.add_argument("--prefill-chunk", type=int, default=256)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlxd-embed-") as home:
        model = _model(Path(home), args.size)
        url, proc = _start(home, model, args.prefill_chunk)
        try:
            name = wait(url)
            result = measure(url, name, inputs(args), args.rounds)
        finally:
            proc.terminate()
            proc.wait(60)
    result["prefill_chunk"] = args.prefill_chunk
    _print(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


def inputs(args: argparse.Namespace) -> list[str | list[int]]:
    """Short texts of mixed lengths (about 5 to 20 tokens), then the long inputs."""
    short: list[str | list[int]] = [
        f"input {i}: " + "lorem ipsum dolor " * (i % 4) for i in range(args.inputs - args.long)
    ]
    return short + [_ids(args.long_tokens, 1000 + k) for k in range(args.long)]


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 250) for _ in range(n)]


def measure(url: str, name: str, inputs: list[str | list[int]], rounds: int) -> dict[str, object]:
    """The stream's gaps during each leg, legs alternated until ``rounds`` rounds counted (a
    round in which the stream ended and started again is not: its new request waits in the
    queue behind the leg's work, which is no inter-token gap)."""
    times: list[float] = []
    starts: list[float] = []
    stop = threading.Event()
    stream = threading.Thread(target=_stream, args=(url, name, times, stop, starts), daemon=True)
    stream.start()
    while len(times) < 20:
        time.sleep(0.05)
    legs: dict[str, list[float]] = {"embed": [], "prompt": []}
    medians: list[float] = []
    with httpx.Client(base_url=url, timeout=600) as client:
        tokens, r = 0, 0
        while len(legs["embed"]) < rounds and r < 2 * rounds + 1:
            time.sleep(0.5)  # the stream alone a while: its mean gap
            t0, t1, tokens = _embed(client, name, inputs)
            embed, gap = _worst_gap(times, t0, t1), _mean_gap(times, t0)
            time.sleep(0.5)
            t2, t3 = _prompt(client, name, _ids(tokens, r))
            if r and not any(t0 - 0.5 <= t <= t3 for t in starts):  # round 0 builds kernels
                legs["embed"].append(embed)
                medians.append(gap)
                legs["prompt"].append(_worst_gap(times, t2, t3))
            r += 1
    stop.set()
    stream.join(60)
    return {
        "inputs": len(inputs),
        "long_inputs": sum(isinstance(x, list) for x in inputs),
        "embed_tokens": tokens,
        "stream_gap_ms": statistics.median(medians),
        "embed_worst_ms": legs["embed"],
        "prompt_worst_ms": legs["prompt"],
        "ratios": [e / p for e, p in zip(legs["embed"], legs["prompt"], strict=True)],
    }


def _embed(
    client: httpx.Client, name: str, inputs: list[str | list[int]]
) -> tuple[float, float, int]:
    t0 = time.monotonic()
    r = client.post("/v1/embeddings", json={"model": name, "input": inputs})
    t1 = time.monotonic()
    r.raise_for_status()
    return t0, t1, int(r.json()["usage"]["prompt_tokens"])


def _prompt(client: httpx.Client, name: str, prompt: list[int]) -> tuple[float, float]:
    body = {"model": name, "prompt": prompt, "max_tokens": 1}
    t0 = time.monotonic()
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return t0, time.monotonic()


def _stream(
    url: str, name: str, times: list[float], stop: threading.Event, starts: list[float]
) -> None:
    """One stream of endless output, restarted until ``stop``: each event's arrival, and
    when each stream started."""
    body = {
        "model": name,
        "prompt": [5, 6, 7, 8],
        "max_tokens": 30_000,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    while not stop.is_set():
        starts.append(time.monotonic())
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=3600) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    times.append(time.monotonic())
                if stop.is_set():
                    return


def _worst_gap(times: list[float], start: float, end: float) -> float:
    """The longest gap (ms) between the stream's events from ``start`` to ``end``, the
    window's edges counted (a stream that stalled shows its whole stall)."""
    inside = [t for t in list(times) if start <= t <= end]
    edges = [start, *inside, end]
    return max((b - a) * 1e3 for a, b in zip(edges, edges[1:], strict=False))


def _mean_gap(times: list[float], before: float) -> float:
    """The stream's mean gap (ms) over its 50 events before ``before`` (events that one read
    brings together have gaps of 0, so a median would say little)."""
    last = [t for t in list(times) if t < before][-50:]
    return (last[-1] - last[0]) * 1e3 / (len(last) - 1)


def _model(home: Path, size: str) -> Path:
    from mlxd.models.maker import write_model
    from mlxd.models.presets import model_config

    config = model_config("qwen3", size)
    config["max_position_embeddings"] = 32_768  # a prompt as long as the embeddings request
    return write_model(home / "model", config, progress=lambda line: None)


def _start(home: str, model: Path, chunk: int) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    cmd = [sys.executable, "-m", "mlxd", "start", "--model", f"m={model}", "--port", str(port)]
    cmd += [
        "--log-level",
        os.environ.get("MLXD_BENCH_LOG", "warning"),
        "--prefill-chunk",
        str(chunk),
    ]
    proc = subprocess.Popen(cmd, env={**os.environ, "MLXD_HOME": home})
    return f"http://127.0.0.1:{port}", proc


def _print(r: dict[str, object]) -> None:
    def ms(values: object) -> str:
        assert isinstance(values, list)
        return " ".join(f"{v:.0f}" for v in values) + f"  (median {statistics.median(values):.0f})"

    print(
        f"{r['inputs']} inputs, {r['long_inputs']} long ({r['embed_tokens']} tokens), "
        f"prefill chunk {r['prefill_chunk']};"
        f" stream's mean gap {r['stream_gap_ms']:.1f} ms"
    )
    print(f"  worst gap during embeddings  ms: {ms(r['embed_worst_ms'])}")
    print(f"  worst gap during the prompt  ms: {ms(r['prompt_worst_ms'])}")
    ratios = r["ratios"]
    assert isinstance(ratios, list)
    print("  embeddings / prompt: " + " ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
