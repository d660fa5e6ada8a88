"""`mlxd bench`: throughput and latency, over HTTP or in-process; plots from the JSON."""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from mlxd.bench import report
from mlxd.bench.workload import SCENARIOS
from mlxd.cli.bench_failover import failover_options, run_failover_scenario
from mlxd.cli.knob_options import knob_option
from mlxd.config import SchedulerConfig
from mlxd.knobs import DTYPE, KV_CACHE_GB, SPECULATE

if TYPE_CHECKING:
    from mlxd.bench.http import Target

_F = TypeVar("_F", bound=Callable[..., Any])


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{what}: use a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"{what}: every value must be >= 1")
    return values


def _only_model(target: Target) -> str:
    """The server's one model; with several, an error that lists them."""
    import httpx

    from mlxd.bench.http import served_models

    try:
        names = served_models(target)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot list the models of {target.base_url}: {exc}") from None
    if len(names) == 1:
        click.echo(f"bench: --model {names[0]} (the server's only model)", err=True)
        return names[0]
    if not names:
        raise click.ClickException(f"{target.base_url} serves no model")
    raise click.ClickException(
        f"{target.base_url} serves {len(names)} models; pick one or more "
        f"with --model: {', '.join(names)}"
    )


def _finish(payload: dict[str, Any], json_path: Path | None, plot_path: Path | None) -> None:
    click.echo(report.table(payload["rows"]))
    for line in report.prefix_summary(payload["rows"]) + report.failures(payload["rows"]):
        click.echo(line)
    if json_path is not None:
        report.write_json(json_path, payload)
        click.echo(f"wrote {json_path}", err=True)
    if plot_path is not None:
        _plot([(payload.get("label") or payload["kind"], payload)], plot_path)


def _partial_writer(
    payload: dict[str, Any], json_path: Path | None
) -> Callable[[list[dict[str, Any]]], None]:
    """Rewrites the JSON after every level ("complete": false until the end)."""

    def write(rows: list[dict[str, Any]]) -> None:
        if json_path is not None:
            report.write_json(json_path, {**payload, "rows": rows})

    return write


def _plot(results: list[tuple[str, dict[str, Any]]], out: Path) -> None:
    from mlxd.bench.plot import PlotUnavailable, plot

    try:
        plot(results, out)
    except PlotUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {out}", err=True)


@click.group("bench")
def bench_group() -> None:
    """Measure throughput and latency."""


output_options = [
    click.option(
        "--concurrency", default="1,4,16,64", show_default=True, help="Levels, comma-separated."
    ),
    click.option("--prompt-tokens", default=128, show_default=True),
    click.option(
        "--max-tokens",
        default=256,
        show_default=True,
        help="Output tokens per request (eos ignored where the server allows).",
    ),
    click.option(
        "--json",
        "json_path",
        type=click.Path(path_type=Path),
        default=None,
        help="Write results here.",
    ),
    click.option(
        "--plot",
        "plot_path",
        type=click.Path(path_type=Path),
        default=None,
        help="Draw throughput and latency vs concurrency here (PNG; needs matplotlib).",
    ),
    click.option("--label", default=None, help="Name of this series in plots and JSON."),
]


def with_output_options(fn: _F) -> _F:
    for option in reversed(output_options):
        fn = option(fn)
    return fn


