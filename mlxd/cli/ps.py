"""`mlxd ps`: one line per model of the running daemon (state, pid, memory, queue, tok/s, and
why a failed model failed), from ``GET /admin/overview``: the JSON the status page draws."""

from __future__ import annotations

from typing import Any

import click

from mlxd.cli.admin import (
    OVERVIEW_PATH,
    AdminClient,
    format_bytes,
    print_json,
    with_admin_options,
)

COLUMNS = (
    "MODEL",
    "STATE",
    "PID",
    "GPUS",
    "MEMORY",
    "KV USED/RESERVED",
    "RUNNING",
    "WAITING",
    "TOK/S",
    "RESTARTS",
    "REASON",
)
GPUS = COLUMNS.index("GPUS")  # shown only where some worker was placed on GPUs (mlxd.gpus)
BACKEND_COLUMNS = ("BACKEND", "KIND", "URL", "STATE", "REQUESTS", "FAILED", "LAST ERROR")


@click.command("ps")
@with_admin_options
def ps_command(url: str, admin_key: str | None, as_json: bool) -> None:
    """List the daemon's models and how their workers are doing."""
    overview = AdminClient(url, admin_key).get(f"{OVERVIEW_PATH}?fresh=1")
    rows = [_row(m) for m in overview["models"]]
    lines = [
        line
        for m, r in zip(overview["models"], rows, strict=True)
        for line in (r, *_replica_rows(m))
    ]
    backends = overview.get("backends", [])
    if as_json:
        print_json({"models": rows, "backends": backends})
        return
    table = [COLUMNS, *(_cells(r) for r in lines)]
    if not any(r["gpus"] for r in lines):
        table = [line[:GPUS] + line[GPUS + 1 :] for line in table]
    _echo_table(table)
    if backends:
        click.echo("")
        _echo_table([BACKEND_COLUMNS, *(_backend_cells(b) for b in backends)])


def _echo_table(table: list[tuple[str, ...]]) -> None:
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


def _backend_cells(b: dict[str, Any]) -> tuple[str, ...]:
    """A remote backend's row: its last error only while it is failing."""
    error = b["last_error"] if b["state"] == "failing" else ""
    return (
        b["name"],
        b["kind"],
        b["base_url"],
        b["state"],
        str(b["requests"]),
        str(b["failures"]),
        error or "",
    )


def _row(model: dict[str, Any]) -> dict[str, Any]:
    """The supervisor's view of ``model``, plus the worker's own numbers when it answered."""
    row = {
        "name": model["name"],
        "state": model["state"],
        "pid": model["pid"],
        "restarts": model["restarts"],
        "memory_bytes": None,
        "kv_used_bytes": None,
        "kv_reserved_bytes": None,
        "num_running": None,
        "num_waiting": None,
        "output_tps": None,
        "reason": _reason(model),
        "replicas": model.get("replica_rows", []),
        "gpus": model.get("gpus", ""),
        # a vision model's tower weights and encoder peak, as its footprint reserves them
        "vision_weights_bytes": model.get("vision_weights_bytes", 0),
        "encoder_peak_bytes": model.get("encoder_peak_bytes", 0),
    }
    if model["state"] != "ready":
        return row
    if model["worker"] is None:
        row.update(state="unresponsive")  # ready, yet its control did not answer
        return row
    status, stats = model["worker"]["status"], model["worker"]["stats"]
    row.update(
        state=status["state"],
        pid=status["pid"],
        memory_bytes=status["memory"]["active_bytes"],
        kv_used_bytes=status["memory"]["kv_bytes"],
        kv_reserved_bytes=status["memory"].get("kv_reserved_bytes", 0),
        num_running=status["num_running"] + status["num_prefilling"],
        num_waiting=status["num_waiting"],
        output_tps=stats["output_tps_recent"],
    )
    return row


def _reason(model: dict[str, Any]) -> str | None:
    """Why a failed model failed; what a warming one builds (worker/warmup.py)."""
    if model["state"] == "failed":
        return str(model["last_error"])
    return model.get("progress") or None if model["state"] == "warming" else None


def _kv(row: dict[str, Any]) -> str:
    """KV used by requests in flight / held now (the paged pool grows and shrinks)."""
    if row["kv_used_bytes"] is None:
        return "-"
    return f"{format_bytes(row['kv_used_bytes'])}/{format_bytes(row['kv_reserved_bytes'])}"


def _vision(row: dict[str, Any]) -> str:
    """A vision model's reserved tower weights and encoder peak, after its memory."""
    weights, peak = row.get("vision_weights_bytes", 0), row.get("encoder_peak_bytes", 0)
    if not weights and not peak:
        return ""
    return f" (vision {format_bytes(weights)} + encoder peak {format_bytes(peak)})"


def _replica_rows(model: dict[str, Any]) -> list[dict[str, Any]]:
    """One indented line per replica of a model served by several workers (--replicas)."""
    return [
        {
            "name": f"  {model['name']}#{r['index']}",
            "state": r["state"],
            "pid": r["pid"],
            "restarts": r["restarts"],
            "memory_bytes": None,
            "kv_used_bytes": None,
            "kv_reserved_bytes": None,
            "num_running": r["num_running"],
            "num_waiting": r["num_waiting"],
            "output_tps": None,
            "reason": r["last_error"] if r["state"] == "failed" else None,
            "gpus": r.get("gpus", ""),
        }
        for r in model.get("replica_rows", [])
    ]


def _cells(row: dict[str, Any]) -> tuple[str, ...]:
    def text(value: Any, fmt: str = "{}") -> str:
        return "-" if value is None else fmt.format(value)

    memory = row["memory_bytes"]
    return (
        row["name"],
        row["state"],
        text(row["pid"]),
        row["gpus"] or "-",
        "-" if memory is None else format_bytes(memory) + _vision(row),
        _kv(row),
        text(row["num_running"]),
        text(row["num_waiting"]),
        text(row["output_tps"], "{:.1f}"),
        text(row["restarts"]),
        row["reason"] or "",
    )
