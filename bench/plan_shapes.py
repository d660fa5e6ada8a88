"""Which attention shapes a worker's first requests need that its warm-up did not build.

On CUDA, MLX builds a cuDNN plan for every new (rows, queries, keys) of a multi-query attention
call (``worker.kv.attention_shapes``): 45-1,060 ms each on an H200 (docs/PERFORMANCE.md, run
V4). This runs, on any backend with the CUDA padding forced on, the engine a worker builds
(``mlxd.bench.engine.new_engine``), its warm-up (``worker.warmup``), then a first long prompt
and a burst of 16 chat prompts split as requests arrive, and prints each one's attention shapes
that nothing before it had:

    python bench/plan_shapes.py MODEL [--long 4500] [--prompt 128] [--split 4,12 3,13]

It measures no time: a shape listed as new is a plan a GPU would build at that request.
"""

from __future__ import annotations

import argparse
from typing import Any

import mlx.core as mx

from mlxd.worker.kv import attention_shapes

Shape = tuple[int, int, int, str]  # rows, queries, keys, mask kind


def record_shapes(seen: set[Shape]) -> None:
    """Route attention through a recorder of multi-query shapes, padded as on CUDA."""
    exact = mx.fast.scaled_dot_product_attention

    def attend(q: mx.array, k: mx.array, v: mx.array, *args: Any, **kw: Any) -> mx.array:
        mask = kw.get("mask")
        if q.shape[-2] > 1:
            kind = "array" if isinstance(mask, mx.array) else str(mask)
            seen.add((q.shape[0], q.shape[-2], k.shape[-2], kind))
        return exact(q, k, v, *args, **kw)

    attention_shapes.PLANNED = attention_shapes.BUCKETED = True  # before the runners import it
    mx.fast.scaled_dot_product_attention = attend
    attention_shapes.install()


def build_engine(model_path: str, max_num_seqs: int, max_context: int) -> Any:
    """The engine a worker builds, on the model as a worker loads it, its output sent nowhere."""
    from mlxd.bench.engine import load_served, new_engine
    from mlxd.config import SchedulerConfig
    from mlxd.worker import warmup

    model, tokenizer = load_served(model_path)
    engine = new_engine(model, tokenizer, SchedulerConfig(max_num_seqs=max_num_seqs), max_context)
    engine.channel = warmup._Sink()
    return engine


def run(engine: Any, prompts: list[list[int]], waves: list[int]) -> None:
    """``prompts`` arriving in ``waves`` (one engine step apart), run to the end."""
    from mlxd.protocol.messages import Generate, SamplingParams, TokenPrompt

    sent = 0
    for wave in waves:
        for prompt in prompts[sent : sent + wave]:
            sampling = SamplingParams(max_tokens=4, ignore_eos=True)
            ids = TokenPrompt(token_ids=prompt)
            engine.dispatch(
                b"bench", Generate(request_id=f"r{sent}", prompt=ids, sampling=sampling)
            )
            sent += 1
        engine.step()
    while engine.scheduler.has_work():
        engine.step()


def cases(args: argparse.Namespace, vocab: int) -> list[tuple[str, list[list[int]], list[int]]]:
    """Each case: its name, its prompts, how they arrive."""
    from mlxd.bench.workload import make_prompts

    out = [(f"a first {args.long}-token prompt", make_prompts(1, args.long, vocab, 901), [1])]
    for i, split in enumerate(args.split):
        waves = [int(w) for w in split.split(",")]
        prompts = make_prompts(sum(waves), args.prompt, vocab, 300 + i)
        out.append((f"{sum(waves)} x {args.prompt} tokens arriving as {split}", prompts, waves))
    return out


def main() -> None:
    args = _parse_args()
    seen: set[Shape] = set()
    record_shapes(seen)
    from mlxd.worker import warmup

    engine = build_engine(args.model, args.max_num_seqs, args.max_context)
    warmup.warm_up(engine, 1e9)
    built = set(seen)
    print(f"warm-up built {len(built)}: {sorted(built)}")
    for name, prompts, waves in cases(args, engine.encoder.vocab_size):
        seen.clear()
        run(engine, prompts, waves)
        print(f"{name}: new {sorted(seen - built)} of {len(seen)}")
        built |= seen


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--long", type=int, default=4500, help="the first long prompt's tokens")
    p.add_argument("--prompt", type=int, default=128, help="each burst prompt's tokens")
    p.add_argument("--split", nargs="*", default=["4,12", "3,13"], help="bursts as they arrive")
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-context", type=int, default=8192)
    return p.parse_args()


if __name__ == "__main__":
    main()