@bench_group.command("run")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True)
@click.option(
    "--model",
    "models",
    multiple=True,
    help="Model name on the server (repeat for multi-model: requests go round-robin). "
    "Default: the server's only model.",
)
@click.option(
    "--scenario",
    type=click.Choice([*SCENARIOS, "failover"]),
    default="throughput",
    show_default=True,
    help="What the requests look like (see below).",
)
@click.option(
    "--endpoint",
    type=click.Choice(["completions", "chat"]),
    default="completions",
    show_default=True,
)
@click.option(
    "--stream/--no-stream",
    default=True,
    show_default=True,
    help="Without streaming, TTFT is the whole response time and there is no ITL.",
)
@click.option(
    "--runs",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Measured repeats per level: tok/s is their mean, percentiles pool them.",
)
@click.option("--requests-per-level", default=0, help="Requests per level (default: the level).")
@click.option(
    "--warmup-tokens",
    default=16,
    show_default=True,
    help="Each level first runs once with this many output tokens (0: no warm-up), so "
    "one-time kernel compilation for its batch shapes is not measured.",
)
@click.option(
    "--prefix-tokens",
    default="500,2000,8000",
    show_default=True,
    help="shared-prefix: system prompt lengths.",
)
@click.option(
    "--turns",
    default=4,
    show_default=True,
    type=click.IntRange(min=1),
    help="multi-turn: turns per conversation.",
)
@click.option(
    "--mixed-lengths",
    default="32,128,512,2048",
    show_default=True,
    help="mixed: prompt lengths, cycled.",
)
@click.option(
    "--high-fraction",
    default=0.25,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="priority-mix: share of high priority.",
)
@click.option(
    "--image-size",
    default=0,
    type=click.IntRange(min=0),
    metavar="PIXELS",
    help="Each chat request sends one image this many pixels a side (a PNG of its own), "
    "before its text; 0: none. shared-image needs it.",
)
@click.option(
    "--text-prompts-from",
    "tokenizer_path",
    default=None,
    metavar="MODEL_DIR",
    help="Send prompts as text decoded with MODEL_DIR's tokenizer (for servers that "
    "take only strings, e.g. mlx_lm.server).",
)
@click.option("--api-key", default=None, help="Sent as 'Authorization: Bearer KEY'.")
@click.option(
    "--extra-body",
    default="{}",
    metavar="JSON",
    help="A JSON object merged into every request body, e.g. '{\"speculate\": false}' to "
    "measure an mlxd server without speculative decoding.",
)
@click.option("--timeout", default=600.0, show_default=True, help="Seconds per request.")
@click.option("--seed", default=0, show_default=True, help="Prompt seed.")
@click.option(
    "--client-procs",
    default=0,
    type=click.IntRange(min=0),
    help="Client processes the load comes from, each with its share of the streams (0: one "
    "per 4 CPUs, at most 8). One process alone staggers a burst of requests by its own CPU "
    "time per request.",
)
@failover_options
@with_output_options
def run_command(**o: Any) -> None:
    """Load URL's OpenAI API at each concurrency level and report tok/s and latency.

    \b
    Scenarios (--scenario):
      throughput     one prompt per request, --prompt-tokens long
      shared-prefix  TTFT with a cold system prompt vs one already cached (--prefix-tokens)
      multi-turn     conversations that grow turn by turn (--turns); rows per turn
      mixed          prompt lengths cycled from --mixed-lengths; rows per length
      multi-model    several --model names at once; rows per model
      priority-mix   X-Priority high/low (--high-fraction); rows per priority; set
                     --concurrency above the server's --max-num-seqs so requests queue
      edit           a code file and an instruction to rename a variable (the answer is
                     mostly a copy: speculative decoding's best case); use --endpoint chat
      json           CSV records to return as a JSON array; use --endpoint chat
      chat           open questions (little to copy); use --endpoint chat
      shared-image   TTFT with an image of its own (cold) vs one image already cached
                     (hit); needs --image-size and --endpoint chat
      failover       chat streams to a --model with fallbacks for --duration s; its worker
                     (--kill-worker) or a process (--kill-pid) is killed --kill-after s in;
                     reports requests lost, cut, served per model, time to fail over
    """
    from mlxd.bench.clients import auto_client_procs
    from mlxd.bench.http import Target, check_reachable
    from mlxd.bench.runner import Plan, run_benchmark
    from mlxd.bench.workload import WorkloadOptions, tokenizer_text, words

    if o["scenario"] == "multi-model" and len(o["models"]) < 2:
        raise click.BadParameter("multi-model needs two or more --model", param_hint="--model")
    _check_images(o)
    target = Target(
        o["url"],
        o["endpoint"],
        o["stream"],
        o["timeout"],
        o["api_key"],
        _extra_body(o["extra_body"]),
    )
    if (reason := check_reachable(target)) is not None:
        raise click.ClickException(reason)
    o["models"] = o["models"] or (_only_model(target),)
    if o["scenario"] == "failover":
        run_failover_scenario(o, _ints(o["concurrency"], "--concurrency")[0])
        return
    opts = WorkloadOptions(
        models=o["models"],
        prompt_tokens=o["prompt_tokens"],
        max_tokens=o["max_tokens"],
        requests_per_level=o["requests_per_level"],
        turns=o["turns"],
        prefix_tokens=_ints(o["prefix_tokens"], "--prefix-tokens"),
        mixed_lengths=_ints(o["mixed_lengths"], "--mixed-lengths"),
        high_fraction=o["high_fraction"],
        image_size=o["image_size"],
    )
    to_text = tokenizer_text(o["tokenizer_path"]) if o["tokenizer_path"] else None
    if to_text is None and (o["endpoint"] == "chat" or o["scenario"] == "multi-turn"):
        to_text = words  # chat messages and conversation history are text
    plan = Plan(
        o["scenario"],
        list(_ints(o["concurrency"], "--concurrency")),
        o["runs"],
        o["warmup_tokens"],
        to_text,
        o["seed"],
        o["client_procs"] or auto_client_procs(),
    )
    payload = report.meta(
        kind="http",
        label=o["label"],
        url=o["url"],
        models=list(o["models"]),
        model=",".join(o["models"]),
        scenario=o["scenario"],
        endpoint=o["endpoint"],
        stream=o["stream"],
        prompt_tokens=o["prompt_tokens"],
        image_size=o["image_size"],
        max_tokens=o["max_tokens"],
        extra_body=dict(target.extra_body),
        runs=o["runs"],
        text_prompts=to_text is not None,
        client_procs=plan.client_procs,
        complete=False,
        rows=[],
    )
    payload["rows"] = run_benchmark(target, plan, opts, _partial_writer(payload, o["json_path"]))
    payload["complete"] = True
    _finish(payload, o["json_path"], o["plot_path"])


