"""`mlxd bench engine`: the same workload in-process (no HTTP, no ZMQ), and mlx-lm's own
``BatchGenerator`` / ``generate_step`` on the same prompts as the yardstick."""

from __future__ import annotations

import copy
import time
from typing import Any

from mlxd.bench.stats import RequestTiming, summarize
from mlxd.config import SchedulerConfig
from mlxd.protocol.messages import (
    Events,
    Generate,
    Message,
    SamplingParams,
    TokenDelta,
    TokenLogprob,
    TokenPrompt,
)


class _Recorder:
    """The engine's channel, in memory: records when each request's tokens arrive."""

    def __init__(self, t0: float, timings: dict[str, RequestTiming]) -> None:
        self.t0, self.timings = t0, timings
        self.tokens: dict[str, list[int]] = {}  # each request's output (to compare paths)
        # ... and, when asked for, each token's top-2 log-probability margin (a near-tie's size)
        self.margins: dict[str, list[float]] = {}

    def send(self, client: bytes, msg: Message) -> None:
        events = msg.events if isinstance(msg, Events) else [msg]
        now = time.perf_counter() - self.t0
        for e in events:
            t = self.timings[e.request_id]
            if isinstance(e, TokenDelta):
                t.first_token = t.first_token if t.first_token is not None else now
                t.token_times.append(now)
                t.output_tokens += len(e.token_ids)
                self.tokens.setdefault(e.request_id, []).extend(e.token_ids)
                if e.logprobs:  # asked for (``engine_level``'s ``margins``)
                    margins = self.margins.setdefault(e.request_id, [])
                    margins.extend(_margin(x) for x in e.logprobs)
            else:
                t.end = now

    def recv_ready(self, timeout_ms: int) -> list[Any]:
        return []


def _margin(entry: TokenLogprob) -> float:
    """How far the most likely token's log probability is above the runner-up's."""
    top = sorted((t.logprob for t in entry.top_logprobs), reverse=True)
    return top[0] - top[1] if len(top) > 1 else float("inf")


def load_served(path: str, dtype: str = "auto") -> tuple[Any, Any]:
    """``path``'s model and tokenizer as the worker serves them (``runners.served``), the
    weights computed in ``dtype``'s (``auto``: float32 on the CPU backend). The model's own
    changes only: this process's (``for_this_process``) are the caller's to make."""
    import mlx_lm

    from mlxd.worker import cpu_backend
    from mlxd.worker.runners.served import for_serving

    model, tokenizer = mlx_lm.load(path)[:2]
    for_serving(model)
    cpu_backend.cast(model, dtype)
    return model, tokenizer


