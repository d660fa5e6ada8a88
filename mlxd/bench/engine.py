"""`mlxd bench engine`: the same workload in-process (no HTTP, no ZMQ), and mlx-lm's own
``BatchGenerator`` / ``generate_step`` on the same prompts as the yardstick."""

from __future__ import annotations

import copy
import time
from typing import Any

from mlxd.bench.stats import RequestTiming, summarize
from mlxd.config import SchedulerConfig, split_kv_budget
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


def load_served(path: str) -> tuple[Any, Any]:
    """``path``'s model and tokenizer as the worker serves them: quantized layers take a batch as
    rows of one matrix, and only each row's last position is projected to the vocabulary."""
    import mlx_lm

    from mlxd.worker.runners.output_head import last_position_only
    from mlxd.worker.runners.quantized import batch_as_rows

    model, tokenizer = mlx_lm.load(path)[:2]
    batch_as_rows(model)
    last_position_only(model)
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
    """An engine whose channel records token timings (see ``engine_level``): on the paged KV
    cache (the daemon's default; a pool for ``max_num_seqs`` full contexts) or the contiguous
    one. ``max_view_tokens`` bounds decode's read view (default: the pool's tokens; 0: decode
    gathers the pool's blocks every step). ``kv_bits``: the pool quantized (``--kv-bits``).
    ``kv_cache_gb``: pool and view sized from that budget as a served worker sizes them
    (``config.split_kv_budget``), so a batch that outgrows the daemon's view does here too.
    A hybrid and a sliding-window model are paged as the worker pages them (``runners.hybrid``,
    ``runners.window``); other layouts the pool cannot hold run on the contiguous cache."""
    from mlxd.knobs import KV_CHUNK_MB
    from mlxd.worker.engine import Engine
    from mlxd.worker.kv import layer_caches
    from mlxd.worker.kv.block_pool import BlockPool
    from mlxd.worker.kv.formats import KVFormat
    from mlxd.worker.kv.paged_cache import KVPool
    from mlxd.worker.runners.base import ModelRunner, check_model_supported
    from mlxd.worker.runners.hybrid import HybridModelRunner, reserved_bytes
    from mlxd.worker.runners.paged import PagedModelRunner
    from mlxd.worker.runners.window import WindowModelRunner
    from mlxd.worker.sampling.tokenizer import PromptEncoder
    from mlxd.worker.sched.prefill_cost import PrefillCost
    from mlxd.worker.sched.scheduler import Scheduler

    encoder = PromptEncoder(tokenizer, vocab_size=model.args.vocab_size)
    eos = encoder.eos_token_ids
    hybrid = paged and layer_caches.is_hybrid(model)
    window = layer_caches.window_size(model) if paged and not hybrid else 0
    if not paged or (check_model_supported(model) and not hybrid and not window):
        runner, pool = ModelRunner(model, eos), None
    else:
        num_blocks = sched.max_num_seqs * -(-max_context // block_size) + 64
        state_budget = 1 << 30
        if kv_cache_gb is not None:
            budget = int(kv_cache_gb * 2**30)
            state_budget, rows = 0, 0
            if hybrid:  # as the worker reserves it
                state_budget, rows = reserved_bytes(model, budget, sched.max_num_seqs)
            per_token = sum(KVPool.bytes_per_token(model, KVFormat(kv_bits), windows=w)
                            for w in ((False, True) if window else (False,)))  # fmt: skip
            num_blocks, max_view_tokens = split_kv_budget(budget - state_budget - rows,
                                                          per_token, block_size)  # fmt: skip
        if window:  # both pools grow as a worker's do, a chunk at a time
            runner, pool = WindowModelRunner.for_model(
                model, eos, num_blocks, block_size, window, int(KV_CHUNK_MB.default * 2**20),
                KVFormat(kv_bits), max_view_tokens)  # fmt: skip
        else:
            pool_kv = KVPool.for_model(model, num_blocks, block_size, fmt=KVFormat(kv_bits))
            runner = (
                HybridModelRunner(model, eos, pool_kv, state_budget, max_view_tokens)
                if hybrid
                else PagedModelRunner(model, eos, pool_kv, max_view_tokens)
            )
            pool = BlockPool(num_blocks, block_size)
    scheduler = Scheduler(sched, pool=pool, cost=PrefillCost.for_model(model))
    runner.fit_scheduler(scheduler)
    return Engine(name="bench", runner=runner, scheduler=scheduler,
                  encoder=encoder, channel=_Recorder(0.0, {}),  # type: ignore[arg-type]
                  max_context=max_context)  # fmt: skip


def engine_level(engine: Any, prompts: list[list[int]], max_tokens: int | list[int],
                 margins: bool = False) -> dict[str, float | int]:  # fmt: skip
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
        sampling = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True,
                                  logprobs=margins, top_logprobs=2 if margins else 0)  # fmt: skip
        engine.dispatch(b"b", Generate(request_id=str(i), prompt=TokenPrompt(token_ids=p),
                                       sampling=sampling))  # fmt: skip
    while engine.scheduler.has_work():
        engine.step()
    step = engine.stats.reply("bench")
    spec = engine.speculator.counters.since(before)
    return {**summarize(len(prompts), list(timings.values())),
            "step_p50_ms": round(step.decode_step.p50_ms, 2),
            "step_rows_mean": round(step.decode_rows_mean, 1),
            "gathered_steps": engine.runner.gathered_steps - gathered,
            "spec_acceptance": round(spec.acceptance_rate, 3),
            "tokens_per_forward": round(spec.tokens_per_forward, 3)}  # fmt: skip


def mlx_lm_batch_level(model: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    """mlx-lm's BatchGenerator on the same prompts (no stop tokens: every row runs max_tokens)."""
    from mlx_lm.generate import BatchGenerator

    n = len(prompts)
    gen = BatchGenerator(model, stop_tokens=[], completion_batch_size=n,
                         prefill_batch_size=min(n, 8))  # fmt: skip
    t0 = time.perf_counter()
    gen.insert(prompts, [max_tokens] * n)
    tokens = 0
    while responses := gen.next_generated():  # type: ignore[no-untyped-call]
        tokens += len(responses)
    wall = time.perf_counter() - t0
    gen.close()  # type: ignore[no-untyped-call]
    return {"concurrency": n, "output_tokens": tokens, "wall_s": wall,
            "output_tok_s": tokens / wall}  # fmt: skip


def mlx_lm_single(model: Any, prompt: list[int], max_tokens: int) -> dict[str, float]:
    """mlx-lm's generate_step, one stream: the single-user yardstick."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    t0 = time.perf_counter()
    n = sum(1 for _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens))
    wall = time.perf_counter() - t0
    return {"concurrency": 1, "output_tokens": n, "wall_s": wall, "output_tok_s": n / wall}
