"""MLX's buffer cache filled by a long prompt, then one stream decoding: the engine's sweep of a
full cache (``worker/buffer_cache.py``) on and off, alternated (issue 41).

    python bench/cache_sweep.py MODEL_DIR [--cap-mb 8] [--long 2048] [--max-tokens 128] [--rounds 3]

Per round and variant, on one engine built under the cap: a long prompt (its chunk-sized
activations fill the cache), then a short one decoding ``--max-tokens``; its decode step p50 and
p95, and the cache's bytes after. ``off`` leaves the cache as MLX does (the sweep's tick does
nothing). On a GPU MLX allocates on the device for every buffer a full cache turns away (run MX6:
a MoE's one-row step 21.5 ms under a 1 GiB cap against 15 ms without); on the CPU a full cache
costs a ``malloc`` and a ``free`` per buffer.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

import mlx.core as mx

from mlxd.bench.engine import engine_level, load_served, new_engine
from mlxd.config import SchedulerConfig
from mlxd.worker import buffer_cache


def one(engine: object, long: list[int], short: list[int], tokens: int, sweep: bool) -> dict:
    engine.cache_sweep.since = engine.cache_sweep.min_steps  # type: ignore[attr-defined]
    if not sweep:
        engine.cache_sweep.tick = lambda: False  # type: ignore[attr-defined]
    mx.clear_cache()
    engine_level(engine, [long], 1)
    filled = mx.get_cache_memory()
    row = engine_level(engine, [short], tokens)
    return {
        "sweep": sweep,
        "cache_after_long_mb": round(filled / 2**20, 1),
        "step_p50_ms": row["step_p50_ms"],
        "itl_p95_ms": round(row["itl_p95_ms"], 2),
        "cache_after_mb": round(mx.get_cache_memory() / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--cap-mb", type=int, default=8)
    parser.add_argument("--long", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    limit = buffer_cache.cap(args.cap_mb * 2**20)
    model, tokenizer = load_served(args.model)
    rng = random.Random(0)
    vocab = min(tokenizer.vocab_size, 1000)
    out = []
    for r in range(args.rounds):
        for sweep in (True, False) if r % 2 == 0 else (False, True):
            sched = SchedulerConfig(max_num_seqs=1, max_queued=1, prefill_chunk=512)
            engine = new_engine(model, tokenizer, sched, max_context=args.long + 512)
            long = [rng.randrange(3, vocab) for _ in range(args.long)]
            short = [rng.randrange(3, vocab) for _ in range(32)]
            row = {"round": r + 1, **one(engine, long, short, args.max_tokens, sweep)}
            print(json.dumps(row), flush=True)
            out.append(row)
    for sweep in (True, False):
        steps = [o["step_p50_ms"] for o in out if o["sweep"] is sweep]
        name = "on" if sweep else "off"
        print(f"sweep {name}: step p50 median {statistics.median(steps):.2f} ms over {steps}")
    print(f"cache limit {limit / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
