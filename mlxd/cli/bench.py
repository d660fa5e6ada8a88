"""`mlxd bench`: throughput and latency, over HTTP or in-process."""

from __future__ import annotations

import asyncio
import gc
import json
import platform
import time
from pathlib import Path
from typing import Any

import click

COLUMNS = ("concurrency", "ok", "failed", "output_tok_s", "per_request_tok_s", "ttft_p50_ms",
           "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "speedup")  # fmt: skip


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter("use a comma-separated list of integers, e.g. 1,4,16") from None
    if not levels or min(levels) < 1:
        raise click.BadParameter("concurrency levels must be >= 1")
    return levels


def _table(rows: list[dict[str, Any]]) -> str:
    base = next((r["output_tok_s"] for r in rows if r.get("concurrency") == 1), None)
    lines = ["  ".join(f"{c:>17}" for c in COLUMNS)]
    for r in rows:
        r["speedup"] = r["output_tok_s"] / base if base else float("nan")
        cells = [f"{r.get(c, float('nan')):>17.1f}" if isinstance(r.get(c), float)
                 else f"{r.get(c, ''):>17}" for c in COLUMNS]  # fmt: skip
        lines.append("  ".join(cells))
    return "\n".join(lines)


def _write(path: Path | None, payload: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(payload, indent=2))
        click.echo(f"wrote {path}", err=True)


def _meta(**kw: Any) -> dict[str, Any]:
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(),
            "machine": platform.machine(), **kw}  # fmt: skip


@click.group("bench")
def bench_group() -> None:
    """Measure throughput and latency."""


common = [
    click.option(
        "--concurrency", default="1,4,16,64", show_default=True, help="Levels, comma-separated."
    ),
    click.option("--prompt-tokens", default=128, show_default=True),
    click.option(
        "--max-tokens",
        default=256,
        show_default=True,
        help="Output tokens per request (eos ignored).",
    ),
    click.option(
        "--json",
        "json_path",
        type=click.Path(path_type=Path),
        default=None,
        help="Write results here.",
    ),
]


def with_common(fn):  # type: ignore[no-untyped-def]
    for option in reversed(common):
        fn = option(fn)
    return fn


@bench_group.command("run")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True)
@click.option("--model", required=True, help="Model name on the server.")
@click.option("--requests-per-level", default=0, help="Requests per level (default: the level).")
@click.option(
    "--warmup-tokens",
    default=16,
    show_default=True,
    help="Each level first runs once with this many output tokens (0: no warm-up), so "
    "one-time kernel compilation for its batch shapes is not measured.",
)
@click.option(
    "--text-prompts-from",
    "tokenizer_path",
    default=None,
    metavar="MODEL_DIR",
    help="Send the prompts as text decoded with MODEL_DIR's tokenizer (for servers "
    "that do not take token-id prompts, e.g. mlx_lm.server).",
)
@with_common
def run_command(url: str, model: str, requests_per_level: int, warmup_tokens: int,
                tokenizer_path: str | None, concurrency: str, prompt_tokens: int, max_tokens: int,
                json_path: Path | None) -> None:  # fmt: skip
    """Streaming load on URL's /v1/completions at each concurrency level."""
    from mlxd.bench.http import as_text, make_prompts, run_level

    rows = []
    for level in _levels(concurrency):
        n = requests_per_level or level
        click.echo(f"level {level}: {n} requests ...", err=True)
        prompts: list[Any] = make_prompts(n, prompt_tokens, seed=level)
        if tokenizer_path:
            prompts = as_text(prompts, tokenizer_path)
        if warmup_tokens:
            asyncio.run(run_level(url, model, level, prompts, warmup_tokens))
        rows.append(asyncio.run(run_level(url, model, level, prompts, max_tokens)))
    click.echo(_table(rows))
    _write(json_path, _meta(kind="http", url=url, model=model, prompt_tokens=prompt_tokens,
                            max_tokens=max_tokens, levels=rows))  # fmt: skip


@bench_group.command("engine")
@click.option("--model", "model_path", required=True, help="Local mlx-lm directory or repo id.")
@click.option("--prefill-chunk", default=1024, show_default=True)
@click.option(
    "--compare-mlx-lm/--no-compare-mlx-lm",
    default=True,
    show_default=True,
    help="Also run mlx-lm's BatchGenerator and generate_step on the same prompts.",
)
@with_common
def engine_command(
    model_path: str,
    prefill_chunk: int,
    compare_mlx_lm: bool,
    concurrency: str,
    prompt_tokens: int,
    max_tokens: int,
    json_path: Path | None,
) -> None:
    """The same workload in-process on the engine (no HTTP, no ZMQ)."""
    import mlx_lm

    from mlxd.bench.engine import engine_level, mlx_lm_batch_level, mlx_lm_single, new_engine
    from mlxd.bench.http import make_prompts
    from mlxd.config import SchedulerConfig

    model, tokenizer = mlx_lm.load(model_path)[:2]
    rows, yard = [], []
    for level in _levels(concurrency):
        click.echo(f"level {level} ...", err=True)
        prompts = make_prompts(level, prompt_tokens, seed=level)
        sched = SchedulerConfig(max_num_seqs=level, max_queued=level, prefill_chunk=prefill_chunk)
        engine = new_engine(model, tokenizer, sched, prompt_tokens + max_tokens + 8)
        # Each run is preceded by a short one of the same shape: kernel compilation for new
        # batch sizes happens once and is not what we measure.
        engine_level(engine, prompts, 16)
        rows.append(engine_level(engine, prompts, max_tokens))
        del engine
        gc.collect()  # the previous level's KV buffers go back to MLX's cache
        if compare_mlx_lm:
            ref = mlx_lm_single if level == 1 else mlx_lm_batch_level
            arg = prompts[0] if level == 1 else prompts
            ref(model, arg, 16)  # type: ignore[arg-type]
            yard.append(ref(model, arg, max_tokens))  # type: ignore[arg-type]
    click.echo(_table(rows))
    for y in yard:
        click.echo(f"mlx-lm at {y['concurrency']}: {y['output_tok_s']:.1f} tok/s")
    _write(json_path, _meta(kind="engine", model=model_path, prompt_tokens=prompt_tokens,
                            max_tokens=max_tokens, levels=rows, mlx_lm=yard))  # fmt: skip
