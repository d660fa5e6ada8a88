"""KV memory one live sequence of a sliding-window model holds, in-process: the paged runner
(full layers' blocks and the window layers' slabs it still holds: ``runners.window``) against
the model's own caches (``native``: ``RotatingKVCache`` for the window layers), and what every
layer's blocks would take.

    python bench/window_memory.py MODEL_DIR [--tokens 8192] [--max-tokens 32]

Each step of one request is sampled; printed: the most bytes the sequence held, and what it
held at its last step.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from mlx_lm.utils import load

from mlxd.bench.engine import _Recorder, engine_level
from mlxd.config import CacheConfig, SchedulerConfig, WorkerConfig
from mlxd.worker import build as worker_build
from mlxd.worker import main as worker
from mlxd.worker.engine import Engine
from mlxd.worker.kv.paged_cache import KVPool
from mlxd.worker.runners.paged import check_model_supported
from mlxd.worker.sampling.tokenizer import PromptEncoder


def build(path: str, runner_kind: str, kv_gb: float) -> Engine:
    """The engine as the worker builds it: ``native`` (the model's own caches) or the paged
    runner the worker picks (was ``profile_hybrid.build``, removed at 6e4ae59)."""
    model, tokenizer = load(path)
    config = WorkerConfig(
        model=path,
        name="p",
        endpoint="ipc:///tmp/window-memory",
        cache=CacheConfig(kv_cache_gb=kv_gb),
        scheduler=SchedulerConfig(max_num_seqs=64),
    )
    eos = set(tokenizer.eos_token_ids)
    if runner_kind == "native":
        why = check_model_supported(model)
        runner, pool = worker_build._native_runner(model, eos, config, why), None
    else:
        runner, pool, _ = worker_build.build_runner(model, eos, config, 65536)
    encoder = PromptEncoder(tokenizer, vocab_size=worker._vocab_size(model, tokenizer))
    channel = _Recorder(0.0, {})
    return worker_build.build_engine(
        config, runner, pool, model=model, encoder=encoder, channel=channel, max_context=65536
    )


def live_bytes(engine: Engine) -> int:
    """The KV the sequences in flight hold (not the prefix cache's)."""
    s = engine.scheduler
    if s.windows is None or s.pool is None:
        return engine.runner.kv_bytes
    seqs = s.prefilling + s.running
    blocks = len({b for q in seqs for b in q.block_ids})
    slabs = len({i for q in seqs for i in q.window_ids if i >= 0})
    return blocks * s.pool.cost + slabs * s.windows.pool.cost


def measure(engine: Engine, prompt: list[int], max_tokens: int) -> tuple[int, int]:
    samples: list[int] = []
    step = engine.step

    def sampled() -> Any:
        out = step()
        samples.append(live_bytes(engine))
        return out

    engine.step = sampled  # type: ignore[method-assign]
    engine_level(engine, [prompt], max_tokens)
    nonzero = [b for b in samples if b]
    return max(nonzero), nonzero[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    rng = random.Random(0)
    prompt: list[int] = []
    for native in (False, True):
        engine = build(args.model, "native" if native else "hybrid", 16.0)
        top = min(20000, engine.encoder.vocab_size - 1)
        prompt = prompt or [rng.randrange(10, top) for _ in range(args.tokens)]
        peak, last = measure(engine, prompt, args.max_tokens)
        name = type(engine.runner).__name__
        print(
            f"{name}: {args.tokens}+{args.max_tokens} tokens: peak {peak / 2**20:.1f} MiB, "
            f"last step {last / 2**20:.1f} MiB"
        )
    model = engine.runner.model
    every = sum(KVPool.bytes_per_token(model, windows=w) for w in (False, True))
    print(f"every layer's K/V: {every * (args.tokens + args.max_tokens) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
