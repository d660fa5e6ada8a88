"""`mlxd logs` on the request log a real daemon writes: each filter, both exports, rotation, and
no prompt or key in the file."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from mlxd.cli.logs import COLUMNS
from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

ALICE, BOB = "sk-alice-0123456789abcdef", "sk-bob-fedcba9876543210"
PROMPT = "the-secret-prompt-text"
NUM_HEALTH = 30  # enough /health lines to rotate the 8 KiB file at least once


@dataclass
class Traffic:
    daemon: Daemon
    log: Path
    between: str  # an ISO time after the first request and before the others
    num_lines: int


def mlxd_logs(log: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXD_")}
    return subprocess.run(
        [sys.executable, "-m", "mlxd", "logs", "--file", str(log), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def jsonl(log: Path, *args: str) -> list[dict[str, object]]:
    r = mlxd_logs(log, "--format", "jsonl", *args)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.fixture(scope="module")
def traffic(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traffic]:
    home = tmp_path_factory.mktemp("logs")
    keys = home / "keys.toml"
    keys.write_text(
        f'[[keys]]\nname = "alice"\nkey = "{ALICE}"\n[[keys]]\nname = "bob"\nkey = "{BOB}"\n'
    )
    log = home / "requests.log"
    d = start_daemon(
        tiny_model,
        "--api-keys-file",
        str(keys),
        "--log-prompts",
        "--request-log",
        str(log),
        "--request-log-size",
        "8KB",
    )
    url, chat = d.base_url, {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2}
    try:
        _post(url, ALICE, {"model": d.model, **chat})
        time.sleep(0.05)
        between = datetime.now(UTC).isoformat()
        time.sleep(0.05)
        _post(url, BOB, {"model": d.model, "prompt": PROMPT, "max_tokens": 2}, "/v1/completions")
        _post(url, BOB, {"model": "nope", **chat})  # 404
        _post(url, "sk-wrong", {"model": d.model, **chat})  # 401
        for _ in range(NUM_HEALTH):
            httpx.get(f"{url}/health")
        yield Traffic(d, log, between, _wait_lines(log, 1 + 4 + NUM_HEALTH))
    finally:
        stop_daemon(d)


def _post(url: str, key: str, body: dict[str, object], path: str = "/v1/chat/completions") -> None:
    httpx.post(url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _wait_lines(log: Path, at_least: int) -> int:
    """Lines in the log files, once the last response's line is written (it follows the body)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        count = sum(len(p.read_text().splitlines()) for p in log.parent.glob("requests.log*"))
        if count >= at_least:
            return count
        time.sleep(0.05)
    raise AssertionError(f"fewer than {at_least} lines in {log}")


def test_the_file_rotates_and_logs_reads_every_file_in_order(traffic: Traffic) -> None:
    assert Path(f"{traffic.log}.1").exists() and traffic.log.stat().st_size <= 8 * 1024
    lines = jsonl(traffic.log)
    assert len(lines) == traffic.num_lines
    times = [str(line["time"]) for line in lines]
    assert times == sorted(times)
    assert lines[-1]["endpoint"] == "/health"


def test_the_file_holds_no_prompt_and_no_key(traffic: Traffic) -> None:
    text = "".join(p.read_text() for p in traffic.log.parent.glob("requests.log*"))
    assert '"key":"alice"' in text
    for secret in (PROMPT, ALICE, BOB, "sk-wrong"):
        assert secret not in text


def test_filter_by_model(traffic: Traffic) -> None:
    lines = jsonl(traffic.log, "--model", traffic.daemon.model)
    # The 401 never reached a model and the 404 named an unknown one: neither has a model.
    assert [(x["endpoint"], x["key"]) for x in lines] == [
        ("/v1/chat/completions", "alice"),
        ("/v1/completions", "bob"),
    ]


def test_filter_by_status(traffic: Traffic) -> None:
    assert sorted(int(str(x["status"])) for x in jsonl(traffic.log, "--status", "4xx")) == [
        401,
        404,
    ]
    assert [x["status"] for x in jsonl(traffic.log, "--status", "404")] == [404]
    assert len(jsonl(traffic.log, "--status", "200,5xx")) == traffic.num_lines - 2


def test_filter_by_key(traffic: Traffic) -> None:
    lines = jsonl(traffic.log, "--key", "bob")
    assert [(x["endpoint"], x["status"]) for x in lines] == [
        ("/v1/completions", 200),
        ("/v1/chat/completions", 404),
    ]


def test_filter_since_a_time_and_a_duration(traffic: Traffic) -> None:
    later = jsonl(traffic.log, "--since", traffic.between)
    assert len(later) == traffic.num_lines - 2 and later[0]["key"] == "bob"  # after /health, alice
    assert len(jsonl(traffic.log, "--since", "1h")) == traffic.num_lines
    assert jsonl(traffic.log, "--since", "2099-01-01T00:00") == []


def test_csv_export_has_a_header_and_a_row_per_request(traffic: Traffic) -> None:
    r = mlxd_logs(traffic.log, "--format", "csv", "--key", "alice")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert r.stdout.splitlines()[0] == ",".join(COLUMNS)
    assert [(x["model"], x["status"], x["key"], x["completion_tokens"]) for x in rows] == [
        (traffic.daemon.model, "200", "alice", "2")
    ]


def test_table_is_the_default(traffic: Traffic) -> None:
    r = mlxd_logs(traffic.log, "--status", "401")
    assert r.returncode == 0, r.stderr
    header, row = r.stdout.splitlines()
    assert header.split()[:4] == ["TIME", "STATUS", "MODEL", "KEY"] and " 401 " in row


@pytest.mark.parametrize(
    "args",
    [("--status", "9"), ("--since", "yesterday"), ("--format", "xml")],
)
def test_bad_input_is_one_line_and_exit_1(traffic: Traffic, args: tuple[str, ...]) -> None:
    r = mlxd_logs(traffic.log, *args)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert args[0] in r.stderr


def test_no_log_file_is_one_line_and_exit_1(tmp_path: Path) -> None:
    r = mlxd_logs(tmp_path / "none.log")
    assert r.returncode == 1 and "no request log at" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
