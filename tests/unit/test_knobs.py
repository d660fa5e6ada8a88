"""The config spine (issue #25 point 5): every knob option of `mlxd start`, `mlxd worker serve`
and `mlxd worker set` comes from the one table in mlxd/knobs.py, so names, defaults and ranges
agree everywhere."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
import pytest

from mlxd.cli.start import start_command
from mlxd.cli.worker import serve_command, set_command
from mlxd.config import CacheConfig, ModelSpec, SchedulerConfig, ServeConfig, WorkerConfig
from mlxd.daemon.supervisor import Supervisor
from mlxd.daemon.worker_command import worker_command
from mlxd.errors import ConfigError
from mlxd.gateway.ops import admin
from mlxd.knobs import KNOBS, LIVE_KNOBS, Knob
from mlxd.protocol.messages import SetConfig

KNOB_OPTIONS = {(c.name, k.field): (c, k) for c in (start_command, serve_command) for k in KNOBS}
CONFIGS = {
    "scheduler": (SchedulerConfig,),
    "cache": (CacheConfig,),
    "worker": (WorkerConfig, ServeConfig),
}
_MINIMAL: dict[type, dict[str, object]] = {
    WorkerConfig: {"model": "m", "name": "m", "endpoint": "ipc:///tmp/w.sock"},
    ServeConfig: {"models": ()},
}


def _option(command: click.Command, knob: Knob[object]) -> click.Option:
    return next(p for p in command.params if isinstance(p, click.Option) and p.name == knob.param)


@pytest.mark.parametrize(
    "command, knob", KNOB_OPTIONS.values(), ids=[f"{c}-{k}" for c, k in KNOB_OPTIONS]
)
def test_option_is_the_knobs(command: click.Command, knob: Knob[object]) -> None:
    option = _option(command, knob)
    assert option.opts == [knob.flag] and option.default == knob.default
    assert option.help == knob.help
    if knob.kind is bool:
        assert option.secondary_opts == [f"--no-{knob.flag[2:]}"]
    elif knob.choices:
        assert tuple(option.type.choices) == knob.choices  # type: ignore[attr-defined]
    else:
        names = {"int": "integer", "str": "text"}  # click's names of the types
        assert option.type.name == names.get(knob.kind.__name__, knob.kind.__name__)


@pytest.mark.parametrize("knob", KNOBS, ids=[k.field for k in KNOBS])
def test_config_defaults_are_the_knobs(knob: Knob[object]) -> None:
    for cls in CONFIGS[knob.section]:
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        assert fields[knob.field] == knob.default, cls.__name__


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.minimum is not None], ids=lambda k: k.field)
def test_config_rejects_out_of_range_with_the_knobs_rule(knob: Knob[object]) -> None:
    low = knob.minimum if knob.above else knob.minimum - 1  # type: ignore[operator]
    for cls in CONFIGS[knob.section]:
        if cls is ServeConfig:
            continue  # it needs models; WorkerConfig covers the same check
        with pytest.raises(ConfigError, match=f"^{knob.flag} must be {knob.rule}$"):
            cls(**_MINIMAL.get(cls, {}), **{knob.field: knob.kind(low)})
        if knob.maximum is not None:
            with pytest.raises(ConfigError, match=f"^{knob.flag} must be"):
                cls(**_MINIMAL.get(cls, {}), **{knob.field: knob.kind(knob.maximum + 1)})


def test_worker_set_takes_exactly_the_live_knobs() -> None:
    names = [k.field for k in LIVE_KNOBS]
    assert [f.name for f in dataclasses.fields(SetConfig) if f.name != "request_id"] == names
    assert admin.SETTABLE == {k.field: k.kind for k in LIVE_KNOBS}
    assert all(k.section == "scheduler" for k in LIVE_KNOBS)  # the control plane replaces these
    assert ", ".join(names) in (set_command.help or "")


def test_every_scheduler_and_cache_field_is_a_knob() -> None:
    fields = {f.name for cls in (SchedulerConfig, CacheConfig) for f in dataclasses.fields(cls)}
    assert fields == {k.field for k in KNOBS if k.section in ("scheduler", "cache")}


def test_spawned_worker_gets_the_daemons_knobs_as_one_config(tmp_path: Path) -> None:
    scheduler, cache = SchedulerConfig(max_num_seqs=3, aging_s=2.5), CacheConfig(block_size=16)
    config = ServeConfig(
        models=(ModelSpec(name="m", path="org/m", kv_cache_gb=0.5),),
        scheduler=scheduler,
        cache=cache,
        max_context=99,
    )
    supervisor = Supervisor(config, tmp_path)
    argv = worker_command(supervisor._worker("m"), config, "INFO")
    sent = WorkerConfig.from_json(argv[argv.index("--config-json") + 1])
    assert sent.scheduler == scheduler and sent.max_context == 99 and sent.name == "m"
    assert sent.cache == dataclasses.replace(cache, kv_cache_gb=0.5)  # the model's own budget
    assert not any(a.startswith("--max-num-seqs") for a in argv)


def test_worker_config_json_round_trips_and_rejects_junk() -> None:
    config = WorkerConfig(
        model="m",
        name="n",
        endpoint="ipc:///tmp/w.sock",
        scheduler=SchedulerConfig(prefill_chunk=64),
        buffer_cache_bytes=7,
    )
    assert WorkerConfig.from_json(config.to_json()) == config
    with pytest.raises(ConfigError, match="bad worker config JSON"):
        WorkerConfig.from_json('{"model": "m", "bogus": 1}')
    with pytest.raises(ConfigError, match="--max-num-seqs must be >= 1"):
        WorkerConfig.from_json(config.to_json().replace('"max_num_seqs": 64', '"max_num_seqs": 0'))


def test_every_option_start_and_worker_serve_share_is_a_knob() -> None:
    """An option both commands take must come from the table, or the two could drift apart;
    only the model and the log level are not worker knobs."""

    def flags(command: click.Command) -> set[str]:
        return {o for p in command.params if isinstance(p, click.Option) for o in p.opts}

    shared = flags(start_command) & flags(serve_command)
    assert shared - {k.flag for k in KNOBS} == {"--model", "--log-level"}


def test_priority_names_are_defined_once() -> None:
    """The wire, the API schema, API key tiers, the worker's queue levels and the gateway's
    validation all use ``knobs.PRIORITIES``, in its order (highest first)."""
    from mlxd.config import API_KEY_TIERS
    from mlxd.gateway.ops.openapi import document
    from mlxd.gateway.surfaces.openai.schemas import priority_of
    from mlxd.knobs import PRIORITIES
    from mlxd.worker.sched.sequence import PRIORITY_LEVELS

    assert API_KEY_TIERS == PRIORITIES
    assert sorted(PRIORITY_LEVELS, key=PRIORITY_LEVELS.__getitem__) == list(PRIORITIES)
    assert [priority_of({"priority": p}, None, None) for p in PRIORITIES] == list(PRIORITIES)
    enums = [e for e in _enums(document(["m"])) if "normal" in e]
    assert len(enums) >= 2 and all(e == list(PRIORITIES) for e in enums), enums  # body, header


def _enums(node: object) -> list[list[object]]:
    """Every ``enum`` list in a JSON document."""
    if isinstance(node, dict):
        own = [node["enum"]] if isinstance(node.get("enum"), list) else []
        return own + [e for v in node.values() for e in _enums(v)]
    if isinstance(node, list):
        return [e for v in node for e in _enums(v)]
    return []


def test_the_daemons_kv_budget_is_the_cache_knob_from_file_or_option(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``kv_cache_gb`` at the top of the config file and ``--kv-cache-gb`` set one value,
    ``ServeConfig.cache.kv_cache_gb`` (the option wins); a model's own overrides it, checked
    with the knob's rule."""
    from click.testing import CliRunner

    from mlxd.cli import start
    from mlxd.cli.main import main
    from mlxd.daemon.footprint import kv_cache_gb

    seen: list[ServeConfig] = []
    monkeypatch.setattr(start, "_serve", lambda config, log_level: seen.append(config) or 0)
    monkeypatch.setenv("MLXD_HOME", str(tmp_path / "home"))
    file = tmp_path / "mlxd.toml"
    file.write_text(
        'kv_cache_gb = 2.0\n[models.a]\npath = "/p"\n[models.b]\npath = "/q"\nkv_cache_gb = 0.25\n'
    )
    for extra in ([], ["--kv-cache-gb", "3"]):
        result = CliRunner().invoke(main, ["start", "--port", "0", "--config", str(file), *extra])
        assert result.exit_code == 0, result.output
    (by_file, by_option) = seen
    assert by_file.cache.kv_cache_gb == 2.0 and by_option.cache.kv_cache_gb == 3.0
    a, b = by_file.models
    assert (kv_cache_gb(a, by_file), kv_cache_gb(b, by_file)) == (2.0, 0.25)
    with pytest.raises(ConfigError, match=r"kv_cache_gb must be > 0"):
        ModelSpec(name="m", path="/p", kv_cache_gb=0)
