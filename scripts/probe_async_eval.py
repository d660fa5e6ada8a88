"""Where a step's host time goes on the GPU (issue #20): ``scripts/spec_trace.py`` with
``mx.async_eval`` and ``array.tolist``-free timing of each ``mx.async_eval`` call by caller (its
encoding of the graph into kernels is host work, done before it returns), then the same
summary as spec_trace. Same arguments as spec_trace.

    python scripts/probe_async_eval.py --model DIR --scenario edit --streams 1 --modes off,forced
"""

from __future__ import annotations

import collections
import os
import sys
import time

from mlxd.worker import blas

blas.preload(os.environ)

import mlx.core as mx  # noqa: E402

_real = mx.async_eval
_spent: dict[str, list[float]] = collections.defaultdict(list)


def _timed(*args: object) -> None:
    caller = sys._getframe(1).f_code.co_name
    t = time.perf_counter()
    _real(*args)
    _spent[caller].append(time.perf_counter() - t)


mx.async_eval = _timed  # type: ignore[assignment]

sys.path.insert(0, os.path.dirname(__file__))
import spec_trace  # noqa: E402

spec_trace.main()
for caller, times in sorted(_spent.items()):
    times.sort()
    print(
        f"async_eval from {caller:14s} calls {len(times):5d}  median "
        f"{1000 * times[len(times) // 2]:.2f} ms  mean {1000 * sum(times) / len(times):.2f} ms"
    )
