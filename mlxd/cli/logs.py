"""`mlxd logs`: the daemon's request log, filtered, as a table or exported as JSON lines or CSV.

It reads the rotating file the daemon writes (``gateway/http/request_log.py``), so it works whether
or not the daemon still runs. Filters combine (all must match).
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click

from mlxd.config import data_dir
from mlxd.errors import ConfigError
from mlxd.gateway.http.request_log import FILE_NAME, RequestLogFile
from mlxd.units import parse_duration

COLUMNS = (
    "time",
    "request_id",
    "method",
    "endpoint",
    "status",
    "model",
    "key",
    "stream",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "finish_reason",
    "ttft_ms",
    "e2e_ms",
)
FORMATS = ("table", "jsonl", "csv")
_TABLE = (
    "time",
    "status",
    "model",
    "key",
    "endpoint",
    "prompt_tokens",
    "completion_tokens",
    "e2e_ms",
)
Line = dict[str, Any]


@click.command("logs")
@click.option(
    "--file",
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="MLXD_REQUEST_LOG",
    help=f"The request log (env MLXD_REQUEST_LOG; default: {FILE_NAME} in the data "
    "dir, as `mlxd start --request-log` writes it).",
)
@click.option(
    "--since",
    default=None,
    metavar="DURATION|TIME",
    help="Only requests since then: 90s, 10m, 2h, or an ISO time (UTC if no offset).",
)
@click.option("--model", default=None, help="Only this model's requests.")
@click.option(
    "--status",
    default=None,
    metavar="CODES",
    help="Only these statuses, comma-separated: 200, 429, 4xx, 5xx.",
)
@click.option("--key", default=None, metavar="NAME", help="Only the requests of this API key name.")
@click.option(
    "--format",
    "fmt",
    default="table",
    show_default=True,
    metavar="|".join(FORMATS),
    help="table for people; jsonl or csv to export.",
)
def logs_command(
    path: Path | None,
    since: str | None,
    model: str | None,
    status: str | None,
    key: str | None,
    fmt: str,
) -> None:
    """Requests the daemon served: time, status, model, key name, tokens, latency."""
    if fmt not in FORMATS:
        raise click.ClickException(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    log_file = RequestLogFile(path or data_dir() / FILE_NAME)
    if not log_file.files():
        raise click.ClickException(
            f"no request log at {log_file.path} (the daemon writes it "
            "unless started with --request-log off)"
        )
    tests = [
        t
        for t in (_since(since), _equal("model", model), _status(status), _equal("key", key))
        if t is not None
    ]
    lines = (line for line in log_file.lines() if all(test(line) for test in tests))
    _WRITERS[fmt](lines)


# Internal helpers


def _since(text: str | None) -> Callable[[Line], bool] | None:
    if text is None:
        return None
    start = _parse_since(text)
    return lambda line: _time(line) >= start


def _parse_since(text: str) -> datetime:
    try:
        return datetime.now(UTC) - timedelta(seconds=parse_duration(text))
    except ConfigError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise click.ClickException(
            f"bad --since {text!r}: use e.g. 10m, 2h or 2025-01-31T12:00"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _time(line: Line) -> datetime:
    try:
        return datetime.fromisoformat(str(line.get("time")))
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)


def _equal(field: str, value: str | None) -> Callable[[Line], bool] | None:
    return None if value is None else lambda line: line.get(field) == value


def _status(text: str | None) -> Callable[[Line], bool] | None:
    if text is None:
        return None
    codes = [c.strip().lower() for c in text.split(",") if c.strip()]
    bad = [
        c for c in codes if not (len(c) == 3 and (c.isdigit() or c[1:] == "xx" and c[0].isdigit()))
    ]
    if bad or not codes:
        raise click.ClickException(f"bad --status {text!r}: use codes or classes like 200,4xx")
    return lambda line: any(_matches(str(line.get("status")), c) for c in codes)


def _matches(status: str, code: str) -> bool:
    return status == code or (code.endswith("xx") and status[:1] == code[0])


def _write_jsonl(lines: Iterable[Line]) -> None:
    for line in lines:
        click.echo(json.dumps(line, ensure_ascii=False, separators=(",", ":")))


def _write_csv(lines: Iterable[Line]) -> None:
    writer = csv.DictWriter(
        sys.stdout, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n"
    )
    writer.writeheader()
    for line in lines:
        writer.writerow({c: _csv_value(line.get(c)) for c in COLUMNS})


def _csv_value(value: Any) -> Any:
    return "" if value is None else json.dumps(value) if isinstance(value, bool) else value


def _write_table(lines: Iterable[Line]) -> None:
    rows: list[tuple[str, ...]] = [
        ("TIME", "STATUS", "MODEL", "KEY", "ENDPOINT", "IN", "OUT", "MS")
    ]
    rows += [tuple(_cell(line, c) for c in _TABLE) for line in lines]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _cell(line: Line, column: str) -> str:
    value = line.get(column)
    if column == "time" and value:
        return str(value)[:23].replace("T", " ")
    return "-" if value is None else str(value)


_WRITERS: dict[str, Callable[[Iterator[Line]], None]] = {
    "table": _write_table,
    "jsonl": _write_jsonl,
    "csv": _write_csv,
}
