"""Which decode steps are slow, and what else ran in them: one stream (or --rows) in-process,
every engine step timed, against mlx-lm's ``generate_step`` token by token on the same prompt.

    python bench/step_trace.py MODEL_DIR [--rows 1] [--max-tokens 256] [--rounds 2]

Per path: step p50/p95/p99 and the time above p50 that the slow steps (over 1.5x p50) add; for
mlxd each slow step's index and the events inside it (a decode-tail flush, a read view built or
grown, a garbage collection, a new block for a row), and the events' share of the time above
p50. A tail that mlx-lm's path lacks at the same step is mlxd's own (issue 41: one stream's
p95 inter-token latency on the sliding-window and MoE shapes was 2-3x its p50 on an H200,
against 1.4-1.5x for Rapid-MLX and vllm-mlx).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlxd.bench.engine import load_served, mlx_lm_single, new_engine
from mlxd.config import SchedulerConfig
from mlxd.protocol.messages import Generate, SamplingParams, TokenPrompt

SLOW = 1.5  # a step over this many times the p50 is slow


class Events:
    """Counts of named events since the last ``take``."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def take(self) -> Counter[str]:
        out, self.counts = self.counts, Counter()
        return out

    def wrap(self, owner: Any, name: str, label: str) -> None:
        """Count every call of ``owner.name`` as ``label``."""
        inner: Callable[..., Any] = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[label] += 1
            return inner(*args, **kwargs)

        setattr(owner, name, counted)


class Sink:
    """The engine's channel here: tokens go to no one (steps are what is timed)."""

    def send(self, client: bytes, msg: Any) -> None:
        pass

    def recv_ready(self, timeout_ms: int) -> list[Any]:
        return []


def instrument(events: Events) -> None:
    """Count the decode tail's flushes, views built and grown, block allocations, collections."""
    from mlxd.worker.kv import decode_tail
    from mlxd.worker.kv.block_pool import BlockPool

    events.wrap(decode_tail.DecodeTail, "flush", "flush")
    events.wrap(decode_tail.DecodeTail, "start", "view start")
    events.wrap(decode_tail, "_with_columns", "view columns")
    events.wrap(BlockPool, "allocate", "block alloc")
    gc.callbacks.append(lambda phase, info: events.counts.update({"gc": phase == "start"}))


def mlxd_steps(
    engine: Any, prompts: list[list[int]], max_tokens: int, events: Events
) -> list[tuple[float, Counter[str]]]:
    """Every step of ``prompts`` run together to ``max_tokens``: its time and events."""
    for i, p in enumerate(prompts):
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        engine.dispatch(
            b"trace",
            Generate(request_id=f"t{i}", prompt=TokenPrompt(token_ids=p), sampling=sampling),
        )
    steps: list[tuple[float, Counter[str]]] = []
    events.take()
    while engine.scheduler.has_work():
        t = time.perf_counter()
        engine.step()
        steps.append((time.perf_counter() - t, events.take()))
    return steps[1:]  # the first step is the prefill


def mlx_lm_steps(model: Any, prompt: list[int], max_tokens: int) -> list[float]:
    """Each token's time from mlx-lm's ``generate_step`` on ``prompt``."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    out, last = [], time.perf_counter()
    for n, _ in enumerate(generate_step(mx.array(prompt), model, max_tokens=max_tokens)):
        now = time.perf_counter()
        if n:
            out.append(now - last)
        last = now
    return out


def summary(times: list[float]) -> dict[str, float]:
    """Percentiles and mean in ms, and what the slow steps add above the median."""
    ms = sorted(t * 1000 for t in times)
    p50 = statistics.median(ms)
    q = statistics.quantiles(ms, n=100)
    above = sum(t - p50 for t in ms if t > SLOW * p50)
    return {
        "p50": p50,
        "p95": q[94],
        "p99": q[98],
        "mean": statistics.fmean(ms),
        "slow_extra_ms": above,
    }


def main() -> None:
    args = _parse_args()
    model, tokenizer = load_served(args.model)
    prompts = _prompts(args.rows, args.prompt_tokens, tokenizer.vocab_size)
    sched = SchedulerConfig(max_num_seqs=max(16, args.rows))
    engine = new_engine(model, tokenizer, sched, args.prompt_tokens + args.max_tokens + 64)
    engine.channel = Sink()
    events = Events()
    instrument(events)
    mlxd_steps(engine, prompts, 16, events)  # builds what the first steps need
    mlx_lm_single(model, prompts[0], 16)
    report: dict[str, Any] = {"model": args.model, "rows": args.rows, "rounds": []}
    for r in range(args.rounds):
        steps = mlxd_steps(engine, prompts, args.max_tokens, events)
        lm = summary(mlx_lm_steps(model, prompts[0], args.max_tokens)) if args.rows == 1 else {}
        report["rounds"].append(_round(r + 1, steps, lm))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    return ap.parse_args()


def _prompts(rows: int, length: int, vocab: int) -> list[list[int]]:
    """``rows`` prompts of ordinary token ids, different for each row."""
    return [[100 + (r * 7919 + j * 31) % (vocab - 200) for j in range(length)] for r in range(rows)]


def _round(number: int, steps: list[tuple[float, Counter[str]]], lm: dict[str, float]) -> dict:
    """One round's summary, slow steps and time above p50 by event, printed and returned."""
    s = summary([t for t, _ in steps])
    slow = [(i, t * 1000, dict(c)) for i, (t, c) in enumerate(steps) if t * 1000 > SLOW * s["p50"]]
    causes: Counter[str] = Counter()
    for _, t, c in slow:
        for k in c or {"(none)": 1}:
            causes[k] += t - s["p50"]
    print(f"round {number} mlxd  " + _line(s), "\n        mlx-lm " + _line(lm) if lm else "")
    print(f"  events in all steps: {dict(Counter(k for _, c in steps for k in c))}")
    print(
        f"  slow steps ({len(slow)}): "
        + ", ".join(f"#{i} {t:.1f}ms {c or ''}" for i, t, c in slow[:40])
    )
    print(
        "  time above p50 by event: "
        + ", ".join(f"{k} {v:.1f} ms" for k, v in causes.most_common())
    )
    return {"mlxd": s, "mlx_lm": lm, "slow": slow, "by_event": dict(causes)}


def _line(s: dict[str, float]) -> str:
    return (
        f"step p50 {s['p50']:.2f} p95 {s['p95']:.2f} p99 {s['p99']:.2f} mean {s['mean']:.2f} ms,"
        f" slow steps add {s['slow_extra_ms']:.1f} ms"
    )


if __name__ == "__main__":
    main()
