"""The prefix cache's disk tier through the whole daemon (issue 21 point 3): a prefix hit
survives a restart, a corrupted block file is skipped with a warning and the answer is
unchanged, and the files stay under --kv-disk-gb."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

PROMPT = [3 + (11 * j) % 200 for j in range(300)]  # 18 full blocks of 16, then 12 tokens


def daemon_in(home: Path, *extra: str, stderr: Any = None) -> Daemon:
    return start_daemon(
        Path(home / "model"),
        "--kv-disk-gb",
        "0.01",
        "--kv-block-size",
        "16",
        *extra,
        env={"MLXD_HOME": str(home)},
        stderr=stderr,
    )


@pytest.fixture
def home(tmp_path: Path, tiny_model: Path) -> Path:
    (tmp_path / "model").symlink_to(tiny_model)
    return tmp_path


def complete(d: Daemon, prompt: list[int]) -> dict[str, Any]:
    body = {"model": d.model, "prompt": prompt, "max_tokens": 12, "temperature": 0}
    r = httpx.post(f"{d.base_url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def block_files(home: Path) -> list[Path]:
    return sorted((home / "kv-cache").glob("*/*.kvb"))


def test_a_prefix_hit_survives_a_restart(home: Path) -> None:
    d = daemon_in(home)
    first = complete(d, PROMPT)
    assert cached(first) == 0
    assert stop_daemon(d) == 0
    assert len(block_files(home)) >= 18  # spilled at shutdown
    d = daemon_in(home)
    try:
        again = complete(d, PROMPT)
    finally:
        stop_daemon(d)
    assert cached(again) == 18 * 16
    assert again["choices"][0]["text"] == first["choices"][0]["text"]


def test_a_corrupt_block_file_is_skipped_with_a_warning(home: Path) -> None:
    d = daemon_in(home)
    first = complete(d, PROMPT)
    stop_daemon(d)
    files = block_files(home)
    for path in files[::2]:  # flip a payload byte in half the files, truncate one
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))
    files[1].write_bytes(files[1].read_bytes()[:100])
    log = home / "daemon.log"
    with log.open("wb") as stderr:
        d = daemon_in(home, "--log-level", "warning", stderr=stderr)
        try:
            again = complete(d, PROMPT)
        finally:
            stop_daemon(d)
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    assert cached(again) < 18 * 16  # the chain stops at the first bad block
    assert "KV disk cache: skipped" in log.read_text()


def test_the_files_stay_under_the_cap(home: Path) -> None:
    cap = 0.0005  # GiB: 524 KiB, about 60 of the tiny model's 8.5 KiB blocks
    d = daemon_in(home, "--kv-disk-gb", str(cap), "--kv-cache-gb", "0.002", "--kv-idle-s", "0")
    try:
        for i in range(12):  # 12 x 18 blocks, more than the pool and the cap hold
            complete(d, [t + i for t in PROMPT])
    finally:
        stop_daemon(d)
    sizes = [p.stat().st_size for p in block_files(home)]
    assert 40 <= len(sizes) and sum(sizes) <= cap * 2**30


# Models on their own mlx-lm caches (recurrent state): snapshots on disk. (Sliding-window
# models are paged, with no disk tier: docs/BATCHING.md.)


@pytest.fixture(params=[("mamba", {})], ids=["state-space"])
def native_home(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    from mlxd.models.maker import make_model

    arch, extra = request.param
    make_model(tmp_path / "model", arch=arch, size="tiny", progress=lambda line: None, **extra)
    return tmp_path


def snapshot_files(home: Path) -> list[Path]:
    return sorted((home / "kv-cache").glob("*/*.safetensors"))


def test_a_snapshot_hit_survives_a_restart(native_home: Path) -> None:
    d = daemon_in(native_home)
    first = complete(d, PROMPT)
    assert cached(first) == 0
    assert stop_daemon(d) == 0
    assert snapshot_files(native_home)  # saved at shutdown
    d = daemon_in(native_home)
    try:
        again = complete(d, PROMPT)
    finally:
        stop_daemon(d)
    assert cached(again) == 18 * 16  # the prompt's last block boundary
    assert again["choices"][0]["text"] == first["choices"][0]["text"]


def test_a_corrupt_or_truncated_snapshot_is_skipped_with_a_warning(native_home: Path) -> None:
    d = daemon_in(native_home)
    first = complete(d, PROMPT)
    stop_daemon(d)
    files = snapshot_files(native_home)
    for path in files[::2]:
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))
    for path in files[1::2]:
        path.write_bytes(path.read_bytes()[:100])
    log = native_home / "daemon.log"
    with log.open("wb") as stderr:
        d = daemon_in(native_home, "--log-level", "warning", stderr=stderr)
        try:
            again = complete(d, PROMPT)
        finally:
            stop_daemon(d)
    assert cached(again) == 0
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    assert "KV disk cache: skipped" in log.read_text()


def test_snapshot_files_stay_under_the_cap(native_home: Path) -> None:
    cap = 0.0003  # GiB: 315 KiB, a few of the tiny models' snapshots
    d = daemon_in(native_home, "--kv-disk-gb", str(cap), "--kv-cache-gb", "0.0005")
    try:
        for i in range(8):
            complete(d, [t + i for t in PROMPT])
    finally:
        stop_daemon(d)
    sizes = [p.stat().st_size for p in snapshot_files(native_home)]
    assert sizes and sum(sizes) <= cap * 2**30
