"""What a draft model's proposals cost per step, by batch size: ``DraftModel.propose`` of ``k``
tokens for ``B`` rows of ``--prompt`` tokens each, after their prefill, each step appending the
first draft to every row (as a verification that keeps one token would).

    python bench/draft_cost.py MODEL [--rows 1,4,16] [--k 4] [--prompt 256] [--steps 20]

MODEL: a model directory or a GGUF file (converted as a worker converts it), used as its own
draft (the cost does not depend on what is accepted).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from mlxd.worker import blas

blas.preload(os.environ)  # as a worker does, before MLX loads

import mlx_lm  # noqa: E402

from mlxd.models import sources  # noqa: E402
from mlxd.protocol.messages import SamplingParams  # noqa: E402
from mlxd.worker import cpu_backend  # noqa: E402
from mlxd.worker.runners.served import for_serving  # noqa: E402
from mlxd.worker.sched.sequence import Sequence  # noqa: E402
from mlxd.worker.spec.draft_model import DraftModel  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    model = mlx_lm.load(sources.resolve(args.model))[0]
    cpu_backend.prepare(model, "auto")
    for_serving(model)
    vocab = int(model.args.vocab_size)
    for b in map(int, args.rows.split(",")):
        drafter = DraftModel(model, vocab, vocab, args.model)
        rows = [
            Sequence(
                request_id=str(i),
                client=b"",
                sampling=SamplingParams(),
                prompt_ids=[(17 * i + 31 * j) % 5000 + 100 for j in range(args.prompt)],
                max_tokens=10_000,
            )
            for i in range(b)
        ]
        times = []
        for step in range(args.steps + 1):
            start = time.perf_counter()
            drafts = drafter.propose(rows, [args.k] * b)
            if step:  # the first step prefills the rows
                times.append((time.perf_counter() - start) * 1e3)
            for seq, d in zip(rows, drafts, strict=True):
                seq.output_ids.append(d[0])
        ms = statistics.median(times)
        print(f"rows {b:3}: {ms:8.1f} ms per propose of {args.k} ({ms / b:.1f} ms per row)")


if __name__ == "__main__":
    main()
