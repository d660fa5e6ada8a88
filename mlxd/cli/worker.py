"""`mlxd worker ...`: run a worker process (spawned by `mlxd start`, or by hand), and steer a
running daemon's workers through its admin endpoints (status, stats, drain, set...)."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import click

from mlxd.cli.admin import AdminClient, format_bytes, print_json, with_admin_options
from mlxd.cli.knob_options import with_knob_options
from mlxd.config import CacheConfig, SchedulerConfig, WorkerConfig, data_dir
from mlxd.errors import MlxdError
from mlxd.knobs import LIVE_KNOBS
from mlxd.protocol import curve


@click.group("worker")
def worker_group() -> None:
    """Run or talk to model workers."""


@worker_group.command("serve")
@click.option(
    "--model",
    default=None,
    help="Local mlx-lm directory, Hugging Face repo id, GGUF file or ollama:NAME[:TAG].",
)
@click.option("--name", default=None, help="The model name clients use (default: --model).")
@click.option("--bind", "endpoint", default=None, help="ZMQ endpoint, e.g. ipc:///tmp/w.sock.")
@click.option("--control", default=None, help="Control endpoint (default: w.sock -> w.ctl.sock).")
@click.option("--parent-pid", type=int, default=None, help="Exit when this process is gone.")
@click.option("--log-level", default="INFO", show_default=True)
@click.option(
    "--keys",
    "keys_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="CURVE keys for tcp:// (default: the data dir's, made by `mlxd keys`).",
)
@click.option(
    "--enable-test-faults",
    is_flag=True,
    envvar="MLXD_TEST_FAULTS",
    hidden=True,
    help="Accept the debug_crash control command (fault-injection tests only).",
)
@click.option(
    "--reason-file",
    default=None,
    hidden=True,
    help="If the worker cannot start, write why here (one line) for the supervisor.",
)
@click.option(
    "--buffer-cache-gb",
    type=float,
    default=None,
    help="Cap on MLX's cache of freed buffers, so the worker stays within its memory "
    "reservation (default: MLX's; `mlxd start --max-memory` sets it from the reservation).",
)
@click.option(
    "--config-json",
    default=None,
    hidden=True,
    help="The whole WorkerConfig as JSON (how `mlxd start` spawns workers); the options above "
    "but --log-level, --keys and --enable-test-faults are then ignored.",
)
@with_knob_options
def serve_command(
    log_level: str,
    keys_dir: Path | None,
    enable_test_faults: bool,
    config_json: str | None,
    **opts: Any,
) -> None:
    """Load MODEL and serve it on ENDPOINT until SIGTERM."""
    from mlxd.worker import blas, frameworks

    blas.preload(os.environ)  # before anything imports mlx.core (MLXD_BLAS=off: never)
    frameworks.hide()  # before mlx-lm imports transformers, which imports what it finds
    from mlxd.worker.main import configure_logging, serve

    try:
        if config_json:  # spawned by `mlxd start`: ipc:// endpoints, no CURVE keys
            config = WorkerConfig.from_json(config_json)
        else:
            config = _from_options(opts, keys_dir)
        config = dataclasses.replace(config, enable_test_faults=enable_test_faults)
    except MlxdError as exc:
        raise click.ClickException(exc.message) from None
    configure_logging(config.name, log_level.upper())
    sys.exit(serve(config))


def _from_options(opts: dict[str, Any], keys_dir: Path | None) -> WorkerConfig:
    if not opts["model"] or not opts["endpoint"]:
        raise click.UsageError("--model and --bind are required (or --config-json)")
    keys = None
    if any(str(e).startswith("tcp://") for e in (opts["endpoint"], opts["control"])):
        keys = curve.load(keys_dir or curve.keys_dir(data_dir()), "worker")
    gb = opts["buffer_cache_gb"]
    return WorkerConfig(
        model=opts["model"],
        name=opts["name"] or opts["model"],
        endpoint=opts["endpoint"],
        scheduler=SchedulerConfig.from_options(opts),
        cache=CacheConfig.from_options(opts),
        max_context=opts["max_context"],
        parent_pid=opts["parent_pid"],
        reason_file=opts["reason_file"],
        control_endpoint=opts["control"],
        buffer_cache_bytes=None if gb is None else int(gb * 2**30),
        dtype=opts["dtype"],
        max_image_pixels=opts["max_image_pixels"],
        curve_keys=keys,
    )


# Admin commands: talk to `mlxd start` over HTTP (/admin/models/MODEL/...).

ACTIONS = {
    "drain": "Finish MODEL's requests and refuse new ones (503) until `resume`.",
    "pause": "Stop MODEL's steps; requests stay queued, new ones are accepted.",
    "resume": "Undo `pause` and `drain`.",
    "flush-cache": "Free MODEL's MLX buffer cache.",
    "shutdown": "Drain MODEL, then stop its worker (it is not restarted).",
}


@worker_group.command("status")
@click.argument("model")
@with_admin_options
def status_command(model: str, url: str, admin_key: str | None, as_json: bool) -> None:
    """Show MODEL's worker: state, queue, memory, scheduler settings."""
    reply = AdminClient(url, admin_key).get(AdminClient.model_path(model, "status"))
    print_json(reply) if as_json else _show_status(reply)


