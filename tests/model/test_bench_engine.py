"""`mlxd bench engine` in-process on the tiny model: both KV caches give the same statistics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxd.cli.main import main

pytestmark = pytest.mark.model


@pytest.mark.parametrize("cache", ["--paged-kv", "--no-paged-kv"])
def test_bench_engine_reports_every_level(tiny_model: Path, tmp_path: Path, cache: str) -> None:
    out = tmp_path / "engine.json"
    args = [
        "bench",
        "engine",
        "--model",
        str(tiny_model),
        "--concurrency",
        "1,3",
        "--prompt-tokens",
        "8",
        "--max-tokens",
        "4",
        "--no-compare-mlx-lm",
        cache,
        "--json",
        str(out),
    ]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert (
        data["kind"] == "engine"
        and data["complete"]
        and data["paged_kv"] == (cache == "--paged-kv")
        and data["cuda_graphs"]  # a dense model keeps MLX's default (a hybrid: test_worker_env)
    )
    rows = data["rows"]
    assert [(r["concurrency"], r["ok"], r["output_tokens"]) for r in rows] == [
        (1, 1, 4),
        (3, 3, 12),
    ]
    assert rows[0]["speedup"] == 1.0 and all(r["ttft_p50_ms"] > 0 for r in rows)
    assert all(r["gathered_steps"] == 0 for r in rows)  # the view may use the whole pool
    assert result.stdout.splitlines()[0].split()[:2] == ["conc", "ok"]


def test_bench_engine_sizes_the_view_as_a_worker_under_kv_cache_gb(
    tiny_model: Path, tmp_path: Path
) -> None:
    """A budget whose fifth holds one row's view (8-token prompts: 32 + 64 columns) but not
    three: the 3-stream level decodes from the pool's blocks, as a served worker would."""
    from mlxd.worker.kv.paged_cache import KVPool
    from tests.model.conftest import load_model

    per_token = KVPool.bytes_per_token(load_model(tiny_model)[0])
    out = tmp_path / "engine.json"
    args = [
        "bench",
        "engine",
        "--model",
        str(tiny_model),
        "--concurrency",
        "1,3",
        "--prompt-tokens",
        "8",
        "--max-tokens",
        "4",
        "--no-compare-mlx-lm",
        "--kv-cache-gb",
        str(500 * per_token / 2**30),
        "--json",
        str(out),
    ]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert [(r["ok"], r["gathered_steps"] > 0) for r in data["rows"]] == [(1, False), (3, True)]


def test_bench_engine_loads_the_optimized_blas_a_worker_loads(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Run as a command (MLX not loaded yet), it loads the BLAS a worker loads and says so in
    its JSON: without it the CPU's products run on MLX's reference BLAS."""
    from mlxd.worker import blas

    if blas.find(os.environ) is None:
        pytest.skip("no optimized BLAS on this machine")
    out = tmp_path / "engine.json"
    args = [
        "bench",
        "engine",
        "--model",
        str(tiny_model),
        "--concurrency",
        "1",
        "--prompt-tokens",
        "8",
        "--max-tokens",
        "2",
        "--no-compare-mlx-lm",
        "--json",
        str(out),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "mlxd", *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(out.read_text())["blas"]
    assert loaded is not None and Path(loaded).name.startswith(
        ("libopenblas", "libblis", "libmkl", "libblas")
    )


@pytest.mark.parametrize(("option", "computed"), [("auto", "float32"), ("file", "bfloat16")])
def test_bench_engine_computes_in_the_dtype_a_worker_computes_in(
    tmp_path: Path, option: str, computed: str
) -> None:
    """A bfloat16 model on the CPU backend: a worker computes it in float32 (``--dtype auto``),
    so the in-process engine does too, or it would be timed on the slow half-precision path
    (on this CPU it stepped 1.2-1.8x slower than the served worker it is compared with)."""
    import mlx.core as mx

    from mlxd.models.maker import make_model

    if mx.default_device() != mx.cpu:
        pytest.skip("auto keeps half precision on a GPU")
    model = make_model(tmp_path / "m", dtype="bfloat16", progress=lambda line: None)
    out = tmp_path / "engine.json"
    args = ["bench", "engine", "--model", str(model), "--dtype", option, "--concurrency", "1"]
    args += ["--prompt-tokens", "8", "--max-tokens", "2", "--no-compare-mlx-lm"]
    result = CliRunner().invoke(main, [*args, "--json", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["dtype"] == computed


def test_bench_engine_caps_the_buffer_cache_as_a_worker_does(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--buffer-cache-gb``: the engine runs under the cap a served worker puts on MLX's cache
    of freed buffers (never above MLX's own), and the JSON says which limit was in force."""
    import mlx.core as mx

    before = mx.set_cache_limit(2**40)  # the limit in force, put back at once
    mx.set_cache_limit(before)
    limits: list[int] = []
    real = mx.set_cache_limit

    def recording(limit: int) -> int:
        limits.append(limit)
        return real(limit)

    monkeypatch.setattr(mx, "set_cache_limit", recording)
    out = tiny_model.parent / "capped.json"
    args = ["bench", "engine", "--model", str(tiny_model), "--buffer-cache-gb", "0.01"]
    args += ["--concurrency", "1", "--prompt-tokens", "8", "--max-tokens", "2"]
    result = CliRunner().invoke(main, [*args, "--no-compare-mlx-lm", "--json", str(out)])
    real(before)
    assert result.exit_code == 0, result.output
    wanted = int(0.01 * 2**30)
    assert limits[0] == wanted
    assert json.loads(out.read_text())["buffer_cache_bytes"] == min(before, wanted)


@pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning")  # its tokenizer
def test_bench_engine_serves_with_the_workers_process_patches_and_times_mlx_lm_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hybrid: the engine prefills its gated delta layers in chunks, as a worker does where
    Metal is absent (``for_this_process``), and mlx-lm's yardstick runs its own loop."""
    import mlxd.bench.engine as bench_engine
    from mlxd.models.zoo import make_zoo_model
    from mlxd.worker.runners import delta_chunks

    model = make_zoo_model(tmp_path / "m", "qwen3_5")
    phase, chunked = ["load"], {"engine": 0, "mlx-lm": 0, "load": 0}
    real = delta_chunks.chunked_gated_delta

    def counted(*a: object) -> object:
        chunked[phase[0]] += 1
        return real(*a)  # type: ignore[arg-type]

    def in_phase(name: str, run: object) -> object:
        def timed(*a: object, **k: object) -> object:
            phase[0] = name
            return run(*a, **k)  # type: ignore[operator]

        return timed

    monkeypatch.setattr(delta_chunks, "chunked_gated_delta", counted)
    monkeypatch.setattr(bench_engine, "engine_level", in_phase("engine", bench_engine.engine_level))
    monkeypatch.setattr(
        bench_engine, "mlx_lm_single", in_phase("mlx-lm", bench_engine.mlx_lm_single)
    )
    args = ["bench", "engine", "--model", str(model), "--concurrency", "1"]
    args += ["--prompt-tokens", "40", "--max-tokens", "2", "--speculate", "off"]
    try:
        result = CliRunner().invoke(main, args, catch_exceptions=False)
    finally:
        delta_chunks.uninstall()  # the command serves again after its yardstick
    assert result.exit_code == 0, result.output
    assert chunked["engine"] > 0 and chunked["mlx-lm"] == 0, chunked
