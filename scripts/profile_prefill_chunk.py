"""A long prompt's time to first token under each ``--prefill-chunk``, in-process.

    python scripts/profile_prefill_chunk.py MODEL_DIR [PROMPT=2128] [CHUNKS=1024,2048] [REPEATS=5]

One paged engine per chunk size; each prompt of ``PROMPT`` tokens shares nothing with earlier
ones (no prefix hit), first token only. The engines alternate, ``REPEATS`` rounds after one
unmeasured prompt each, so a slow phase of the machine hits all of them. A step prefills at most
one chunk, so a chunk is also the longest a prompt stalls running streams for (its forward's
time: ``scripts/profile_forward.py MODEL_DIR 1024,2048``). One JSON line per chunk size (TTFT
median and all runs, ms).
"""

from __future__ import annotations

import json
import random
import statistics
import sys

from mlxd.bench.engine import engine_level, load_served, new_engine
from mlxd.config import SchedulerConfig


def main() -> None:
    args = sys.argv[2:] + ["2128", "1024,2048", "5"][len(sys.argv) - 2 :]
    prompt, chunks, repeats = int(args[0]), [int(c) for c in args[1].split(",")], int(args[2])
    model, tok = load_served(sys.argv[1])
    rng = random.Random(0)

    def ttft(engine: object) -> float:
        p = [rng.randrange(10, 1000) for _ in range(prompt)]
        return float(engine_level(engine, [p], 1)["ttft_p50_ms"])

    engines = {c: new_engine(model, tok, SchedulerConfig(max_num_seqs=8, prefill_chunk=c),
                             prompt + 8) for c in chunks}  # fmt: skip
    runs: dict[int, list[float]] = {c: [] for c in chunks}
    for engine in engines.values():
        ttft(engine)  # kernel compiles of these shapes land in no measured run
    for _ in range(repeats):
        for c, engine in engines.items():
            runs[c].append(round(ttft(engine), 2))
    for c in chunks:
        row = {"prompt": prompt, "prefill_chunk": c,
               "ttft_p50_ms": round(statistics.median(runs[c]), 2), "all_ms": runs[c]}  # fmt: skip
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
