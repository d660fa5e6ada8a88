"""Time a model's forward at given shapes, each the first time and again: a first call far
slower than the next one at the same shape is a one-time kernel compile; one slow at every new
shape is a compile per shape (a cost every new prompt length would pay in serving).

    python scripts/profile_first_calls.py MODEL_DIR BxL [BxL ...]

Each ``BxL`` is a prefill of B rows of L tokens into a fresh cache, followed by one decode step
of those B rows. One JSON line per call, printed as it ends (a timeout keeps what finished).
"""

from __future__ import annotations

import json
import sys
import time

import mlx.core as mx
import mlx_lm
from mlx_lm.models.cache import make_prompt_cache


def timed(fn: object) -> float:
    start = time.perf_counter()
    mx.eval(fn())  # type: ignore[operator]
    return (time.perf_counter() - start) * 1000


def main() -> None:
    model = mlx_lm.load(sys.argv[1])[0]
    for shape in sys.argv[2:]:
        b, n = (int(x) for x in shape.split("x"))
        tokens = mx.random.randint(10, 1000, (b, n))
        cache = make_prompt_cache(model)
        prefill_ms = timed(lambda t=tokens, c=cache: model(t, cache=c)[:, -1, :])
        decode_ms = timed(lambda t=tokens, c=cache: model(t[:, :1], cache=c)[:, -1, :])
        print(json.dumps({"shape": shape, "prefill_ms": round(prefill_ms, 1),
                          "decode_ms": round(decode_ms, 1)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
