"""Backends and remote models in the config: `[backends.NAME]` tables, `--backend`,
`--backend-key`, `--model NAME=BACKEND:UPSTREAM`, `--fallback`, and what ServeConfig refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxd.cli.backend_options import cli_routes
from mlxd.cli.config_file import read_config_file
from mlxd.config import BackendSpec, ModelSpec, RemoteModelSpec, ServeConfig
from mlxd.errors import ConfigError

UP = BackendSpec(name="up", kind="openai", base_url="http://h:1/v1", api_key_env="UP_KEY")

TOML = """
[backends.up]
kind = "openai"
base_url = "http://gpu:8000/v1"
api_key_env = "UP_KEY"
timeout = "30s"
max_concurrency = 4
headers = { "OpenAI-Organization" = "org-1" }

[models.local]
path = "/models/qwen"
fallbacks = ["fast"]

[models.fast]
backend = "up"
upstream_model = "qwen3-8b"
"""


def test_config_file_reads_backends_and_remote_models(tmp_path: Path) -> None:
    path = tmp_path / "mlxd.toml"
    path.write_text(TOML)
    file = read_config_file(path)
    assert file.backends == (
        BackendSpec(
            name="up",
            kind="openai",
            base_url="http://gpu:8000/v1",
            api_key_env="UP_KEY",
            timeout_s=30.0,
            max_concurrency=4,
            headers=(("OpenAI-Organization", "org-1"),),
        ),
    )
    assert file.remote_models == (
        RemoteModelSpec(name="fast", backend="up", upstream_model="qwen3-8b"),
    )
    assert [(m.name, m.fallbacks) for m in file.models] == [("local", ("fast",))]


def test_a_key_in_the_config_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mlxd.toml"
    path.write_text(TOML.replace('api_key_env = "UP_KEY"', 'api_key = "sk-oops"'))
    with pytest.raises(ConfigError, match="unknown key 'api_key'"):
        read_config_file(path)


def test_cli_splits_remote_from_local_models() -> None:
    models = ("fast=up:qwen3-8b", "q=/models/qwen", "o=ollama:llama3")
    routes = cli_routes(models, ["up=openai:http://gpu:8000/v1"], ["up=UP_KEY"], ["q=fast"], (), ())
    assert routes.local_models == ("q=/models/qwen", "o=ollama:llama3")
    assert routes.backends[0].api_key_env == "UP_KEY"
    assert routes.remote_models == (
        RemoteModelSpec(name="fast", backend="up", upstream_model="qwen3-8b"),
    )
    specs = routes.with_fallbacks((ModelSpec(name="q", path="/models/qwen"),))
    assert specs[0].fallbacks == ("fast",)


@pytest.mark.parametrize(
    ("backends", "keys", "fallbacks", "match"),
    [
        (["up"], [], [], "bad --backend"),
        (["up=grpc:http://h"], [], [], "kind must be one of"),
        (["up=openai:h:1"], [], [], "base_url must start with"),
        (["ollama=openai:http://h"], [], [], "taken by a model source"),
        (["up=openai:http://h"], ["up=sk-not-a-variable-name!"], [], "bad --backend-key"),
        (["up=openai:http://h"], ["other=K"], [], "no backend named 'other'"),
        (["up=openai:http://h"], [], ["nobody=fast"], "no model named 'nobody'"),
    ],
)
def test_cli_mistakes_are_config_errors(
    backends: list[str], keys: list[str], fallbacks: list[str], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        routes = cli_routes(("fast=up:m",), backends, keys, fallbacks, (), ())
        routes.with_fallbacks(())


def test_api_key_comes_from_the_named_variable_only() -> None:
    assert UP.api_key({"UP_KEY": "sk-1"}) == "sk-1"
    with pytest.raises(ConfigError, match="UP_KEY") as info:
        UP.api_key({})
    assert "sk-" not in str(info.value)
    assert "sk-1" not in repr(UP)


@pytest.mark.parametrize(
    ("remote", "match"),
    [
        (RemoteModelSpec(name="r", backend="nope"), "no backend named 'nope'"),
        (RemoteModelSpec(name="r", backend="up", fallbacks=("ghost",)), "fallback 'ghost'"),
        (RemoteModelSpec(name="r", backend="up", fallbacks=("r",)), "fallback 'r'"),
        (RemoteModelSpec(name="local", backend="up"), "must be unique"),
    ],
)
def test_serve_config_checks_routes(remote: RemoteModelSpec, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ServeConfig(
            models=(ModelSpec(name="local", path="p"),), backends=(UP,), remote_models=(remote,)
        )


def test_remote_models_alone_are_enough() -> None:
    config = ServeConfig(
        models=(), backends=(UP,), remote_models=(RemoteModelSpec(name="r", backend="up"),)
    )
    assert config.remote_models[0].upstream == "r"