def _check_images(o: dict[str, Any]) -> None:
    if o["scenario"] == "shared-image" and not o["image_size"]:
        raise click.BadParameter("shared-image needs --image-size", param_hint="--image-size")
    if o["image_size"] and o["endpoint"] != "chat":
        raise click.BadParameter(
            "images go in chat messages: add --endpoint chat", param_hint="--image-size"
        )


def _extra_body(text: str) -> tuple[tuple[str, Any], ...]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--extra-body") from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--extra-body")
    return tuple(value.items())


@bench_group.command("engine")
@click.option("--model", "model_path", required=True, help="Local mlx-lm directory or repo id.")
@click.option("--prefill-chunk", default=SchedulerConfig().prefill_chunk, show_default=True)
@click.option(
    "--paged-kv/--no-paged-kv",
    default=True,
    show_default=True,
    help="The paged KV cache (the daemon's default) or the contiguous one.",
)
@click.option("--kv-block-size", default=32, show_default=True)
@knob_option(KV_CACHE_GB)
@knob_option(SPECULATE)
@knob_option(DTYPE)
@click.option(
    "--buffer-cache-gb",
    type=click.FloatRange(min=0),
    default=None,
    help="Cap MLX's cache of freed buffers, as a served worker caps its own (at least 1 GiB "
    "without --max-memory); default: MLX's limit.",
)
@click.option(
    "--compare-mlx-lm/--no-compare-mlx-lm",
    default=True,
    show_default=True,
    help="Also run mlx-lm's BatchGenerator and generate_step on the same prompts.",
)
@with_output_options
def engine_command(
    model_path: str,
    prefill_chunk: int,
    paged_kv: bool,
    kv_block_size: int,
    kv_cache_gb: float | None,
    speculate: str,
    dtype: str,
    buffer_cache_gb: float | None,
    compare_mlx_lm: bool,
    concurrency: str,
    prompt_tokens: int,
    max_tokens: int,
    json_path: Path | None,
    plot_path: Path | None,
    label: str | None,
) -> None:
    """The same workload in-process on the engine (no HTTP, no ZMQ), its weights computed as a
    served worker's (--dtype). Without --kv-cache-gb the pool holds every row's context and
    decode's view may use all of it; with it, both are sized as a served worker's."""
    from mlxd.daemon.worker_command import CUDA_GRAPHS, kernel_cache_env, model_env
    from mlxd.worker import blas

    # Before MLX loads, as a worker does: without it the CPU's products ran on MLX's reference
    # BLAS (stop 35: a verification 2.5x a plain step instead of 1.0-1.4x).
    blas.preload(os.environ)
    # as a worker starts: its kernel folder, and no CUDA graphs for hybrids
    os.environ.update(kernel_cache_env() | model_env(model_path, dtype))
    import mlx_lm

    from mlxd.bench.engine import engine_level, mlx_lm_batch_level, mlx_lm_single, new_engine
    from mlxd.bench.progress import Progress
    from mlxd.bench.stats import add_speedup
    from mlxd.bench.workload import make_prompts
    from mlxd.worker import (
        buffer_cache,
        cpu_backend,  # imports MLX: after the BLAS preload above
    )
    from mlxd.worker.runners.served import for_serving, for_this_process

    cache_limit = (
        None if buffer_cache_gb is None else buffer_cache.cap(int(buffer_cache_gb * 2**30))
    )
    model, tokenizer = mlx_lm.load(model_path)[:2]
    served, patched = for_serving(model), for_this_process(model)  # as the worker does
    cpu_backend.cast(model, dtype)  # auto: float32 on the CPU, as the worker computes there
    rows: list[dict[str, Any]] = []
    yard: list[dict[str, Any]] = []
    payload = report.meta(
        kind="engine",
        label=label,
        model=model_path,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        complete=False,
        prefill_chunk=prefill_chunk,
        paged_kv=paged_kv,
        kv_block_size=kv_block_size,
        kv_cache_gb=kv_cache_gb,
        buffer_cache_bytes=cache_limit,
        cuda_graphs=os.environ.get(CUDA_GRAPHS, "1") != "0",  # MLX's default: on
        speculate=speculate,
        dtype=cpu_backend.dtype_name(cpu_backend.float_dtype(model)),  # as computed, not stored
        blas=blas.loaded(),
        rows=rows,
        mlx_lm=yard,
    )
    write_partial = _partial_writer(payload, json_path)
    for level in _ints(concurrency, "--concurrency"):
        bar = Progress(f"engine c={level}", 1)
        prompts = make_prompts(level, prompt_tokens, seed=level)
        sched = SchedulerConfig(
            max_num_seqs=level, max_queued=level, prefill_chunk=prefill_chunk, speculate=speculate
        )
        context = prompt_tokens + max_tokens + 8
        engine = new_engine(
            model, tokenizer, sched, context, paged_kv, kv_block_size, kv_cache_gb=kv_cache_gb
        )
        # Each run is preceded by a short one of the same shape: kernel compilation for new
        # batch sizes happens once and is not what we measure. Other prompts: the same ones
        # would hit the prefix cache.
        engine_level(engine, make_prompts(level, prompt_tokens, seed=level + 10_000), 16)
        rows.append(engine_level(engine, prompts, max_tokens))
        del engine
        gc.collect()  # the previous level's KV buffers go back to MLX's cache
        if compare_mlx_lm:
            ref = mlx_lm_single if level == 1 else mlx_lm_batch_level
            arg = prompts[0] if level == 1 else prompts
            served.undo()  # mlx-lm on the model as it made it, its functions as they ship
            patched.undo()
            ref(model, arg, 16)  # type: ignore[arg-type]
            yard.append(ref(model, arg, max_tokens))  # type: ignore[arg-type]
            served, patched = for_serving(model), for_this_process(model)
        bar.advance()
        bar.close()
        write_partial(add_speedup(rows))
    payload["complete"] = True
    _finish(payload, json_path, plot_path)
    for y in yard:
        click.echo(f"mlx-lm at {y['concurrency']}: {y['output_tok_s']:.1f} tok/s")


@bench_group.command("plot")
@click.argument(
    "json_files",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
)
@click.option("--out", required=True, type=click.Path(path_type=Path), help="PNG to write.")
def plot_command(json_files: tuple[Path, ...], out: Path) -> None:
    """Draw JSON results of `bench run` / `bench engine` into one PNG (series per file)."""
    from mlxd.bench.plot import label_for

    results = []
    for path in json_files:
        try:
            data = report.read_json(path)
        except ValueError as exc:
            raise click.ClickException(f"{path} is not benchmark JSON: {exc}") from None
        results.append((label_for(data, path.stem), data))
    _plot(results, out)