def new_engine(
    model: Any,
    tokenizer: Any,
    sched: SchedulerConfig,
    max_context: int,
    paged: bool = True,
    block_size: int = 32,
    max_view_tokens: int | None = None,
    kv_bits: int | None = None,
    kv_cache_gb: float | None = None,
) -> Any:
    """An engine whose channel records token timings (see ``engine_level``), built as a worker
    builds its own (``worker/build.py``): on the paged KV cache (the daemon's default; a pool
    for ``max_num_seqs`` full contexts) or the contiguous one. ``max_view_tokens`` bounds
    decode's read view (default: the pool's tokens; 0: decode gathers the pool's blocks every
    step). ``kv_bits``: the pool quantized (``--kv-bits``). ``kv_cache_gb``: pool and view sized
    from that budget as a served worker sizes them (``config.split_kv_budget``), so a batch that
    outgrows the daemon's view does here too. Hybrids, sliding-window models and layouts the
    pool cannot hold get the runner a worker gives them (``build.build_runner``)."""
    from mlxd.config import CacheConfig, WorkerConfig
    from mlxd.worker.build import PoolSize, build_engine, build_runner
    from mlxd.worker.main import model_vocab_size
    from mlxd.worker.sampling.tokenizer import PromptEncoder

    cache = CacheConfig(
        kv_cache_gb=kv_cache_gb, block_size=block_size, paged=paged, kv_bits=kv_bits
    )
    config = WorkerConfig(
        model="bench", name="bench", endpoint="inproc://bench", scheduler=sched, cache=cache
    )
    size = None  # with kv_cache_gb: sized from that budget, as a served worker is
    if kv_cache_gb is None:  # a pool for max_num_seqs full contexts, and some to spare
        size = PoolSize(sched.max_num_seqs * -(-max_context // block_size) + 64, max_view_tokens)
    encoder = PromptEncoder(tokenizer, vocab_size=model_vocab_size(model, tokenizer))
    eos = encoder.eos_token_ids
    runner, pool, max_context = build_runner(model, eos, config, max_context, size)
    return build_engine(
        config,
        runner,
        pool,
        model=model,
        encoder=encoder,
        channel=_Recorder(0.0, {}),  # type: ignore[arg-type]
        max_context=max_context,
    )


def engine_level(
    engine: Any, prompts: list[list[int]], max_tokens: int | list[int], margins: bool = False
) -> dict[str, float | int]:
    """All ``prompts`` submitted at once to ``engine``; returns the summary, with the engine's
    own decode step time (as a served worker reports it in ``mlxd worker stats``).
    ``max_tokens``: every request's, or each one's (requests that end apart). ``margins``: ask
    for the top 2 log probabilities of every token (the channel keeps their margins)."""
    from mlxd.worker.stats import Stats

    timings: dict[str, RequestTiming] = {}
    engine.stats = Stats(engine.clock)  # this level's steps only
    before = copy.copy(engine.speculator.counters)
    gathered = engine.runner.gathered_steps
    t0 = time.perf_counter()
    engine.channel = _Recorder(t0, timings)
    budgets = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    for i, (p, n) in enumerate(zip(prompts, budgets, strict=True)):
        timings[str(i)] = RequestTiming(start=time.perf_counter() - t0)
        sampling = SamplingParams(
            max_tokens=n,
            temperature=0.0,
            ignore_eos=True,
            logprobs=margins,
            top_logprobs=2 if margins else 0,
        )
        engine.dispatch(
            b"b", Generate(request_id=str(i), prompt=TokenPrompt(token_ids=p), sampling=sampling)
        )
    while engine.scheduler.has_work():
        engine.step()
    step = engine.stats.reply("bench")
    spec = engine.speculator.counters.since(before)
    return {
        **summarize(len(prompts), list(timings.values())),
        "step_p50_ms": round(step.decode_step.p50_ms, 2),
        "step_rows_mean": round(step.decode_rows_mean, 1),
        "gathered_steps": engine.runner.gathered_steps - gathered,
        "spec_acceptance": round(spec.acceptance_rate, 3),
        "tokens_per_forward": round(spec.tokens_per_forward, 3),
    }


def mlx_lm_batch_level(model: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    """mlx-lm's BatchGenerator on the same prompts (no stop tokens: every row runs max_tokens)."""
    from mlx_lm.generate import BatchGenerator

    n = len(prompts)
    gen = BatchGenerator(
        model, stop_tokens=[], completion_batch_size=n, prefill_batch_size=min(n, 8)
    )
    t0 = time.perf_counter()
    gen.insert(prompts, [max_tokens] * n)
    tokens = 0
    while responses := gen.next_generated():  # type: ignore[no-untyped-call]
        tokens += len(responses)
    wall = time.perf_counter() - t0
    gen.close()  # type: ignore[no-untyped-call]
    return {
        "concurrency": n,
        "output_tokens": tokens,
        "wall_s": wall,
        "output_tok_s": tokens / wall,
    }


def mlx_lm_single(model: Any, prompt: list[int], max_tokens: int) -> dict[str, float]:
    """mlx-lm's generate_step, one stream: the single-user yardstick."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    t0 = time.perf_counter()
    n = sum(1 for _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens))
    wall = time.perf_counter() - t0
    return {"concurrency": 1, "output_tokens": n, "wall_s": wall, "output_tok_s": n / wall}
