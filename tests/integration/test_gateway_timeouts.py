"""Per-endpoint timeouts: 408 before the headers, an in-stream error after; the worker is told."""

from __future__ import annotations

import httpx
import pytest
from scripted_worker import MODEL, ScriptedWorker


def ask(prompt: str, **fields: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], **fields}


@pytest.mark.parametrize("stream", [False, True])
def test_silent_worker_gives_408(
    short_http: httpx.Client, worker: ScriptedWorker, stream: bool
) -> None:
    rid = f"silent-{stream}"
    body = ask("SILENT", stream=stream)
    response = short_http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": rid})
    assert response.status_code == 408
    assert response.json()["error"]["code"] == "timeout"
    assert worker.wait_cancel(f"{rid}.") is not None


def test_completion_timeout_applies(short_http: httpx.Client, worker: ScriptedWorker) -> None:
    body = {"model": MODEL, "prompt": "SILENT", "max_tokens": 5}
    response = short_http.post("/v1/completions", json=body, headers={"X-Request-Id": "ct"})
    assert response.status_code == 408
    generate = worker.wait_generate("ct.")
    assert generate is not None and generate.timeout_s == 0.3


def test_slow_stream_ends_with_timeout_event(
    short_http: httpx.Client, worker: ScriptedWorker
) -> None:
    body = ask("SLOW", stream=True)
    response = short_http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "slow"})
    assert response.status_code == 200
    events = [e for e in response.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert '"code":"timeout"' in events[-2]
    assert worker.wait_cancel("slow.") is not None
