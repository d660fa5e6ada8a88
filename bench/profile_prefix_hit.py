"""Where a prefix hit's time to first token goes, in-process (no HTTP, no ZeroMQ).

    python bench/profile_prefix_hit.py MODEL_DIR [PREFIX=2000] [SUFFIXES=128,16] [REPEATS=5]

One request at a time through the paged engine, first token only, each kind ``REPEATS`` times
after one unmeasured request of the same shape (so kernel compiles land in none):

- ``cold``: a prefix of its own plus the suffix: the whole prompt is prefilled;
- ``hit``: the primed shared prefix plus a suffix of its own: only the suffix is prefilled;
- ``plain``: the suffix alone, no prefix: the floor of a hit (same new tokens, no context).

A hit far above ``plain`` spends its time on the cached context (the gather of its blocks,
attention over them) or around the forward. Prints one JSON line per kind and suffix (median
and all TTFTs in ms) and a summary line with the cold / hit ratio per suffix.
"""

from __future__ import annotations

import json
import random
import statistics
import sys

from mlxd.bench.engine import engine_level, load_served, new_engine
from mlxd.config import SchedulerConfig


def ttft(engine: object, prompt: list[int]) -> float:
    return float(engine_level(engine, [prompt], 1)["ttft_p50_ms"])


def main() -> None:
    path = sys.argv[1]
    args = sys.argv[2:] + ["2000", "128,16", "5"][len(sys.argv) - 2 :]
    prefix_len, suffixes, repeats = int(args[0]), [int(s) for s in args[1].split(",")], int(args[2])
    model, tok = load_served(path)
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 1000) for _ in range(n)]

    engine = new_engine(
        model, tok, SchedulerConfig(max_num_seqs=8, max_queued=64), prefix_len + max(suffixes) + 64
    )
    shared = ids(prefix_len)
    summary: dict[str, float] = {"prefix_tokens": prefix_len}
    for suffix in suffixes:
        kinds = {
            "cold": lambda s=suffix: ids(prefix_len) + ids(s),
            "hit": lambda s=suffix: shared + ids(s),
            "plain": lambda s=suffix: ids(s),
        }
        medians = {}
        for kind, make in kinds.items():
            ttft(engine, make())  # this shape once, unmeasured (and the shared prefix cached)
            times = [ttft(engine, make()) for _ in range(repeats)]
            medians[kind] = statistics.median(times)
            row = {"suffix": suffix, "kind": kind, "ttft_p50_ms": round(medians[kind], 2)}
            print(json.dumps(row | {"all_ms": [round(t, 2) for t in times]}), flush=True)
        summary[f"cold_over_hit_{suffix}"] = round(medians["cold"] / medians["hit"], 2)
        summary[f"hit_over_plain_{suffix}"] = round(medians["hit"] / medians["plain"], 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
