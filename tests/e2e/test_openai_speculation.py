"""Speculative decoding through the daemon: the official client gets the same greedy text with
and without it, a request opts out with ``speculate: false``, and the worker's acceptance and
tokens per forward show in `mlxd worker stats`, the admin stats and /metrics."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import Daemon, free_port, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

# Repeats itself: prompt lookup has something to propose, and the tiny model loops too.
PROMPT = "def f(x):\n    return x + 1\n\ndef g(x):\n    return x + 1\n\ndef h(x):\n    return"


@pytest.fixture(scope="module")
def speculating(tiny_model: Path) -> Iterator[Daemon]:
    d = start_daemon(tiny_model, "--max-context", "512", "--speculate", "ngram")
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def _stats(d: Daemon) -> dict[str, Any]:
    r = d.admin_get(f"/admin/models/{d.model}/stats")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _complete(d: Daemon, **extra: Any) -> str:
    with openai.OpenAI(base_url=f"{d.base_url}/v1", api_key="unused", max_retries=0) as c:
        r = c.completions.create(
            model=d.model,
            prompt=PROMPT,
            max_tokens=48,
            temperature=0,
            extra_body={"ignore_eos": True, **extra},
        )
    return r.choices[0].text


def test_same_text_opt_out_and_stats(speculating: Daemon) -> None:
    start = _stats(speculating)
    assert start["speculation"] == "ngram"
    plain = _complete(speculating, speculate=False)
    after_plain = _stats(speculating)
    assert after_plain["spec_drafted_tokens"] == start["spec_drafted_tokens"]  # opted out
    spec = _complete(speculating)
    assert spec == plain
    end = _stats(speculating)
    assert end["spec_drafted_tokens"] > after_plain["spec_drafted_tokens"]
    assert end["spec_accepted_tokens"] > 0 and end["tokens_per_forward"] > 1.0
    assert 0 < end["spec_acceptance_rate"] <= 1


def test_the_cli_and_metrics_show_it(speculating: Daemon) -> None:
    _complete(speculating)
    env = {**os.environ, "MLXD_URL": speculating.base_url}
    out = subprocess.run(
        [sys.executable, "-m", "mlxd", "worker", "stats", speculating.model],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "speculation   ngram:" in out.stdout and "tokens per forward" in out.stdout
    deadline = time.monotonic() + 30
    while True:  # the gateway polls its workers every 2 s
        text = httpx.get(f"{speculating.base_url}/metrics", timeout=10).text
        if 'mlxd_tokens_per_forward{model="tiny"}' in text:
            break
        assert time.monotonic() < deadline, "no speculation metrics"
        time.sleep(0.5)
    assert 'mlxd_spec_acceptance_rate{model="tiny"}' in text
    assert "mlxd_worker_spec_accepted_tokens_total" in text


def test_a_bad_speculate_value_is_a_400(speculating: Daemon) -> None:
    body = {"model": speculating.model, "prompt": "hi", "speculate": "yes"}
    r = httpx.post(f"{speculating.base_url}/v1/completions", timeout=30, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "speculate"


def test_off_drafts_nothing(tiny_model: Path) -> None:
    d = start_daemon(tiny_model, "--max-context", "512", "--speculate", "off")
    try:
        text = _complete(d)
        stats = _stats(d)
        assert stats["speculation"] == "off" and stats["spec_drafted_tokens"] == 0
        assert stats["tokens_per_forward"] == 1.0
    finally:
        stop_daemon(d)
    assert text  # the same worker answers as ever


def test_a_draft_model_speculates_through_the_daemon(tiny_model: Path, speculating: Daemon) -> None:
    """``--speculate draft --draft-model`` (the target as its own draft): the same text as
    without speculation, nearly every draft accepted, the mode in `mlxd worker stats`."""
    plain = _complete(speculating, speculate=False)
    d = start_daemon(
        tiny_model, "--max-context", "512", "--speculate", "draft", "--draft-model", str(tiny_model)
    )
    try:
        text = _complete(d)
        stats = _stats(d)
        env = {**os.environ, "MLXD_URL": d.base_url}
        out = subprocess.run(
            [sys.executable, "-m", "mlxd", "worker", "stats", d.model],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        stop_daemon(d)
    assert text == plain
    assert stats["speculation"] == "draft" and stats["spec_acceptance_rate"] > 0.9, stats
    assert out.returncode == 0 and "speculation   draft:" in out.stdout, out.stdout


@pytest.fixture(scope="module")
def other_vocab(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with half its vocabulary: its embedding cut to 4,096 rows."""
    import mlx.core as mx

    out = tmp_path_factory.mktemp("vocab") / "half"
    shutil.copytree(tiny_model, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "vocab_size": 4096}))
    for path in out.glob("*.safetensors"):
        weights = mx.load(str(path))
        cut = {
            k: v[:4096] if "embed_tokens" in k or "lm_head" in k else v for k, v in weights.items()
        }
        mx.save_safetensors(str(path), cut)
    return out


def test_a_draft_model_with_another_vocabulary_is_refused(
    tiny_model: Path, other_vocab: Path
) -> None:
    """The worker refuses to start, once, with the reason; the daemon stays up and says so."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlxd",
            "start",
            "--model",
            f"tiny={tiny_model}",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--speculate",
            "draft",
            "--draft-model",
            str(other_vocab),
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    d = Daemon(proc, f"http://127.0.0.1:{port}", "tiny", tiny_model)
    try:
        info = _failed(d)
        assert info["restarts"] == 0 and "vocabulary has 4096 tokens" in info["last_error"], info
        r = httpx.post(
            f"{d.base_url}/v1/completions",
            timeout=30,
            json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
        )
        assert r.status_code == 503 and "share the target's vocabulary" in r.text, r.text
        time.sleep(1)
        assert _model(d)["restarts"] == 0 and proc.poll() is None  # no crash loop, daemon up
    finally:
        stop_daemon(d)


def _model(d: Daemon) -> dict[str, Any]:
    models = d.admin_get("/admin/status", timeout=10).json()["models"]
    return next(m for m in models if m["name"] == d.model)  # type: ignore[no-any-return]


def _failed(d: Daemon, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert d.proc.poll() is None, "mlxd start exited"
        try:
            info = _model(d)
        except (AssertionError, httpx.HTTPError, ValueError):  # not up yet
            info = {}
        if info.get("state") == "failed":
            return info
        time.sleep(0.2)
    raise AssertionError(f"the model did not fail: {_model(d)}")
