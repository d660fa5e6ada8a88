"""`mlxd bench run` against a real daemon: the table, valid JSON, a PNG; scenarios end to end."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from mlxd.cli.main import main
from tests.e2e.conftest import Daemon, free_port, start_daemon, stop_daemon

pytestmark = pytest.mark.e2e
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _bench(daemon: Daemon, *args: str) -> Result:
    cmd = [
        "bench",
        "run",
        "--url",
        daemon.base_url,
        "--model",
        daemon.model,
        "--prompt-tokens",
        "16",
        "--max-tokens",
        "8",
        "--warmup-tokens",
        "2",
        *args,
    ]
    return CliRunner().invoke(main, cmd, catch_exceptions=False)


@pytest.fixture(scope="module")
def throughput(shared_daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    plot = ["--plot", str(out / "bench.png")] if HAS_MATPLOTLIB else []
    result = _bench(shared_daemon, "--concurrency", "1,2", "--json", str(out / "bench.json"), *plot)
    return {"result": result, "dir": out}


def test_run_prints_the_table(throughput: dict[str, Any]) -> None:
    result = throughput["result"]
    assert result.exit_code == 0, result.output
    header, *lines = [x for x in result.stdout.splitlines() if x.strip()][:3]
    assert header.split()[:5] == ["conc", "ok", "fail", "out", "tok/s"] and "speedup" in header
    assert [line.split()[:3] for line in lines] == [["1", "1", "0"], ["2", "2", "0"]]


def test_run_writes_valid_json(throughput: dict[str, Any]) -> None:
    data = json.loads((throughput["dir"] / "bench.json").read_text())
    assert (
        data["kind"] == "http" and data["scenario"] == "throughput" and data["models"] == ["tiny"]
    )
    rows = data["rows"]
    assert [(r["concurrency"], r["ok"], r["failed"]) for r in rows] == [(1, 1, 0), (2, 2, 0)]
    assert all(r["output_tokens"] == 8 * r["ok"] and r["output_tok_s"] > 0 for r in rows)
    assert rows[0]["speedup"] == 1.0 and rows[0]["ttft_p50_ms"] > 0


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is in the [test] extra")
def test_run_writes_a_png(throughput: dict[str, Any]) -> None:
    assert (throughput["dir"] / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_multi_turn_chat_grows_each_conversation(shared_daemon: Daemon, tmp_path: Path) -> None:
    result = _bench(
        shared_daemon,
        "--scenario",
        "multi-turn",
        "--endpoint",
        "chat",
        "--turns",
        "2",
        "--concurrency",
        "2",
        "--json",
        str(tmp_path / "turns.json"),
    )
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "turns.json").read_text())["rows"]
    assert [(r["group"], r["ok"], r["failed"]) for r in rows] == [
        ("all", 4, 0),
        ("turn 1", 2, 0),
        ("turn 2", 2, 0),
    ]


def test_load_from_two_client_processes_counts_every_request(
    shared_daemon: Daemon, tmp_path: Path
) -> None:
    result = _bench(
        shared_daemon,
        "--concurrency",
        "3",
        "--requests-per-level",
        "5",
        "--client-procs",
        "2",
        "--json",
        str(tmp_path / "procs.json"),
    )
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "procs.json").read_text())
    (row,) = data["rows"]
    assert data["client_procs"] == 2 and (row["ok"], row["failed"]) == (5, 0)
    assert row["output_tokens"] == 5 * 8 and row["ttft_p50_ms"] > 0 and row["itl_p50_ms"] > 0
    assert "c=3 run 1/1" in result.output and "5/5" in result.output  # progress from both


def test_shared_prefix_reports_cold_and_hit(shared_daemon: Daemon) -> None:
    result = _bench(
        shared_daemon,
        "--scenario",
        "shared-prefix",
        "--prefix-tokens",
        "64",
        "--concurrency",
        "1",
        "--no-stream",
    )
    assert result.exit_code == 0, result.output
    assert "prefix 64 tokens at concurrency 1: TTFT p50 cold" in result.stdout


def test_images_need_chat(shared_daemon: Daemon) -> None:
    result = _bench(shared_daemon, "--image-size", "32", "--concurrency", "1")
    assert result.exit_code == 2 and "add --endpoint chat" in result.output


def test_shared_image_reports_cold_and_hit_against_a_vlm(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """Each cold request's own image is new to the server (nothing cached); each hit's image
    is the primed one, whose tokens the prefix cache covers."""
    pytest.importorskip("mlx_vlm")
    from tests.e2e.vision_parity import made

    daemon = start_daemon(made(tmp_path_factory, "llava"), name="tiny")
    try:
        out = tmp_path / "image.json"
        args = ["--endpoint", "chat", "--scenario", "shared-image", "--image-size", "64"]
        result = _bench(daemon, *args, "--concurrency", "1", "--runs", "2", "--json", str(out))
    finally:
        stop_daemon(daemon)
    assert result.exit_code == 0, result.output
    assert "image 64x64 at concurrency 1: TTFT p50 cold" in result.stdout
    rows = {r["group"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["cold"]["ok"] == rows["hit"]["ok"] == 2
    assert rows["cold"]["prefix_hit_rate"] == 0 < rows["hit"]["prefix_hit_rate"]


def test_unreachable_server_is_one_line_and_nonzero() -> None:
    free_url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(main, ["bench", "run", "--url", free_url, "--model", "x"])
    assert result.exit_code == 1 and result.output.startswith(f"Error: cannot reach {free_url}")


def test_run_without_model_uses_the_servers_only_model(shared_daemon: Daemon) -> None:
    cmd = [
        "bench",
        "run",
        "--url",
        shared_daemon.base_url,
        "--concurrency",
        "1",
        "--prompt-tokens",
        "8",
        "--max-tokens",
        "2",
        "--warmup-tokens",
        "0",
    ]
    result = CliRunner().invoke(main, cmd, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"--model {shared_daemon.model} (the server's only model)" in result.stderr
    assert [line.split()[:3] for line in result.stdout.splitlines()[1:2]] == [["1", "1", "0"]]


def test_run_without_model_lists_the_choices_when_there_are_several(
    tiny_model: Path, tmp_path: Path
) -> None:
    config = tmp_path / "two.toml"
    config.write_text(f'[models.other]\npath = "{tiny_model}"\npreload = false\n')
    two = start_daemon(tiny_model, "--config", str(config))
    try:
        cmd = ["bench", "run", "--url", two.base_url, "--concurrency", "1"]
        result = CliRunner().invoke(main, cmd, catch_exceptions=False)
    finally:
        stop_daemon(two)
    assert result.exit_code == 1 and not result.stdout
    assert result.stderr.strip() == (
        f"Error: {two.base_url} serves 2 models; pick one or more with --model: other, tiny"
    )
