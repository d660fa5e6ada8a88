"""Agent CLIs as their users run them, pointed at a real daemon (issue 38's "Must show").

The CLIs come from npm into ``.tools/npm`` (``scripts/install --test``); without them these tests
skip and say why.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]

# Claude Code


def _claude_cli() -> Path | None:
    """The ``claude`` CLI of this checkout's ``.tools``, else of the main checkout's."""
    for root in (REPO, Path("/work/main")):
        path = root / ".tools/npm/node_modules/.bin/claude"
        if path.exists():
            return path
    return None


@pytest.fixture(scope="module")
def long_context_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A random tiny model with a 64k context, for Claude Code's ~16k-token first request
    (its system prompt and tools). A random model almost never samples its end token (1 in
    8,192), and Claude Code treats an answer cut at ``max_tokens`` as an error, so a tenth of
    the vocabulary also ends the answer here: a few tokens each, well formed."""
    from mlxd.models.maker import write_model
    from mlxd.models.presets import model_config

    config = model_config("qwen3", "tiny")
    config["max_position_embeddings"] = 65_536
    config["eos_token_id"] = [2, *range(1000, 1800)]
    model = write_model(
        tmp_path_factory.mktemp("models") / "tiny-64k", config, progress=lambda line: None
    )
    log = tmp_path_factory.mktemp("logs") / "requests.log"
    d = start_daemon(model, "--request-log", str(log), "--prefill-chunk", "2048")
    yield d
    stop_daemon(d)


@pytest.mark.parametrize("thinking", ["on", "off"])
def test_claude_code_answers(long_context_daemon: Daemon, tmp_path: Path, thinking: str) -> None:
    """``claude -p`` answers and exits 0, thinking on (its default: ``thinking`` adaptive,
    ``context_management`` clear_thinking, ``?beta=true``, betas, a mid-conversation system
    message) and off (``MAX_THINKING_TOKENS=0``: no ``thinking``)."""
    cli = _claude_cli()
    if cli is None:
        pytest.skip("the Claude Code CLI is not installed (scripts/install --test needs npm)")
    d = long_context_daemon
    env = {
        **os.environ,
        "HOME": str(tmp_path),  # its config, sessions and caches stay here
        "ANTHROPIC_BASE_URL": d.base_url,
        "ANTHROPIC_API_KEY": "dummy",
        "ANTHROPIC_SMALL_FAST_MODEL": d.model,  # titles and quick checks: the same model
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": d.model,
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256",  # its default 32k would not fit the context
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
    }
    if thinking == "off":
        env["MAX_THINKING_TOKENS"] = "0"
    run = subprocess.run(
        [str(cli), "-p", "Say hello in one word.", "--model", d.model],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
    )
    requests = _request_log(d)
    assert run.returncode == 0, (run.stdout, run.stderr[-2000:], requests[-3:])
    assert run.stdout.strip(), (run.stderr[-2000:], requests[-3:])
    assert any(r["endpoint"] == "/v1/messages" and r["status"] == 200 for r in requests)


def _request_log(d: Daemon) -> list[dict[str, object]]:
    """The daemon's request log, one JSON object a request (what failed, if anything)."""
    cmdline = d.proc.args
    assert isinstance(cmdline, list)
    path = Path(cmdline[cmdline.index("--request-log") + 1])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
