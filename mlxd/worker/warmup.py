"""Warm-up at load: the kernels the first requests need, built on throwaway requests before the
worker says it serves (issue 41 point 4).

A fresh worker's first long prompt paid for every kernel, attention plan and buffer it was the
first to need (on an H100 a 4.5k-token prompt took 1,202 ms after a start, 288 ms once built).
Before serving, the engine therefore runs, on its own paths and in order of what the first
requests need: a prompt of two prefill chunks (a chunk alone and one over cached keys) with the
sampler, then decode steps at 1, 2, 4, ... rows up to ``max_num_seqs`` (at most
``MAX_WARM_ROWS``), every other row sampling with temperature and top-p, the rest greedily. Those
rows start as a burst of chat-sized prompts does (``BATCH_PROMPT_TOKENS`` each, within one step's
budget and the pool), so their prefill builds the batched shapes a burst after the start needs:
on an H200 the first 16 streams of 128-token prompts waited 224 ms (dense) and 1,744 ms (hybrid)
for their first token, against 22 and 143 ms for one stream (run MX1). It
stops at the first engine step that would start after ``--warmup-s`` seconds, within a stage
too (0: no warm-up; by default 20 s on a GPU and none on the CPU: ``warmup_budget``): on an
H100 a hybrid's and a MoE's stages each built kernels for longer than the whole budget, and a
check between stages only let the worker say it serves after 90 s and more. A step itself is
never cut: on an H200 the MoE shape's stage at 8 rows was cut at the budget after one of its
steps had run past it, and warm-up took 47 s of its 20 (run MS1), so a step over
``SLOW_STEP_S`` is logged with what it held. Those steps were MLX compiling its 4-bit expert
matmuls with NVRTC, 30-95 s each, at the first start on a machine; with the compiled kernels
kept (``daemon.worker_command.PTX_CACHE``) the same warm-up ran 18 s (run WT1,
``bench/warmup_trace.py``). The requests go
to no client; afterwards the prefix cache holds nothing of them, their blocks are free and the
worker's counters start from zero. Meanwhile pings say ``warming`` with the stage
(``Pong.warming``), the supervisor shows the worker as ``warming`` and the gateway holds its
requests until it is ready; a request that reaches the worker's socket early waits there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxd.protocol.messages import Generate, Message, SamplingParams, TokenPrompt
from mlxd.worker.kv import attention_shapes
from mlxd.worker.sched.scheduler import CacheCounters
from mlxd.worker.spec.speculator import Speculator
from mlxd.worker.stats import Stats

if TYPE_CHECKING:
    from mlxd.worker.engine import Engine

log = logging.getLogger("mlxd.worker")

GPU_WARMUP_S = 20.0  # the default bound on a GPU
MAX_WARM_ROWS = 64  # decode's batch sizes warmed: powers of two up to this
PROMPT_CHUNKS = 2  # the warm prompt's chunks: one alone, one over cached keys
DECODE_TOKENS = 3  # each decode stage's tokens per row: a step that builds, one that reuses
# The decode stages' prompts: a chat turn's length, long enough for a hybrid's chunked prefill
# (``runners.delta_chunks.MIN_TOKENS``); at most a step's budget, at least the old 8 tokens.
BATCH_PROMPT_TOKENS = 128
MIN_PROMPT_TOKENS = 8
SLOW_STEP_S = 1.0  # a warm-up step longer than this is logged with what it held
WARMUP_CLIENT = b"\x00warmup"  # no gateway connection has this identity


@dataclass(frozen=True, slots=True)
class Stage:
    """One warm-up stage: its prompts run together to ``max_tokens`` each."""

    name: str
    prompts: list[list[int]]
    max_tokens: int


def kernel_note(environ: Mapping[str, str], cuda: bool) -> str:
    """What a start on CUDA says while no compiled kernel is kept yet ("" otherwise): MLX then
    compiles each kernel with NVRTC at its first use, during load and warm-up, minutes of them
    for a MoE on an H200 (run WT1: 216.6 s), once per machine (``MLX_PTX_CACHE_DIR``, which the
    daemon points at its data folder: ``daemon.worker_command.PTX_CACHE``)."""
    folder = environ.get("MLX_PTX_CACHE_DIR", "")
    if not cuda or not folder or any(p.is_file() for p in Path(folder).rglob("*")):
        return ""
    return (
        f"no compiled CUDA kernels in {folder} yet: MLX compiles each at its first use, so this "
        "first start on the machine may take minutes (later starts reuse them)"
    )


def warmup_budget(setting: float | None, device: str) -> float:
    """``--warmup-s``, or by default ``GPU_WARMUP_S`` on a GPU and none on the CPU: there MLX
    builds nothing per shape, and the first long prompt measured what later ones cost (1.05x
    without warm-up, docs/PERFORMANCE.md), so a warm-up would only delay the start."""
    if setting is not None:
        return setting
    return GPU_WARMUP_S if device == "gpu" else 0.0


def stages(engine: Engine) -> list[Stage]:
    """What a first request needs first: a long prompt's chunks, then decode by batch size."""
    config, vocab = engine.scheduler.config, engine.encoder.vocab_size
    room = max(2, min(engine.max_context - DECODE_TOKENS, _pool_tokens(engine) // 2))
    length = min(PROMPT_CHUNKS * config.prefill_chunk, room)
    out = [Stage(f"a {length}-token prompt", [_ids(length, 0, vocab)], 2)]
    rows = 1
    while rows <= min(config.max_num_seqs, MAX_WARM_ROWS):
        n = _batch_prompt(config.prefill_chunk, room, rows)
        # seeds rows .. 2 rows - 1: no stage's prompt is a prefix hit on an earlier one's
        prompts = [_ids(n, seed, vocab) for seed in range(rows, 2 * rows)]
        out.append(Stage(f"decode at {rows} rows", prompts, DECODE_TOKENS))
        rows *= 2
    return out


def _batch_prompt(chunk: int, room: int, rows: int) -> int:
    """Each prompt's tokens in a stage of ``rows``: ``BATCH_PROMPT_TOKENS`` where a step's
    budget (``chunk``) and the pool's ``room`` take them, never below ``MIN_PROMPT_TOKENS``."""
    fits = room // rows - DECODE_TOKENS
    return max(MIN_PROMPT_TOKENS, min(BATCH_PROMPT_TOKENS, chunk, fits))


def warm_up(engine: Engine, budget_s: float, clock: Callable[[], float] = time.monotonic) -> int:
    """Run the warm-up ``stages`` on ``engine`` until done or ``budget_s`` has passed; returns
    how many stages ran. The engine is left as it was before (caches, counters, stats)."""
    if budget_s <= 0:
        return 0
    plan = stages(engine)
    started, done = clock(), 0

    def over() -> bool:
        return clock() - started >= budget_s or engine.should_exit

    channel, engine.channel = engine.channel, _Sink()  # type: ignore[assignment]
    try:
        for stage in plan:
            if over():
                break
            engine.warming = f"{stage.name} ({done + 1}/{len(plan)})"
            stage_started = clock()
            if not _run(engine, stage, over, clock):
                break  # cut at the budget: not counted
            done += 1
            log.info("warm-up: %s in %.2f s", stage.name, clock() - stage_started)
    except Exception:  # noqa: BLE001 - a warm-up that fails costs its speed-up, not the worker
        log.exception("warm-up failed at stage %d; serving without the rest", done + 1)
    finally:
        engine.channel = channel
        _forget(engine)
        engine.warming = ""
        attention_shapes.freeze()  # later new shapes with few scores build no plan
    log.info("warmed up %d of %d stages in %.1f s", done, len(plan), clock() - started)
    return done


def _run(
    engine: Engine, stage: Stage, over: Callable[[], bool], clock: Callable[[], float]
) -> bool:
    """Run ``stage`` step by step; False if ``over()`` cut it (``_forget`` drops what is left)."""
    for i, prompt in enumerate(stage.prompts):
        sampling = SamplingParams(
            max_tokens=stage.max_tokens,
            ignore_eos=True,
            speculate=False,  # the speculator learns nothing from throwaway text
            temperature=0.7 if i % 2 else 0.0,  # both samplers: greedy, and temperature + top-p
            top_p=0.9 if i % 2 else 1.0,
            seed=i,
        )
        request = Generate(
            request_id=f"warmup-{i}", prompt=TokenPrompt(token_ids=prompt), sampling=sampling
        )
        engine.dispatch(WARMUP_CLIENT, request)
    while engine.scheduler.has_work():
        if over():
            return False
        _timed_step(engine, stage, clock)
    return True


def _timed_step(engine: Engine, stage: Stage, clock: Callable[[], float]) -> None:
    """One engine step; one over ``SLOW_STEP_S`` is logged with what it held, since a step is
    never cut and can outlast the whole budget (run MS1: a MoE's stage at 8 rows ran 36 s)."""
    scheduler = engine.scheduler
    held = (len(scheduler.waiting) + len(scheduler.prefilling), len(engine.runner.rows))
    started = clock()
    engine.step()
    took = clock() - started
    if took > SLOW_STEP_S:
        log.info(
            "warm-up: a step of %s took %.2f s (%d prompts to prefill, %d rows decoding)",
            stage.name,
            took,
            *held,
        )


def _forget(engine: Engine) -> None:
    """Nothing of the warm-up stays: its requests (if stopped early), cached blocks, counts."""
    scheduler = engine.scheduler
    for queue in (scheduler.waiting, scheduler.prefilling, scheduler.running):
        for seq in list(queue):
            scheduler.finish(seq, "error")  # "error": its blocks are not cached
            engine.runner.remove({seq})
    scheduler.flush_prefix_cache()
    engine.runner.flush_prefix_cache()
    scheduler.counters = CacheCounters()
    old = engine.speculator  # its batch controller timed throwaway steps: a fresh one
    engine.speculator = Speculator(old.mode, drafter=old.drafter)
    engine.stats = Stats(engine.clock)
    engine.stats.speculator = engine.speculator


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    """``n`` ordinary token ids (past the usual specials where the vocabulary has room),
    different for each ``seed``."""
    first = min(100, vocab // 2)
    return [first + (seed * 7919 + j * 31) % (vocab - first) for j in range(n)]


def _pool_tokens(engine: Engine) -> int:
    """Tokens the KV pool has free (a model on its own caches: no pool, no bound here)."""
    pool = engine.scheduler.pool
    return engine.max_context * 2 if pool is None else pool.num_free * pool.block_size


class _Sink:
    """The engine's channel while it warms up: what it sends goes to no one."""

    def send(self, client: bytes, msg: Message) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the warm-up channel has no {name}")
