"""The engine with the paged KV cache vs the same engine with the contiguous one, in-process.

    python bench/bench_paged.py MODEL_DIR [CONCURRENCY=64] [PROMPT=128] [OUTPUT=128] [BLOCK=32]

Three engines: contiguous, paged (decode reads a view of the batch) and gathered (paged, no view
budget: decode gathers the pool's blocks every step). Prints one JSON line: output tok/s and
inter-token p50 (the decode step) of each, and their ratios. A prefix hit's time to first
token: bench/profile_prefix_hit.py.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

from mlxd.bench.engine import engine_level, load_served, new_engine
from mlxd.config import SchedulerConfig


def main() -> None:
    path = sys.argv[1]
    defaults = ["64", "128", "128", "32"]
    n, plen, out, block = (int(x) for x in sys.argv[2:] + defaults[len(sys.argv) - 2 :])
    model, tok = load_served(path)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 1000) for _ in range(plen)] for _ in range(n)]
    result: dict[str, Any] = {"concurrency": n, "prompt": plen, "output": out, "block": block}
    # paged: decode reads its view of the batch; gathered: the pool's blocks every step
    variants = (("contiguous", False, None), ("paged", True, None), ("gathered", True, 0))
    for name, paged, view in variants:
        config = SchedulerConfig(max_num_seqs=n, max_queued=4 * n)
        eng = new_engine(model, tok, config, plen + out + 8, paged, block, view)
        engine_level(eng, prompts[: min(n, 4)], 8)  # warm-up: kernels compile once
        s = engine_level(eng, [[t + 1 for t in p] for p in prompts], out)
        result[f"{name}_tok_s"], result[f"{name}_itl_p50_ms"] = s["output_tok_s"], s["itl_p50_ms"]
    result["paged_vs_contiguous_tok_s"] = result["paged_tok_s"] / result["contiguous_tok_s"]
    result["paged_vs_contiguous_itl"] = result["contiguous_itl_p50_ms"] / result["paged_itl_p50_ms"]
    result["gathered_vs_contiguous_tok_s"] = result["gathered_tok_s"] / result["contiguous_tok_s"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
