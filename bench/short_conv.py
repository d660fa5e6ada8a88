"""A recurrent layer's depthwise short convolution as MLX's ``conv1d`` and as shifted
multiply-adds (``runners.short_conv``): their largest difference, and each one's time at new
lengths (the first call at a length never seen) and at a length seen before.

    python bench/short_conv.py [--channels 6144] [--taps 4] [--dtype bfloat16] [--repeat 10] \\
        [--cases 1x1,16x1,64x1,1x407,1x2051,1x4500]

On CUDA the convolution builds a cuDNN graph for every new input shape; the multiply-adds are
one fused kernel whatever the shape. Defaults: Qwen3.5-0.8B's conv (6,144 channels, 4 taps).
Each case is ROWSxLENGTH (new tokens a row: 1 is a decode step). Prints one JSON line per case:
max |difference|, first-call and repeat ms of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mlxd.worker.runners.short_conv import as_taps  # noqa: E402


def timed(fn: Callable[[mx.array], mx.array], x: mx.array, repeat: int) -> tuple[float, float]:
    """``fn(x)``: the first call's ms and the median of ``repeat`` more."""
    t = time.perf_counter()
    mx.eval(fn(x))
    first = 1e3 * (time.perf_counter() - t)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        mx.eval(fn(x))
        times.append(1e3 * (time.perf_counter() - t))
    return round(first, 3), round(statistics.median(times), 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--channels", type=int, default=6144)
    p.add_argument("--taps", type=int, default=4)
    p.add_argument("--cases", default="1x1,16x1,64x1,1x407,1x2051,1x4500")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--repeat", type=int, default=10)
    args = p.parse_args()
    dtype = getattr(mx, args.dtype)
    conv = nn.Conv1d(args.channels, args.channels, args.taps, groups=args.channels, bias=False)
    conv.set_dtype(dtype)
    taps = nn.Conv1d(args.channels, args.channels, args.taps, groups=args.channels, bias=False)
    taps.update(conv.parameters())
    as_taps(taps)
    for case in args.cases.split(","):
        rows, length = map(int, case.split("x"))
        x = mx.random.normal((rows, length + args.taps - 1, args.channels)).astype(dtype)
        diff = mx.abs(conv(x).astype(mx.float32) - taps(x).astype(mx.float32)).max()
        line = {"rows": rows, "length": length, "max_diff": diff.item()}
        # each op's first call at this shape: the difference above ran both once already, so
        # time a shape one longer (on CUDA the convolution's graph for it is not yet built)
        x = mx.random.normal((rows, length + args.taps, args.channels)).astype(dtype)
        mx.eval(x)
        line["taps_first_ms"], line["taps_ms"] = timed(taps, x, args.repeat)
        line["conv_first_ms"], line["conv_ms"] = timed(conv, x, args.repeat)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
