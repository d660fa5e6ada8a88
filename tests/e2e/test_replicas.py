"""Replicas end to end: one model served by two local workers (``--replicas 2``).

Both serve; a replica killed mid-traffic loses only the requests it had started streaming (the
others finish, and requests it had not answered yet move to the other replica); multi-turn
conversations keep hitting the replica that holds their prefix, which round robin does not.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon, visible_gpus

pytestmark = [pytest.mark.e2e]

CONVERSATIONS = 3
TURNS = 4


@pytest.fixture(scope="module")
def replicated(tiny_model: Path) -> Iterator[Daemon]:
    # Two "GPUs" named: the CPU backend ignores them, the placement is still visible
    d = start_daemon(
        tiny_model, "--replicas", "2", "--max-context", "2048", env={"CUDA_VISIBLE_DEVICES": "5,7"}
    )
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def replicas(d: Daemon) -> list[dict[str, Any]]:
    (model,) = d.admin_get("/admin/status").json()["models"]
    rows: list[dict[str, Any]] = model["replica_rows"]
    return rows


def client(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.base_url}/v1", api_key="unused", max_retries=0)


def ask(d: Daemon, prompt: str, max_tokens: int = 4) -> str:
    out = client(d).completions.create(model=d.model, prompt=prompt, max_tokens=max_tokens)
    return out.choices[0].finish_reason


def wait_ready(d: Daemon, timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = replicas(d)
        if all(r["state"] == "ready" for r in rows):
            return rows
        time.sleep(0.2)
    raise AssertionError(f"replicas not ready: {rows}")


def hit_rate(d: Daemon, tag: str) -> float:
    """Cached / prompt tokens over the later turns of multi-turn chats run one after another."""
    cached = prompt = 0
    for c in range(CONVERSATIONS):
        system = f"{tag} conversation {c}: " + " ".join(f"fact{c}-{i}" for i in range(60))
        messages = [{"role": "system", "content": system}]
        for turn in range(TURNS):
            messages.append({"role": "user", "content": f"question {turn} of {c}, please"})
            out = client(d).chat.completions.create(
                model=d.model,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=3,
                temperature=0,
            )
            messages.append({"role": "assistant", "content": out.choices[0].message.content})
            if turn:
                assert out.usage is not None and out.usage.prompt_tokens_details is not None
                cached += out.usage.prompt_tokens_details.cached_tokens or 0
                prompt += out.usage.prompt_tokens
    return cached / prompt


def test_both_replicas_serve_and_are_shown(replicated: Daemon) -> None:
    with ThreadPoolExecutor(6) as pool:
        reasons = list(pool.map(lambda i: ask(replicated, f"prompt number {i} " * 8), range(8)))
    assert reasons == ["length"] * 8
    rows = replicas(replicated)
    assert [r["state"] for r in rows] == ["ready", "ready"]
    assert all(r["routed"] > 0 for r in rows), rows
    assert len({r["pid"] for r in rows}) == 2
    (model,) = httpx.get(f"{replicated.base_url}/v1/models").json()["data"]
    assert model["replicas"] == 2
    metrics = httpx.get(f"{replicated.base_url}/metrics").text
    assert 'mlxd_replica_ready{model="tiny",replica="1"} 1.0' in metrics
    overview = replicated.admin_get("/admin/overview").json()["models"][0]
    assert overview["replicas"] == 2 and len(overview["replica_rows"]) == 2
    env = {**os.environ, "MLXD_URL": replicated.base_url}
    ps = subprocess.run(
        [sys.executable, "-m", "mlxd", "ps"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    ).stdout
    for row in rows:
        assert re.search(rf"tiny#{row['index']}\s+ready\s+{row['pid']}\s", ps), ps


def test_each_replica_runs_on_its_own_gpu_and_says_which(replicated: Daemon) -> None:
    rows = wait_ready(replicated)
    assert [visible_gpus(r["pid"]) for r in rows] == ["5", "7"]
    assert [r["gpus"] for r in rows] == ["5", "7"]
    env = {**os.environ, "MLXD_URL": replicated.base_url}
    ps = subprocess.run(
        [sys.executable, "-m", "mlxd", "ps"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    ).stdout
    assert re.search(r"^MODEL\s+STATE\s+PID\s+GPUS\s", ps, re.M), ps
    assert re.search(r"^tiny\s+\w+\s+\d+\s+5,7\s", ps, re.M), ps
    for row in rows:
        assert re.search(rf"tiny#{row['index']}\s+ready\s+{row['pid']}\s+{row['gpus']}\s", ps), ps


def test_conversations_keep_their_replica_unlike_round_robin(
    replicated: Daemon, tiny_model: Path
) -> None:
    affinity = hit_rate(replicated, "affinity")
    rr_daemon = start_daemon(
        tiny_model, "--replicas", "2", "--max-context", "2048", "--routing", "round_robin"
    )
    try:
        round_robin = hit_rate(rr_daemon, "round robin")
    finally:
        stop_daemon(rr_daemon)
    print(f"prefix hit rate: cache-aware {affinity:.2f}, round robin {round_robin:.2f}")
    assert affinity >= 0.75, affinity  # each later turn reuses all earlier whole blocks
    assert affinity >= round_robin + 0.25, (affinity, round_robin)


def stream(d: Daemon, i: int, started: threading.Barrier) -> str:
    """A long streamed completion: "length", or the error code it ended with."""
    body = {
        "model": d.model,
        "prompt": f"stream {i} " * 6,
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }
    first = True
    with httpx.stream("POST", f"{d.base_url}/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if first:
                first = False
                started.wait()
            if "error" in data:
                return str(data["error"]["code"])
            if data["choices"][0]["finish_reason"]:
                return str(data["choices"][0]["finish_reason"])
    return "no end"


def test_a_killed_replica_loses_only_its_streaming_requests(replicated: Daemon) -> None:
    wait_ready(replicated)
    n = 6
    started = threading.Barrier(n + 1)
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(stream, replicated, i, started) for i in range(n)]
        started.wait(timeout=60)  # every stream has its first token
        rows = replicas(replicated)
        on_victim = rows[1]["in_flight"]
        assert 0 < on_victim < n, rows
        os.kill(rows[1]["pid"], signal.SIGKILL)
        ends = [f.result(timeout=120) for f in futures]
    assert ends.count("worker_unavailable") == on_victim, ends
    assert ends.count("length") == n - on_victim, ends
    assert ask(replicated, "after the kill") == "length"  # replica 0 serves meanwhile
    rows = wait_ready(replicated)
    assert rows[1]["restarts"] == 1


def test_requests_not_yet_answered_move_to_the_other_replica(replicated: Daemon) -> None:
    rows = wait_ready(replicated)
    victim = rows[1]["pid"]
    os.kill(victim, signal.SIGSTOP)  # hung: what it was sent gets no answer
    try:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(ask, replicated, f"moved {i} " * 8, 8) for i in range(4)]
            deadline = time.monotonic() + 10
            while replicas(replicated)[1]["in_flight"] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert replicas(replicated)[1]["in_flight"] > 0  # some went to the hung replica
            os.kill(victim, signal.SIGKILL)
            assert [f.result(timeout=60) for f in futures] == ["length"] * 4
    finally:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_ready(replicated)
