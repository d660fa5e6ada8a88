"""A worker's memory through one long decode (not a test): does it hold the batch's K/V once?

    python bench/long_decode_memory.py MODEL_DIR [STREAMS=8] [TOKENS=2500] [EVERY_S=3]

Starts ``mlxd start`` on a free port, sends STREAMS streaming requests of TOKENS tokens at once
(ignore_eos, so no request joins or leaves the batch), and every EVERY_S seconds prints the
worker's MLX active memory and its KV bytes (``mlxd worker status``) as one JSON line. Held
once, active memory grows only as fast as the K/V does.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
from soak import free_port, wait_healthy  # bench/ is on the path of a script run


async def stream(client: httpx.AsyncClient, url: str, i: int, tokens: int) -> None:
    body = {
        "model": "m",
        "prompt": [10 + i] * 16,
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
    }
    async with client.stream("POST", f"{url}/v1/completions", json=body, timeout=None) as r:
        async for _ in r.aiter_lines():
            pass


async def watch(url: str, streams: int, tokens: int, every_s: float) -> None:
    async with httpx.AsyncClient() as client:
        jobs = asyncio.gather(*(stream(client, url, i, tokens) for i in range(streams)))
        t0 = time.monotonic()
        while not jobs.done():
            await asyncio.wait([jobs], timeout=every_s)
            status = (await client.get(f"{url}/admin/models/m/status")).json()
            memory = status.get("memory", {})
            print(
                json.dumps(
                    {
                        "t_s": round(time.monotonic() - t0, 1),
                        "active_mb": round(memory.get("active_bytes", 0) / 2**20, 1),
                        "kv_mb": round(memory.get("kv_bytes", 0) / 2**20, 1),
                    }
                ),
                flush=True,
            )
        await jobs


def main() -> None:
    model = sys.argv[1]
    streams, tokens = (int(a) for a in (sys.argv[2:] + ["8", "2500"][len(sys.argv) - 2 :])[:2])
    every_s = float(sys.argv[4]) if len(sys.argv) > 4 else 3.0
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlxd",
            "start",
            "--model",
            f"m={model}",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
    )
    try:
        wait_healthy(url, daemon)
        asyncio.run(watch(url, streams, tokens, every_s))
    finally:
        daemon.terminate()
        daemon.wait(30)


if __name__ == "__main__":
    main()
