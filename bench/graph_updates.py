"""Whether MLX's CUDA graphs pay at a batch size: a stack of MLP layers (Qwen3-0.6B's by
default) stepped at 1, 16 and 64 rows in-process, in processes with ``MLX_USE_CUDA_GRAPHS`` on
and off, alternated.

    python bench/graph_updates.py [--rows 1,16,64] [--bits 4] [--rounds 3] [--json FILE]

Why (issue 41, run GS1): a dense bf16 model served with graphs stepped its one stream faster
(159 against 124 tok/s) and its 16 and 64 streams slower (0.83x, 0.70x) than without. MLX 0.32
keeps one executable graph per graph shape and updates it in place (``cudaGraphExecUpdate``)
step after step, but a kernel launched with a thread-block cluster of more than one block in y
or z makes its graph non-updatable, and MLX instantiates such a graph afresh at every commit
(``CommandEncoder::commit``, ml-explore/mlx#2813). cuBLAS picks Hopper kernels with clusters
for some matrix shapes; MLX's own quantized kernels have none. If the cost is that, a bf16
stack loses its graphs' advantage from some row count on and a 4-bit stack (``--bits 4``) keeps
it (run CM1, one H200: from 16 rows graphs cost bf16 1.47-1.55x, 4 bits 1.09-1.12x). Each
step is timed to its result (``mx.eval``), so the host's graph work shows in full.
On the CPU backend there are no graphs: both columns are the same work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

GRAPHS = "MLX_USE_CUDA_GRAPHS"


def main() -> None:
    args = _parser().parse_args()
    if args.child:
        _child(args)
        return
    results: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for leg in ("on", "off") if r % 2 == 0 else ("off", "on"):
            results[leg].append(_run_child(args, leg))
            print(f"round {r + 1} graphs {leg}: {results[leg][-1]}", flush=True)
    table = _table(results)
    for line in table:
        print(line)
    if args.json:
        report = {"args": {k: v for k, v in vars(args).items() if k != "child"}, **results}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,16,64", help="batch sizes, comma-separated")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--bits", type=int, default=0, help="quantize the weights (0: no)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default="")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


def _run_child(args: argparse.Namespace, leg: str) -> dict[str, float]:
    """One process with graphs ``leg``: each row count's step p50 in ms."""
    argv = [sys.executable, __file__, "--child", *_forwarded(args)]
    env = os.environ | {GRAPHS: "1" if leg == "on" else "0"}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _forwarded(args: argparse.Namespace) -> list[str]:
    names = ("rows", "hidden", "ffn", "layers", "dtype", "bits", "steps")
    return [f"--{n}={getattr(args, n)}" for n in names]


def _child(args: argparse.Namespace) -> None:
    import mlx.core as mx

    layers = [_layer(mx, args) for _ in range(args.layers)]
    dtype = getattr(mx, args.dtype)
    out: dict[str, float] = {}
    for rows in (int(r) for r in args.rows.split(",")):
        x = (mx.random.normal((rows, args.hidden)) * 0.1).astype(dtype)
        out[str(rows)] = _step_p50(mx, lambda x=x: _stack(mx, layers, x, args.bits), args.steps)
    print(json.dumps(out))


def _layer(mx: Any, args: argparse.Namespace) -> list[Any]:
    """One layer's weights: gate and up as one (2 * ffn, hidden), down (hidden, ffn)."""
    dtype = getattr(mx, args.dtype)
    weights = [
        mx.random.normal(s) * 0.02 for s in ((2 * args.ffn, args.hidden), (args.hidden, args.ffn))
    ]
    weights = [w.astype(dtype) for w in weights]
    if args.bits:
        return [mx.quantize(w, group_size=64, bits=args.bits) for w in weights]
    mx.eval(weights)
    return weights


def _matmul(mx: Any, x: Any, w: Any, bits: int) -> Any:
    if bits:
        return mx.quantized_matmul(x, *w, transpose=True, group_size=64, bits=bits)
    return x @ w.T


def _stack(mx: Any, layers: list[Any], x: Any, bits: int) -> Any:
    for gate_up, down in layers:
        gate, up = mx.split(_matmul(mx, x, gate_up, bits), 2, axis=-1)
        x = x + _matmul(mx, gate * mx.sigmoid(gate) * up, down, bits)
    return x


def _step_p50(mx: Any, step: Any, steps: int) -> float:
    """The median ms of ``steps`` steps, each evaluated, after a tenth as many untimed."""
    for _ in range(max(3, steps // 10)):
        mx.eval(step())
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        mx.eval(step())
        times.append((time.perf_counter() - start) * 1e3)
    return round(statistics.median(times), 3)


def _table(results: dict[str, list[dict[str, float]]]) -> list[str]:
    """Per row count: the median step with graphs on and off over the rounds, and on / off."""
    lines = ["rows  graphs on ms  graphs off ms  on / off"]
    for rows in results["on"][0]:
        on = statistics.median(r[rows] for r in results["on"])
        off = statistics.median(r[rows] for r in results["off"])
        lines.append(f"{rows:>4}  {on:12.3f}  {off:13.3f}  {on / off:8.2f}x")
    return lines


if __name__ == "__main__":
    main()
