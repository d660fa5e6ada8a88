"""Quantized paged KV (``--kv-bits``) against float KV, in-process, for one model directory:

- perplexity over a fixed text (the project's docs/ARCHITECTURE.md then docs/BATCHING.md, its
  first ``--tokens`` tokens) run through the paged pool in 256-token chunks, so every chunk but
  the first attends to K/V read back from the pool in that mode;
- decode tok/s at ``--streams`` concurrent requests through the engine (modes alternate, median
  of ``--reps``);
- how many ``--context``-token sequences fit a ``--budget-gb`` KV pool in each mode.

    python bench/kv_bits.py MODEL_DIR [--streams 16] [--output 64] [--reps 3] [--json F]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any

from mlxd.config import SchedulerConfig

MODES: dict[str, int | None] = {"float": None, "8-bit": 8, "4-bit": 4}
CHUNK = 256
DOCS = Path(__file__).resolve().parent.parent / "docs"


def perplexity(model: Any, tokens: list[int], bits: int | None) -> float:
    """exp(mean NLL) of ``tokens[1:]``, prefilled chunk by chunk through a pool in ``bits``."""
    import mlx.core as mx

    from mlxd.worker.kv.formats import KVFormat
    from mlxd.worker.kv.paged_cache import KVPool, PagedKVCache, PagedStep

    bs = 32
    blocks = -(-len(tokens) // bs)
    pool = KVPool.for_model(model, blocks + 1, bs, fmt=KVFormat(bits))
    table, nll = list(range(blocks)), 0.0
    for start in range(0, len(tokens) - 1, CHUNK):
        chunk = tokens[start : min(start + CHUNK, len(tokens) - 1)]
        step = PagedStep.build([table], [start], [len(chunk)], pool)
        logits = model(mx.array([chunk]), cache=PagedKVCache.for_step(pool, step))[0]
        targets = mx.array(tokens[start + 1 : start + 1 + len(chunk)])
        lp = logits.astype(mx.float32) - mx.logsumexp(
            logits.astype(mx.float32), axis=-1, keepdims=True
        )
        nll -= mx.take_along_axis(lp, targets[:, None], axis=1).sum().item()
        mx.eval(pool.keys, pool.values)
    return math.exp(nll / (len(tokens) - 1))


def decode_rates(path: str, streams: int, output: int, reps: int) -> dict[str, list[float]]:
    from mlxd.bench.engine import engine_level, load_served, new_engine
    from mlxd.bench.workload import make_prompts
    from mlxd.worker import cpu_backend

    model, tok = load_served(path)
    cpu_backend.prepare(model, "auto")
    runs: dict[str, list[float]] = {m: [] for m in MODES}
    for rep in range(reps):
        for mode, bits in MODES.items():
            sched = SchedulerConfig(max_num_seqs=streams, max_queued=streams, speculate="off")
            engine = new_engine(model, tok, sched, 128 + output + 8, kv_bits=bits)
            engine_level(engine, make_prompts(streams, 128, seed=1000 + rep), 8)  # warm-up
            row = engine_level(engine, make_prompts(streams, 128, seed=rep), output)
            runs[mode].append(float(row["output_tok_s"]))
    return runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--budget-gb", type=float, default=4.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    from mlxd.worker import blas

    blas.preload(os.environ)  # before MLX loads, as a worker does (else the reference BLAS)
    import mlx_lm

    from mlxd.worker import cpu_backend
    from mlxd.worker.kv.formats import KVFormat
    from mlxd.worker.kv.paged_cache import KVPool

    model, tok = mlx_lm.load(args.model)[:2]
    cpu_backend.prepare(model, "auto")
    text = (DOCS / "ARCHITECTURE.md").read_text() + (DOCS / "BATCHING.md").read_text()
    tokens = tok.encode(text)[: args.tokens]
    out: dict[str, Any] = {"tokens": len(tokens), "modes": {}}
    for mode, bits in MODES.items():
        per_token = KVPool.bytes_per_token(model, KVFormat(bits))
        out["modes"][mode] = {
            "perplexity": round(perplexity(model, tokens, bits), 4),
            "kv_bytes_per_token": per_token,
            "contexts_in_budget": int(args.budget_gb * 2**30 // (per_token * args.context)),
        }
        print(mode, out["modes"][mode], flush=True)
    if args.reps:
        runs = decode_rates(args.model, args.streams, args.output, args.reps)
        for mode, rates in runs.items():
            out["modes"][mode]["decode_tok_s"] = round(statistics.median(rates), 1)
            out["modes"][mode]["decode_runs"] = [round(r, 1) for r in rates]
    base = out["modes"]["float"]
    for row in out["modes"].values():
        row["ppl_delta_pct"] = round(100 * (row["perplexity"] / base["perplexity"] - 1), 3)
        row["contexts_x"] = round(row["contexts_in_budget"] / base["contexts_in_budget"], 2)
        if "decode_tok_s" in row:
            row["decode_x"] = round(row["decode_tok_s"] / base["decode_tok_s"], 3)
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
