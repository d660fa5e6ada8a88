"""Each model's settings (issue #37 point 4): each is one row of mlxd/model_knobs.py, and
``ModelSpec``'s default and check, the ``[models.NAME]`` key that sets it, and (for
``--replicas``, ``--group-size``, ``--distributed``) `mlxd start`'s option all come from it."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from mlxd.cli.backend_options import REMOTE_MODEL_KEYS
from mlxd.cli.config_file import MODEL_KEYS, read_config_file
from mlxd.cli.main import main
from mlxd.cli.start import start_command
from mlxd.config import ModelSpec, RemoteModelSpec, ServeConfig, WorkerConfig
from mlxd.errors import ConfigError
from mlxd.knobs import Knob
from mlxd.model_knobs import GROUP_KNOBS, MODEL_KNOBS, MODEL_OPTIONS, ROUTE_KNOBS

# ModelSpec's fields that are no setting of a [models.NAME] key: who it is and where it runs.
NOT_KNOBS = {"name", "path", "endpoint", "replica_endpoints"}
# A value of each knob's TOML key other than its default, and the field's value it gives.
SET = {
    "aliases": (["q"], ("q",)),
    "keep_alive": ("5m", 300.0),
    "pinned": (True, True),
    "preload": (False, False),
    "kv_cache_gb": (2, 2.0),
    "dtype": ("file", "file"),
    "fallbacks": (["other"], ("other",)),
    "fallback_on_busy": (True, True),
    "replicas": (3, 3),
    "group_size": (2, 2),
    "distributed": ("nccl", "nccl"),
    "gpus": ("0,1", ("0", "1")),
}
# A value of the wrong type for each knob's TOML key, and what the error says it must be.
WRONG_TYPE = {
    "aliases": ('"q"', "a list of names"),
    "keep_alive": ('"soon"', None),  # a duration's own error: "bad duration 'soon'"
    "pinned": ('"yes"', "true or false"),
    "preload": ("1", "true or false"),
    "kv_cache_gb": ('"big"', "a number"),
    "dtype": ("5", "a string"),
    "fallbacks": ("[1]", "a list of names"),
    "fallback_on_busy": ("0", "true or false"),
    "replicas": ('"2"', "an integer"),
    "group_size": ("1.5", "an integer"),
    "distributed": ("true", "a string"),
    "gpus": ("true", None),  # its parser's own error: "bad GPU list True"
}
# The errors of the knobs whose parser reads the TOML value.
PARSE_ERRORS = {"keep_alive": "bad duration", "gpus": "bad GPU list"}
RANGED = [k for k in MODEL_KNOBS if k.minimum is not None or k.choices]


def _toml(value: object) -> str:
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def _read(tmp_path: Path, text: str) -> ModelSpec:
    path = tmp_path / "mlxd.toml"
    path.write_text(f'[models.m]\npath = "org/m"\n{text}\n')
    [spec] = read_config_file(path).models
    return spec


def _out_of_range(knob: Knob[object]) -> object:
    if knob.choices:
        return "nope"
    low = knob.minimum if knob.above else knob.minimum - 1  # type: ignore[operator]
    return knob.kind(low)


def test_every_model_spec_setting_is_a_knob() -> None:
    fields = {f.name for f in dataclasses.fields(ModelSpec)} - NOT_KNOBS
    assert fields == {k.field for k in MODEL_KNOBS} and set(SET) == {k.toml for k in MODEL_KNOBS}


@pytest.mark.parametrize("knob", MODEL_KNOBS, ids=lambda k: k.toml)
def test_model_spec_default_is_the_knobs(knob: Knob[object]) -> None:
    assert getattr(ModelSpec(name="m", path="/p"), knob.field) == knob.default


def test_a_model_tables_keys_are_the_knobs() -> None:
    assert MODEL_KEYS == {"path", "workers", "fallback", *(k.toml for k in MODEL_KNOBS)}
    remote = {"backend", "upstream_model", "fallback", *(k.toml for k in ROUTE_KNOBS)}
    assert REMOTE_MODEL_KEYS == remote
    assert {k.field for k in ROUTE_KNOBS} < {f.name for f in dataclasses.fields(RemoteModelSpec)}


@pytest.mark.parametrize("knob", MODEL_KNOBS, ids=lambda k: k.toml)
def test_each_knobs_toml_key_sets_its_field(tmp_path: Path, knob: Knob[object]) -> None:
    value, field = SET[knob.toml]
    spec = _read(tmp_path, f"{knob.toml} = {_toml(value)}")
    assert getattr(spec, knob.field) == field != knob.default
    assert spec == dataclasses.replace(ModelSpec(name="m", path="org/m"), **{knob.field: field})


def test_fallback_is_an_older_spelling_of_fallbacks(tmp_path: Path) -> None:
    assert _read(tmp_path, 'fallback = ["a"]').fallbacks == ("a",)
    assert _read(tmp_path, 'fallback = ["a"]\nfallbacks = ["b"]').fallbacks == ("b",)


@pytest.mark.parametrize("knob", MODEL_KNOBS, ids=lambda k: k.toml)
def test_a_wrong_type_in_toml_names_the_file_and_key(tmp_path: Path, knob: Knob[object]) -> None:
    text, kind = WRONG_TYPE[knob.toml]
    needle = (
        PARSE_ERRORS[knob.toml]
        if kind is None
        else rf"mlxd.toml: \[models.m\]: {knob.toml} must be "
    )
    with pytest.raises(ConfigError, match=needle + (re.escape(kind) + "$" if kind else "")):
        _read(tmp_path, f"{knob.toml} = {text}")


@pytest.mark.parametrize("knob", RANGED, ids=lambda k: k.toml)
def test_out_of_range_is_the_knobs_rule_from_spec_and_toml(
    tmp_path: Path, knob: Knob[object]
) -> None:
    value = _out_of_range(knob)
    message = f"^model 'm': {re.escape(knob.toml)} must be {re.escape(knob.rule)}"
    with pytest.raises(ConfigError, match=message):
        ModelSpec(name="m", path="/p", **{knob.field: value})
    if knob.parse is None:  # a duration below 0 is no duration at all
        with pytest.raises(ConfigError, match=message):
            _read(tmp_path, f"{knob.toml} = {_toml(value)}")


def test_the_worker_checks_its_groups_knobs() -> None:
    for knob in GROUP_KNOBS:
        value = _out_of_range(knob)
        with pytest.raises(ConfigError, match=f"^worker: {knob.toml} must be {knob.rule}"):
            WorkerConfig(model="m", name="m", endpoint="ipc:///w", **{knob.field: value})


def _option(knob: Knob[object]) -> click.Option:
    options = [p for p in start_command.params if isinstance(p, click.Option)]
    return next(p for p in options if p.name == knob.param)


@pytest.mark.parametrize("knob", MODEL_OPTIONS, ids=lambda k: k.toml)
def test_start_option_is_the_knobs(knob: Knob[object]) -> None:
    option = _option(knob)
    assert option.opts == [knob.flag] and option.help == knob.help and option.default is None
    assert f"`{knob.toml}`" in knob.help  # names the key it wins over
    if knob.choices:
        assert isinstance(option.type, click.Choice) and tuple(option.type.choices) == knob.choices
    elif knob.parse is not None:  # text its parser reads: --gpus 0,1
        assert option.type == click.STRING
    else:
        assert isinstance(option.type, click.IntRange) and option.type.min == knob.minimum


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[ServeConfig]:
    """Configs that `mlxd start` would serve; ``_serve`` (uvicorn + workers) is the edge."""
    from mlxd.cli import start

    seen: list[ServeConfig] = []
    monkeypatch.setattr(start, "_serve", lambda config, log_level: seen.append(config) or 0)
    monkeypatch.setenv("MLXD_HOME", str(tmp_path / "home"))
    return seen


def _start(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> click.testing.Result:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    config = tmp_path / "mlxd.toml"
    config.write_text(f'[models.a]\npath = "{model}"\nreplicas = 2\n[models.b]\npath = "{model}"\n')
    argv = ["start", "--port", "0", "--config", str(config), *args]
    return CliRunner().invoke(main, argv, env={"MLXD_API_KEY": None, **(env or {})})


def test_start_options_set_every_local_model_over_the_file(
    tmp_path: Path, started: list[ServeConfig]
) -> None:
    assert _start(tmp_path).exit_code == 0
    assert [m.replicas for m in started[0].models] == [2, 1]
    given = ("--replicas", "3", "--group-size", "2", "--distributed", "nccl", "--gpus", "0,1")
    result = _start(tmp_path, *given, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert result.exit_code == 0, result.output
    for spec in started[1].models:
        assert (spec.replicas, spec.group_size, spec.distributed) == (3, 2, "nccl")
        assert spec.gpus == ("0", "1")


@pytest.mark.parametrize("knob", [k for k in MODEL_OPTIONS if k in RANGED], ids=lambda k: k.toml)
def test_start_option_refuses_out_of_range_as_a_usage_error(
    tmp_path: Path, started: list[ServeConfig], knob: Knob[object]
) -> None:
    result = _start(tmp_path, knob.flag, str(_out_of_range(knob)))
    assert result.exit_code == 2 and f"Invalid value for '{knob.flag}'" in result.output
    assert not started


@pytest.mark.parametrize(
    ("args", "visible", "error"),
    [
        (("--gpus", "2"), "0,1", "model 'a': gpus 2: GPU 2 is not one of this host's (0, 1)"),
        (("--gpus", "0,,1"), "0,1", "bad GPU list '0,,1': an empty entry"),
        (
            ("--gpus", "1", "--group-size", "2"),
            "0,1",
            "model 'a': gpus 1: too few GPUs for a group of 2",
        ),
        (("--gpus", "0"), "", "model 'a': gpus 0: GPU 0 is not one of this host's (none)"),
    ],
)
def test_start_refuses_gpus_the_host_cannot_give_in_one_line(
    tmp_path: Path, started: list[ServeConfig], args: tuple[str, ...], visible: str, error: str
) -> None:
    result = _start(tmp_path, *args, env={"CUDA_VISIBLE_DEVICES": visible})
    assert result.exit_code != 0 and not started
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: {error}"), line