@worker_group.command("stats")
@click.argument("model")
@with_admin_options
def stats_command(model: str, url: str, admin_key: str | None, as_json: bool) -> None:
    """Show MODEL's request counters, throughput and latency percentiles."""
    reply = AdminClient(url, admin_key).get(AdminClient.model_path(model, "stats"))
    print_json(reply) if as_json else _show_stats(reply)


@worker_group.command(
    "set",
    help="Change MODEL's scheduler settings live: " + ", ".join(k.field for k in LIVE_KNOBS) + ".",
)
@click.argument("model")
@click.argument("settings", nargs=-1, required=True, metavar="KEY=VALUE...")
@with_admin_options
def set_command(
    model: str, settings: tuple[str, ...], url: str, admin_key: str | None, as_json: bool
) -> None:
    body = dict(_parse_setting(s) for s in settings)
    reply = AdminClient(url, admin_key).post(AdminClient.model_path(model, "set"), body)
    print_json(reply) if as_json else _show_ack(reply)


def _action_command(action: str, help_text: str) -> None:
    @worker_group.command(action, help=help_text)
    @click.argument("model")
    @with_admin_options
    def command(model: str, url: str, admin_key: str | None, as_json: bool) -> None:
        reply = AdminClient(url, admin_key).post(AdminClient.model_path(model, action))
        print_json(reply) if as_json else _show_ack(reply)


for _action, _help in ACTIONS.items():
    _action_command(_action, _help)


def _parse_setting(text: str) -> tuple[str, int | float]:
    key, sep, value = text.partition("=")
    try:
        if not sep or not key:
            raise ValueError
        return key.strip(), int(value) if value.strip().lstrip("-").isdigit() else float(value)
    except ValueError:
        raise click.ClickException(f"bad setting {text!r}: use KEY=NUMBER") from None


def _show_ack(r: dict[str, Any]) -> None:
    click.echo(f"{r['name']}: {r['state']}" + (f" ({r['message']})" if r.get("message") else ""))


def _memory(m: dict[str, Any]) -> str:
    cap = m.get("cache_limit_bytes")
    return (
        f"weights {format_bytes(m['weights_bytes'])}, active {format_bytes(m['active_bytes'])}"
        f", peak {format_bytes(m['peak_bytes'])}, cache {format_bytes(m['cache_bytes'])}"
        + (f" (cap {format_bytes(cap)})" if cap is not None else "")
    )


def _kv_memory(m: dict[str, Any]) -> str:
    """Used (requests in flight) of reserved (held now) of the budget (the most held)."""
    budget = m.get("kv_budget_bytes") or 0
    return (
        f"{format_bytes(m['kv_bytes'])} used, {format_bytes(m.get('kv_reserved_bytes', 0))}"
        f" reserved" + (f" of {format_bytes(budget)} budget" if budget else "")
    )


