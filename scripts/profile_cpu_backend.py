"""The CPU backend before and after issue 26: GEMM probe, and a request through the daemon.

    python scripts/profile_cpu_backend.py gemm
    python scripts/profile_cpu_backend.py qmm
    python scripts/profile_cpu_backend.py daemon MODEL_DIR [PROMPT_WORDS=120] [OUTPUT=32] [ROUNDS=3]

``gemm``: ``cpu_backend.probe_gemm`` in a fresh process per BLAS setting (``MLXD_BLAS=off``:
MLX's bundled reference BLAS; unset: the system's OpenBLAS when present), for float32, float16
and bfloat16 at 256 and 512. ``qmm``: a 4-bit quantized product with half or single precision
activations and scales (why ``--dtype auto`` casts quantization scales too). ``daemon``: four
`mlxd start` daemons on MODEL_DIR, "before" (``MLXD_BLAS=off --dtype file``: the file's dtype
on the reference BLAS), "after" (the defaults), and each change alone ("blas only": ``--dtype
file``; "float32 only": ``MLXD_BLAS=off``), one unmeasured request each, then ROUNDS
requests to each, alternated; each request streams OUTPUT tokens (``ignore_eos``) after a
prompt whose first word differs, so no prefix cache hit. One JSON line per request: time to
first token (prompt) and the decode time after it. Each worker's KV pool is 0.5 GB: the default
(half the RAM the weights leave) for four at once is more than the machine has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from soak import free_port, wait_healthy  # noqa: E402

SETTINGS = {  # name: (environment, `mlxd start` options)
    "before": ({"MLXD_BLAS": "off"}, ["--dtype", "file"]),
    "blas only": ({}, ["--dtype", "file"]),
    "float32 only": ({"MLXD_BLAS": "off"}, []),
    "after": ({}, []),
}


def probe() -> None:
    from mlxd.worker import blas

    blas.preload(os.environ)
    import mlx.core as mx

    from mlxd.worker.cpu_backend import probe_gemm

    mx.set_default_device(mx.cpu)
    for dtype in (mx.float32, mx.float16, mx.bfloat16):
        for size in (256, 512):
            gflops = probe_gemm(size, dtype)
            print(json.dumps({"blas": blas.loaded() or "reference", "dtype": str(dtype)[9:],
                              "size": size, "gflops": round(gflops, 1)}))  # fmt: skip


def qmm() -> None:
    """4-bit ``quantized_matmul`` (1536x576, group 64) at 1, 8 and 128 rows: activations and
    scales in float16, float32 activations with float16 scales, and both float32."""
    from mlxd.worker import blas

    blas.preload(os.environ)
    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    w = mx.random.normal((1536, 576), key=mx.random.key(0)).astype(mx.float16)
    wq, scales, biases = mx.quantize(w, group_size=64, bits=4)
    for rows in (1, 8, 128):
        for x_dtype, s_dtype in ((mx.float16,) * 2, (mx.float32, mx.float16), (mx.float32,) * 2):
            x = mx.random.normal((rows, 576), key=mx.random.key(1)).astype(x_dtype)
            s, b = scales.astype(s_dtype), biases.astype(s_dtype)
            mx.eval(x, s, b, mx.quantized_matmul(x, wq, s, b))  # warm-up
            started = time.perf_counter()
            for _ in range(5):
                mx.eval(mx.quantized_matmul(x, wq, s, b))
            ms = (time.perf_counter() - started) / 5 * 1000
            print(json.dumps({"rows": rows, "x": str(x_dtype)[9:], "scales": str(s_dtype)[9:],
                              "ms": round(ms, 2)}))  # fmt: skip


def gemm() -> None:
    for name in ("before", "after"):
        print(f"# {name}", flush=True)
        env = SETTINGS[name][0]
        subprocess.run([sys.executable, __file__, "probe"], env={**os.environ, **env}, check=True)


def request(base: str, index: int, words: int, output: int) -> dict[str, Any]:
    prompt = f"request {index}: " + " ".join(["the quick brown fox jumps"] * (words // 5))
    body = {"model": "m", "prompt": prompt, "max_tokens": output, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    started, first, usage = time.perf_counter(), None, {}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and first is None:
                first = time.perf_counter()
            usage = chunk.get("usage") or usage
    end = time.perf_counter()
    assert first is not None, "no tokens"
    return {"ttft_s": round(first - started, 3), "decode_s": round(end - first, 3),
            "prompt_tokens": usage.get("prompt_tokens"),
            "output_tokens": usage.get("completion_tokens")}  # fmt: skip


def daemon(model: str, words: int = 120, output: int = 32, rounds: int = 3) -> None:
    procs, bases = {}, {}
    try:
        for name, (env, args) in SETTINGS.items():
            port = free_port()
            cmd = [sys.executable, "-m", "mlxd", "start", "--model", f"m={model}", "--port",
                   str(port), "--log-level", "warning", "--kv-cache-gb", "0.5", *args]  # fmt: skip
            procs[name] = subprocess.Popen(cmd, env={**os.environ, **env})
            bases[name] = f"http://127.0.0.1:{port}"
            wait_healthy(bases[name], procs[name])
            request(bases[name], -1, words, output)  # unmeasured: first-call setup
        for i in range(rounds):
            for name, base in bases.items():
                print(json.dumps({"setting": name, "round": i, **request(base, i, words, output)}),
                      flush=True)  # fmt: skip
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "probe":
        probe()
    elif mode == "qmm":
        qmm()
    elif mode == "gemm":
        gemm()
    else:
        daemon(rest[0], *(int(a) for a in rest[1:]))
