"""One row's decode step in-process, measured so two trees compare on a loaded machine: the
step's wall time, the engine thread's own CPU time (host work, not waits), the Python calls
and the MLX graph nodes a step builds.

    PYTHONPATH=<tree> python bench/decode_host.py MODEL_DIR [--tokens 200] [--levels 3]

Runs ``--levels`` requests one after another (a 128-token prompt, ``--tokens`` greedy, eos
ignored) on the engine ``mlxd bench engine`` builds, after one throwaway request, and prints
one JSON line: the median over steps of each level's wall and thread-CPU milliseconds, then
(deterministic, so one run says it) Python calls per step under cProfile and the graph of one
decode step (``mx.export_to_dot``: its node count and operations). Alternate trees run after
run (``PYTHONPATH=/tmp/old`` from ``git worktree add --detach /tmp/old <commit>``, then this
tree): wall and CPU times are noisy where other jobs share the cores, calls and the graph are
not. Trees older than ``bench/engine``'s worker-like vocabulary size (a hybrid's lives in its
text config) get it from ``config.json`` here. Used to look for a one-stream regression of the
window and hybrid runners (docs/PERFORMANCE.md, run M1): on the CPU, none.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

import mlxd
from mlxd.bench.engine import load_served, new_engine
from mlxd.config import SchedulerConfig
from mlxd.protocol.messages import Generate, SamplingParams, TokenPrompt

PROMPT_TOKENS = 128
GRAPH_STEP = 40  # the decode step whose graph is drawn (any past the first few)


class _Sink:
    """The engine's channel: tokens go nowhere."""

    def send(self, client: bytes, msg: Any) -> None:
        pass

    def recv_ready(self, timeout_ms: int) -> list[Any]:
        return []


def build(path: str, tokens: int) -> Any:
    """The engine on ``path``'s model, for one row of ``tokens``."""
    model, tokenizer = load_served(path)
    if not hasattr(model.args, "vocab_size"):  # an older tree reads it here
        config = json.loads((Path(path) / "config.json").read_text())
        vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
        model.args.vocab_size = vocab
    sched = SchedulerConfig(max_num_seqs=8)
    engine = new_engine(model, tokenizer, sched, max_context=PROMPT_TOKENS + tokens + 64)
    engine.channel = _Sink()
    return engine


def submit(engine: Any, request_id: str, tokens: int) -> None:
    rng = random.Random(0)
    prompt = [rng.randrange(100, 8000) for _ in range(PROMPT_TOKENS)]
    sampling = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    prompt_ = TokenPrompt(token_ids=prompt)
    engine.dispatch(b"b", Generate(request_id=request_id, prompt=prompt_, sampling=sampling))


def level(engine: Any, request_id: str, tokens: int) -> tuple[float, float, int]:
    """One request to its end: median wall and thread-CPU ms a step, and the steps."""
    submit(engine, request_id, tokens)
    wall, cpu = [], []
    while engine.scheduler.has_work():
        t, c = time.perf_counter(), time.thread_time()
        engine.step()
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - t)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3, len(wall)


def calls_per_step(engine: Any, tokens: int) -> float:
    """Python function calls a step makes (cProfile's count; the same on every run)."""
    prof = cProfile.Profile()
    prof.enable()
    steps = level(engine, "calls", tokens)[2]
    prof.disable()
    prof.create_stats()
    return sum(v[1] for v in prof.stats.values()) / steps  # type: ignore[attr-defined]


def graph(engine: Any, tokens: int) -> collections.Counter[str]:
    """The operations of decode step ``GRAPH_STEP``'s graph (what ``async_eval`` launches)."""
    real, steps = mx.async_eval, [0]
    out = Path(tempfile.mkdtemp()) / "step.dot"

    def traced(*arrays: Any) -> Any:
        if steps[0] == GRAPH_STEP and not out.exists():
            mx.export_to_dot(str(out), *[a for a in arrays if isinstance(a, mx.array)])
        return real(*arrays)

    step = engine.step

    def counted() -> None:
        steps[0] += 1
        step()

    mx.async_eval, engine.step = traced, counted
    try:
        submit(engine, "graph", tokens)
        while engine.scheduler.has_work():
            engine.step()
    finally:
        mx.async_eval, engine.step = real, step
    return collections.Counter(re.findall(r'label ="(\w+)"', out.read_text()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--levels", type=int, default=3)
    args = ap.parse_args()
    engine = build(args.model, args.tokens)
    level(engine, "warm", 32)
    runs = [level(engine, f"r{i}", args.tokens) for i in range(args.levels)]
    ops = graph(engine, max(args.tokens, GRAPH_STEP + 8))
    result = {
        "tree": str(Path(mlxd.__file__).parent.parent),
        "model": args.model,
        "runner": type(engine.runner).__name__,
        "step_ms": [round(r[0], 3) for r in runs],
        "thread_cpu_ms": [round(r[1], 3) for r in runs],
        "calls_per_step": round(calls_per_step(engine, args.tokens), 1),
        "graph_nodes": sum(ops.values()),
        "graph_ops": dict(sorted(ops.items())),
    }
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
