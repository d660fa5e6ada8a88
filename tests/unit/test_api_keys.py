"""API keys from options and the TOML file; ``ApiKey`` validation never echoes the secret."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxd.cli import start
from mlxd.cli.api_keys import api_keys, load_api_keys
from mlxd.cli.main import main
from mlxd.config import ApiKey, ModelSpec, ServeConfig
from mlxd.errors import ConfigError

SECRET = "sk-very-secret-1234"
GOOD = """
[[keys]]
name = "alice"
key = "sk-alice"
tier = "high"
requests_per_minute = 60
tokens_per_minute = 100000

[[keys]]
key = "sk-anon"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text(text)
    return path


def test_file_keys_follow_cli_keys(tmp_path: Path) -> None:
    keys = api_keys(("sk-cli",), write(tmp_path, GOOD))
    assert keys == (
        ApiKey(name="key-1", key="sk-cli"),
        ApiKey(name="alice", key="sk-alice", tier="high", rpm=60, tpm=100000),
        ApiKey(name="key-3", key="sk-anon"),
    )


def test_no_options_no_keys() -> None:
    assert api_keys((), None) == ()


@pytest.mark.parametrize(
    "text, needle",
    [
        ('[[keys]]\nname = "a"\n', "no 'key'"),
        (f'[[keys]]\nkey = "{SECRET}"\nrpm = 3\n', "unknown field"),
        (f'[[keys]]\nkey = "{SECRET}"\ntier = "vip"\n', "tier"),
        (f'[[keys]]\nkey = "{SECRET}"\nrequests_per_minute = 0\n', "requests_per_minute"),
        (f'[[keys]]\nkey = "{SECRET}"\ntokens_per_minute = true\n', "tokens_per_minute"),
        (f'[[keys]]\nkey = "{SECRET} x"\n', "printable"),
        ("[[keys]]\nkey = 7\n", "key must be a string"),
        (f'key = "{SECRET}"\n', "[[keys]]"),
        ("keys = [", "not valid TOML"),
    ],
)
def test_bad_files_are_refused_without_the_key(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[")) as info:
        load_api_keys(write(tmp_path, text))
    assert SECRET not in info.value.message


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_api_keys(tmp_path / "nope.toml")


def test_repr_leaves_the_key_out() -> None:
    key = ApiKey(name="alice", key=SECRET)
    config = ServeConfig(models=(ModelSpec(name="m", path="/p"),), api_keys=(key,))
    assert SECRET not in repr(key) and SECRET not in repr(config)


def test_serve_config_refuses_duplicate_names_and_keys() -> None:
    models = (ModelSpec(name="m", path="/p"),)
    with pytest.raises(ConfigError, match="names must be unique"):
        ServeConfig(models=models, api_keys=(ApiKey("a", "k1"), ApiKey("a", "k2")))
    with pytest.raises(ConfigError, match="twice") as info:
        ServeConfig(models=models, api_keys=(ApiKey("a", SECRET), ApiKey("b", SECRET)))
    assert SECRET not in info.value.message


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[ServeConfig]:
    """Configs that `mlxd start` would serve; ``_serve`` (uvicorn + workers) is the edge."""
    seen: list[ServeConfig] = []
    monkeypatch.setattr(start, "_serve", lambda config, log_level: seen.append(config) or 0)
    return seen


def test_start_options_become_config(tmp_path: Path, started: list[ServeConfig]) -> None:
    args = [
        "start",
        "--model",
        "m=/p",
        "--port",
        "0",
        "--api-key",
        "sk-a",
        "--api-key",
        "sk-b",
        "--api-keys-file",
        str(write(tmp_path, GOOD)),
        "--log-prompts",
    ]
    result = CliRunner().invoke(main, args, env={"MLXD_API_KEY": None})
    assert result.exit_code == 0, result.output
    [config] = started
    assert [k.name for k in config.api_keys] == ["key-1", "key-2", "alice", "key-4"]
    assert config.log_prompts


def test_start_reads_mlxd_api_key_and_hides_file_errors(
    tmp_path: Path, started: list[ServeConfig]
) -> None:
    result = CliRunner().invoke(
        main, ["start", "--model", "m=/p", "--port", "0"], env={"MLXD_API_KEY": "sk-env-1 sk-env-2"}
    )
    assert result.exit_code == 0, result.output
    assert [k.key for k in started[0].api_keys] == ["sk-env-1", "sk-env-2"]
    bad = write(tmp_path, f'[[keys]]\nkey = "{SECRET}"\ntier = "vip"\n')
    args = ["start", "--model", "m=/p", "--port", "0", "--api-keys-file", str(bad)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "tier" in result.output and SECRET not in result.output
