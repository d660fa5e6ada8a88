"""Where a hybrid's time goes, in-process: the served runner (``hybrid``: the paged runner the
worker picks, for a hybrid attention in the block pool and recurrent state by row, for a
sliding-window model its window slabs; or ``native``: the model's own caches with whole-cache
snapshots)
on waves of prompts sharing a system prompt, each engine step timed with what it ran.

    python scripts/profile_hybrid.py MODEL_DIR [--runner hybrid|native] [--prefix 4000]
        [--streams 1,8] [--kv-cache-gb 16]

Waves per level: ``cold`` (one new system prompt), ``hit`` (the same, new questions),
``distinct`` (a system prompt each). Per wave: wall time, TTFT p50, the model's forwards and the
tokens they took, and the slowest steps (their prefill chunks' lengths, decode rows, ms).
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import mlx.core as mx
from mlx_lm.utils import load

from mlxd.bench.engine import _Recorder, engine_level
from mlxd.config import CacheConfig, SchedulerConfig, WorkerConfig
from mlxd.worker import build as worker_build
from mlxd.worker import main as worker
from mlxd.worker.engine import Engine
from mlxd.worker.runners.base import check_model_supported
from mlxd.worker.sampling.tokenizer import PromptEncoder
from mlxd.worker.sched.scheduler import Scheduler


class _Counting:
    """The model, counting forwards and the tokens they take."""

    def __init__(self, model: Any) -> None:
        self.model, self.forwards, self.tokens = model, 0, 0

    def __call__(self, tokens: mx.array, cache: Any = None) -> mx.array:
        self.forwards += 1
        self.tokens += tokens.shape[0] * tokens.shape[1]
        return self.model(tokens, cache=cache)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def build(path: str, runner_kind: str, kv_gb: float) -> tuple[Engine, _Counting]:
    model, tokenizer = load(path)
    config = WorkerConfig(model=path, name="p", endpoint="ipc:///tmp/profile-hybrid",
                          cache=CacheConfig(kv_cache_gb=kv_gb),
                          scheduler=SchedulerConfig(max_num_seqs=64))  # fmt: skip
    eos = set(tokenizer.eos_token_ids)
    if runner_kind == "native":
        why = check_model_supported(model)
        runner, pool = worker_build._native_runner(model, eos, config, why), None
    else:
        runner, pool, _ = worker_build.build_runner(model, eos, config, 65536)
    scheduler = Scheduler(worker_build.scheduler_config(config, runner), pool=pool)
    runner.fit_scheduler(scheduler)
    encoder = PromptEncoder(tokenizer, vocab_size=worker._vocab_size(model, tokenizer))
    engine = Engine(
        name="p",
        runner=runner,
        scheduler=scheduler,
        encoder=encoder,
        channel=_Recorder(0.0, {}),
        max_context=65536,
    )  # type: ignore[arg-type]
    counting = _Counting(runner.model)
    runner.model = counting
    return engine, counting


def timed_steps(engine: Engine) -> list[tuple[float, str]]:
    """Wrap ``engine.step`` to record each step's wall time and what it ran."""
    log: list[tuple[float, str]] = []
    step, prefill = engine.step, engine.runner.prefill
    chunks: list[int] = []

    def counted(batch: list[Any]) -> Any:
        chunks.extend(c.end - c.start for c in batch)
        return prefill(batch)

    def timed() -> Any:
        rows = len(engine.runner.rows)
        chunks.clear()
        t0 = time.perf_counter()
        out = step()
        log.append(((time.perf_counter() - t0) * 1e3, f"chunks {chunks} rows {rows}"))
        return out

    engine.step = timed  # type: ignore[method-assign]
    engine.runner.prefill = counted  # type: ignore[method-assign]
    return log


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--runner", default="hybrid", choices=["hybrid", "native"])
    ap.add_argument("--prefix", type=int, default=4000)
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--kv-cache-gb", type=float, default=16.0)
    args = ap.parse_args()
    engine, counting = build(args.model, args.runner, args.kv_cache_gb)
    print(args.runner, type(engine.runner).__name__, engine.runner.kv_description)
    rng = random.Random(0)
    top = min(20000, engine.encoder.vocab_size - 1)
    for n in [int(s) for s in args.streams.split(",")]:
        system = [rng.randrange(10, top) for _ in range(args.prefix)]
        prompts = [system + [rng.randrange(10, top) for _ in range(128)] for _ in range(n)]
        for label in ("cold", "hit", "distinct"):
            if label == "distinct":  # each its own system prompt, as `bench run`'s cold group
                prompts = [[rng.randrange(10, top) for _ in range(args.prefix + 128)]
                           for _ in range(n)]  # fmt: skip
            log = timed_steps(engine)
            f0, t0 = counting.forwards, counting.tokens
            res = engine_level(engine, prompts, 16)
            del engine.step, engine.runner.prefill  # the class's own again
            slow = sorted(log, reverse=True)[:6]
            print(f"{label} x{n}: wall {res['wall_s']:.2f} s, TTFT p50 {res['ttft_p50_ms']:.0f} "
                  f"ms, forwards {counting.forwards - f0}, tokens {counting.tokens - t0}, "
                  f"steps {len(log)}, step ms sum {sum(t for t, _ in log):.0f}")  # fmt: skip
            for t, what in slow:
                print(f"   {t:8.1f} ms  {what}")
            prompts = [system + [rng.randrange(10, top) for _ in range(128)] for _ in range(n)]


if __name__ == "__main__":
    main()
