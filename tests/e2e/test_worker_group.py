"""A worker group end to end: the tiny model split over two processes (``--group-size 2``,
ring backend on localhost) answers as one process does, batched, and obeys control commands.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Daemon, child_pids, start_daemon, stop_daemon, visible_gpus

pytestmark = [pytest.mark.e2e]

PROMPTS = [f"prompt {i} about things " * (i + 1) for i in range(6)]


@pytest.fixture(scope="module")
def pair(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory, shared_daemon: Daemon
) -> Iterator[tuple[Daemon, Daemon]]:
    """A group of two ranks, which also holds ``m`` (a group of two for a model that cannot be
    split, loaded at its first request only), and one process: the session's shared daemon."""
    from mlxd.models.maker import make_model

    out = tmp_path_factory.mktemp("mamba")
    mamba = make_model(out / "mamba", arch="mamba", size="tiny", progress=lambda line: None)
    config = out / "mlxd.toml"
    config.write_text(f'[models.m]\npath = "{mamba}"\npreload = false\ngroup_size = 2\n')
    group = start_daemon(
        tiny_model,
        "--group-size",
        "2",
        "--distributed",
        "ring",  # on "GPUs" a group's default is nccl: the CPU has ring only
        "--max-context",
        "512",
        "--config",
        str(config),
        env={"CUDA_VISIBLE_DEVICES": "3,4"},
    )
    yield group, shared_daemon
    if group.proc.poll() is None:
        stop_daemon(group)


def greedy(d: Daemon, prompt: str) -> str:
    body = {
        "model": d.model,
        "prompt": prompt,
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
    }
    r = httpx.post(f"{d.base_url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def batched(d: Daemon) -> list[str]:
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda p: greedy(d, p), PROMPTS))


def admin(d: Daemon, path: str, body: dict[str, object] | None = None) -> dict[str, object]:
    with d.admin() as client:
        r = client.post(path, json=body) if body is not None else client.get(path)
    assert r.status_code == 200, r.text
    out: dict[str, object] = r.json()
    return out


def test_the_group_runs_two_ranks(pair: tuple[Daemon, Daemon]) -> None:
    group, _ = pair
    rank0 = group.worker_pid(group.model)
    (rank1,) = child_pids(rank0)  # started by rank 0
    # each rank on its own GPU of the two the host names (the CPU backend ignores them)
    assert [visible_gpus(rank0), visible_gpus(rank1)] == ["3,4", "4"]


def test_a_group_answers_as_one_process_does_batched(pair: tuple[Daemon, Daemon]) -> None:
    group, alone = pair
    assert batched(group) == batched(alone)


def test_a_group_obeys_control_commands(pair: tuple[Daemon, Daemon]) -> None:
    group, alone = pair
    expected = batched(alone)
    base = f"/admin/models/{group.model}"
    assert admin(group, f"{base}/set", {"max_num_seqs": 2})
    status = admin(group, f"{base}/status")
    assert status["scheduler"]["max_num_seqs"] == 2  # type: ignore[index]
    assert admin(group, f"{base}/flush-cache", {})
    assert batched(group) == expected  # requests queue behind 2 rows on every rank alike
    assert admin(group, f"{base}/pause", {})
    assert admin(group, f"{base}/resume", {})
    assert greedy(group, PROMPTS[0]) == expected[0]
    admin(group, f"{base}/set", {"max_num_seqs": 16})


def test_a_model_without_shard_is_refused_with_its_reason(pair: tuple[Daemon, Daemon]) -> None:
    group, _ = pair
    body = {"model": "m", "prompt": "hi", "max_tokens": 2}
    r = httpx.post(f"{group.base_url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 503, r.text
    assert "has no shard()" in r.json()["error"]["message"]
