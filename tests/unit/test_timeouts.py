"""Per-endpoint request timeouts come from `mlxd start` options and the --config file."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxd.cli import start
from mlxd.cli.main import main
from mlxd.config import ModelSpec, ServeConfig
from mlxd.errors import ConfigError

MODEL = "m=/p"


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[ServeConfig]:
    """Configs that `mlxd start` would serve; ``_serve`` (uvicorn + workers) is the edge."""
    seen: list[ServeConfig] = []
    monkeypatch.setattr(start, "_serve", lambda config, log_level: seen.append(config) or 0)
    monkeypatch.setenv("MLXD_HOME", str(tmp_path / "home"))
    return seen


def _start(*args: str) -> None:
    result = CliRunner().invoke(main, ["start", "--port", "0", *args], env={"MLXD_API_KEY": None})
    assert result.exit_code == 0, result.output


def test_defaults_are_15_10_and_2_minutes(started: list[ServeConfig]) -> None:
    _start("--model", MODEL)
    [c] = started
    assert (c.chat_timeout_s, c.completion_timeout_s, c.embeddings_timeout_s) == (900, 600, 120)


def test_options_set_each_timeout(started: list[ServeConfig]) -> None:
    _start(
        "--model",
        MODEL,
        "--chat-timeout",
        "30m",
        "--completion-timeout",
        "45",
        "--embeddings-timeout",
        "1m",
    )
    [c] = started
    assert (c.chat_timeout_s, c.completion_timeout_s, c.embeddings_timeout_s) == (1800, 45, 60)


def test_the_config_file_sets_them_and_options_win(
    tmp_path: Path, started: list[ServeConfig]
) -> None:
    file = tmp_path / "mlxd.toml"
    file.write_text('chat_timeout = "20m"\nembeddings_timeout = 30\n[models.m]\npath = "/p"\n')
    _start("--config", str(file), "--embeddings-timeout", "5s")
    [c] = started
    assert (c.chat_timeout_s, c.completion_timeout_s, c.embeddings_timeout_s) == (1200, 600, 5)


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_bad_timeout_is_refused(value: str, started: list[ServeConfig]) -> None:
    result = CliRunner().invoke(main, ["start", "--model", MODEL, "--chat-timeout", value])
    assert result.exit_code == 1
    assert "--chat-timeout" in result.output or "bad duration" in result.output
    assert not started


def test_serve_config_refuses_a_zero_timeout() -> None:
    with pytest.raises(ConfigError, match="--embeddings-timeout"):
        ServeConfig(models=(ModelSpec(name="m", path="/p"),), embeddings_timeout_s=0)
