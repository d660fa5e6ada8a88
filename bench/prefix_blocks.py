"""32 concurrent requests sharing a 2,000-token system prompt hold it once (not a test).

    python bench/prefix_blocks.py MODEL_DIR [REQUESTS=32] [PREFIX=2000] [SUFFIX=40] [OUTPUT=64]

Runs the engine in-process on the paged cache (32-token blocks): the prefix once (so it is
cached), then REQUESTS requests of prefix + a suffix of their own, all at once. Prints one JSON
line: the most KV blocks in use at any step, the bound ``prefix blocks + REQUESTS x own blocks
+ REQUESTS`` (issue 4) and what the requests would hold without sharing. Block accounting does
not depend on the backend or the model's size.
"""

from __future__ import annotations

import json
import random
import sys

from mlxd.bench.engine import engine_level, load_served, new_engine
from mlxd.config import SchedulerConfig
from mlxd.protocol.messages import Generate, SamplingParams, TokenPrompt

BLOCK = 32


class _Sink:
    """The engine's channel: the tokens themselves are not needed here."""

    def send(self, client: bytes, msg: object) -> None:
        pass


def main() -> None:
    path = sys.argv[1]
    n, prefix_len, suffix_len, out = (
        int(x) for x in (sys.argv[2:] + ["32", "2000", "40", "64"][len(sys.argv) - 2 :])
    )
    model, tok = load_served(path)
    rng = random.Random(0)
    prefix = [rng.randrange(10, 1000) for _ in range(prefix_len)]
    total = prefix_len + suffix_len + out
    eng = new_engine(
        model, tok, SchedulerConfig(max_num_seqs=n, max_queued=4 * n), total + 8, block_size=BLOCK
    )
    engine_level(eng, [prefix + [7]], 2)  # the system prompt, once: now in the prefix cache
    eng.channel = _Sink()
    sampling = SamplingParams(max_tokens=out, temperature=0.0, ignore_eos=True)
    for i in range(n):
        ids = prefix + [rng.randrange(10, 1000) for _ in range(suffix_len)]
        eng.dispatch(
            b"b", Generate(request_id=f"r{i}", prompt=TokenPrompt(token_ids=ids), sampling=sampling)
        )
    peak, peak_running = 0, 0
    while eng.scheduler.has_work():
        eng.step()
        used = eng.scheduler.kv_report().blocks_used
        if used > peak:
            peak, peak_running = used, len(eng.scheduler.running)
    report = eng.scheduler.kv_report()
    prefix_blocks = prefix_len // BLOCK  # full blocks are shared; the partial one is not
    own = -(-total // BLOCK) - prefix_blocks
    print(
        json.dumps(
            {
                "requests": n,
                "prefix_tokens": prefix_len,
                "suffix_tokens": suffix_len,
                "output_tokens": out,
                "block_size": BLOCK,
                "peak_blocks_used": peak,
                "running_at_peak": peak_running,
                "bound": prefix_blocks + n * own + n,
                "without_sharing": n * -(-total // BLOCK),
                "prefix_hits": report.hits,
                "hit_tokens": report.hit_tokens,
            }
        )
    )


if __name__ == "__main__":
    main()
