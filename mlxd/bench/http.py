"""`mlxd bench run`: a streaming load against any OpenAI-compatible /v1/completions."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import httpx

from mlxd.bench.stats import RequestTiming, summarize


def make_prompts(n: int, prompt_tokens: int, vocab: int = 1000, seed: int = 0) -> list[list[int]]:
    """Token-id prompts of an exact length (ids kept low so every vocabulary has them)."""
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(prompt_tokens)] for _ in range(n)]


def as_text(prompts: list[list[int]], tokenizer_path: str) -> list[str]:
    """The same prompts as text, for servers that take only string prompts (mlx_lm.server).

    Random ids do not survive decode/encode: the text re-encodes longer, so it is cut back to
    the wanted length a few times until it re-encodes close to it."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{tokenizer_path.rstrip('/')}/tokenizer.json")
    texts = []
    for ids in prompts:
        text = tok.decode(ids)
        for _ in range(3):
            text = tok.decode(tok.encode(text).ids[: len(ids)])
        texts.append(text)
    return texts


async def _one(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], t0: float
) -> RequestTiming:
    timing = RequestTiming(start=time.perf_counter() - t0)
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                timing.error = f"HTTP {resp.status_code}"
                await resp.aread()
                return timing
            async for line in resp.aiter_lines():
                _on_line(line, timing, t0)
    except httpx.HTTPError as exc:
        timing.error = type(exc).__name__
    timing.end = time.perf_counter() - t0
    return timing


def _on_line(line: str, timing: RequestTiming, t0: float) -> None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return
    chunk = json.loads(line[6:])
    now = time.perf_counter() - t0
    if chunk.get("usage"):
        timing.output_tokens = chunk["usage"]["completion_tokens"]
    if chunk.get("choices") and chunk["choices"][0].get("text"):
        if timing.first_token is None:
            timing.first_token = now
        timing.token_times.append(now)


async def run_level(
    base_url: str,
    model: str,
    concurrency: int,
    prompts: list[list[int]] | list[str],
    max_tokens: int,
    timeout_s: float = 600.0,
) -> dict[str, float | int]:
    """Send ``len(prompts)`` streaming requests, ``concurrency`` at a time."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    sem = asyncio.Semaphore(concurrency)
    url = f"{base_url.rstrip('/')}/v1/completions"
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        t0 = time.perf_counter()

        async def go(prompt: list[int] | str) -> RequestTiming:
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                    "temperature": 0.0, "ignore_eos": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            async with sem:
                return await _one(client, url, body, t0)

        timings = await asyncio.gather(*(go(p) for p in prompts))
    return summarize(concurrency, list(timings))