def _show_status(r: dict[str, Any]) -> None:
    m, knobs = r["memory"], r["scheduler"]
    rows = [
        ("model", f"{r['name']} ({r['model_path']})"),
        ("state", f"{r['state']}, pid {r['pid']}, up {r['uptime_s']:.0f} s"),
        (
            "requests",
            f"{r['num_running']} running, {r['num_prefilling']} prefilling, "
            f"{r['num_waiting']} waiting",
        ),
        ("memory", _memory(m)),
        ("kv memory", _kv_memory(m)),
        ("scheduler", " ".join(f"{k}={v}" for k, v in knobs.items() if v is not None)),
        ("max_context", str(r["max_context"])),
        ("kv cache", r.get("kv_cache") or "?"),
        ("compute", _compute(r.get("compute"))),
    ]
    _show_rows(rows)


def _compute(c: dict[str, Any] | None) -> str:
    if c is None:
        return "?"
    cast = (
        f" (file {c['file_dtype']}: weights cast, float memory x{_ratio(c)})"
        if c["dtype"] != c["file_dtype"]
        else ""
    )
    blas = c["blas"] or ("none (reference)" if c["device"] == "cpu" else "-")
    return (
        f"{c['device']}, {c['dtype']}{cast}, BLAS {blas}, {c['gemm_size']}x{c['gemm_size']}"
        f" matmul {c['gemm_gflops']:.1f} GFLOP/s"
    )


def _ratio(c: dict[str, Any]) -> str:
    sizes = {"float32": 4, "float16": 2, "bfloat16": 2}
    ratio = sizes.get(c["dtype"], 0) / sizes.get(c["file_dtype"], 1)
    return f"{ratio:g}"


def _show_stats(r: dict[str, Any]) -> None:
    rows = [
        (
            "requests",
            f"{r['requests_admitted']} admitted, {r['requests_finished']} finished, "
            f"{r['requests_cancelled']} cancelled, {r['requests_errored']} errored, "
            f"{r['requests_rejected']} rejected",
        ),
        ("tokens", f"{r['prompt_tokens']} prompt, {r['output_tokens']} output"),
        (
            "output tok/s",
            f"{r['output_tps_recent']:.1f} (last 10 s), {r['output_tps_total']:.1f} (since start)",
        ),
        ("ttft", _latency(r["ttft"])),
        ("inter-token", _latency(r["itl"])),
        (
            "decode step",
            _latency(r["decode_step"])
            + (f", {r['decode_rows_mean']:.1f} rows" if r["decode_step"]["num_samples"] else "")
            + (
                f", {n} of {r['decode_steps']} from the pool's blocks (the read view was full)"
                if (n := r.get("decode_gathered_steps", 0))
                else ""
            ),
        ),
        ("preemptions", str(r["preemptions"])),
        ("speculation", _speculation(r)),
        *([("images", _images(r))] if r.get("images") else []),
        (
            "prefix cache",
            f"{r['prefix_cache_hits']} hits, {r.get('prefix_cache_misses', 0)} "
            f"misses, {r['prefix_cache_hit_tokens']} tokens",
        ),
        (
            "kv blocks",
            f"{r.get('kv_blocks_used', 0)} used, {r.get('kv_blocks_free', 0)} free, "
            f"{r.get('kv_blocks_cached', 0)} cached of {r.get('kv_blocks_total', 0)} "
            f"x {r.get('kv_block_size', 0)} tokens",
        ),
    ]
    _show_rows(rows)


def _images(r: dict[str, Any]) -> str:
    return (
        f"{r['images']} in requests ({r.get('images_per_s_recent', 0.0):.1f}/s, last 10 s), "
        f"{r['images_encoded']} through the vision tower ({r['vision_encode_s']:.2f} s)"
    )


def _speculation(r: dict[str, Any]) -> str:
    mode = str(r.get("speculation", "off"))
    if not r.get("tokens_per_forward"):
        return mode
    return (
        f"{mode}: {r['spec_accepted_tokens']} of {r['spec_drafted_tokens']} draft tokens "
        f"accepted ({r['spec_acceptance_rate']:.0%}), {r['tokens_per_forward']:.2f} tokens "
        "per forward"
    )


def _latency(s: dict[str, Any]) -> str:
    if not s["num_samples"]:
        return "no samples yet"
    return (
        f"p50 {s['p50_ms']:.1f} ms, p95 {s['p95_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms "
        f"({s['num_samples']} samples)"
    )


def _show_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value}")
