"""The pool's pure parts: sizes, durations, the TOML config file, LRU eviction, footprints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxd.cli.config_file import read_config_file
from mlxd.config import (
    VIEW_SHARE,
    CacheConfig,
    ModelSpec,
    SchedulerConfig,
    ServeConfig,
)
from mlxd.daemon.budget import Resident, evictions
from mlxd.daemon.footprint import RUNTIME_BYTES, footprint, kv_bytes_per_token
from mlxd.errors import ConfigError
from mlxd.units import parse_duration, parse_memory


@pytest.mark.parametrize(
    "text, expected",
    [
        ("16GB", 16 * 2**30),
        ("1.5G", 3 * 2**29),
        ("512MiB", 512 * 2**20),
        ("2", 2 * 2**30),
        ("1000b", 1000),
        ("50%", 500),
        ("100 %", 1000),
    ],
)
def test_parse_memory(text: str, expected: int) -> None:
    assert parse_memory(text, total_bytes=1000) == expected


@pytest.mark.parametrize("text", ["", "GB", "-1GB", "0", "12XB", "150%", "0%", "abc"])
def test_parse_memory_refuses_bad_sizes(text: str) -> None:
    with pytest.raises(ConfigError, match="bad memory size"):
        parse_memory(text, total_bytes=1000)


@pytest.mark.parametrize(
    "text, expected", [("300", 300), ("30s", 30), ("5m", 300), ("1h", 3600), ("0", 0), (2.5, 2.5)]
)
def test_parse_duration(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "5d", "-1", "m"])
def test_parse_duration_refuses_bad_values(text: str) -> None:
    with pytest.raises(ConfigError, match="bad duration"):
        parse_duration(text)


def r(name: str, size: int, used: float, evictable: bool = True) -> Resident:
    return Resident(name, size, used, evictable)


def test_evictions_pick_least_recently_used_idle_workers_only() -> None:
    residents = [r("old", 4, 1.0), r("pinned", 4, 0.0, False), r("new", 4, 3.0)]
    assert evictions(4, 16, residents) == []  # 4 free already
    assert evictions(6, 16, residents) == ["old"]
    assert evictions(10, 16, residents) == ["old", "new"]
    assert evictions(14, 16, residents) is None  # the pinned one would have to go


def test_config_file_reads_models_and_pool_settings(tmp_path: Path) -> None:
    path = tmp_path / "mlxd.toml"
    path.write_text("""
max_memory = "75%"
keep_alive = "10m"
[models.qwen]
path = "org/qwen"
aliases = ["q"]
pinned = true
keep_alive = 0
[models.other]
path = "org/other"
preload = false
kv_cache_gb = 0.5
""")
    file = read_config_file(path)
    assert file.settings == {"max_memory_bytes": parse_memory("75%"), "keep_alive_s": 600}
    qwen, other = file.models
    assert qwen == ModelSpec(
        name="qwen", path="org/qwen", aliases=("q",), keep_alive_s=0, pinned=True
    )
    assert not other.preload and other.kv_cache_gb == 0.5 and other.keep_alive_s is None
    config = ServeConfig(models=file.models, keep_alive_s=600)
    assert config.keep_alive(qwen) == 0 and config.keep_alive(other) == 600


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[models.a]\naliases = []", "path"),
        ("colour = 1", "unknown key 'colour'"),
        ('[models.a]\npath = "p"\npinned = "yes"', "pinned must be true or false"),
        ('[models.a]\npath = "p"\nkeep_alive = "soon"', "bad duration"),
        ("[models", "mlxd.toml"),
    ],
)
def test_config_file_errors_name_the_key(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "mlxd.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        read_config_file(path)


def test_aliases_must_not_clash_with_names() -> None:
    with pytest.raises(ConfigError, match="unique"):
        ServeConfig(
            models=(ModelSpec(name="a", path="p"), ModelSpec(name="b", path="p", aliases=("a",)))
        )


def test_footprint_counts_safetensors_kv_and_headroom(tmp_path: Path) -> None:
    config_json = {
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "torch_dtype": "float32",
        "max_position_embeddings": 4096,
    }
    (tmp_path / "config.json").write_text(json.dumps(config_json))
    (tmp_path / "model-1.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "model-2.safetensors").write_bytes(b"x" * 24)
    assert kv_bytes_per_token(config_json) == 2 * 2 * 2 * 16 * 4
    spec = ModelSpec(name="m", path=str(tmp_path))
    size = footprint(spec, ServeConfig(models=(spec,), max_context=100))
    assert size.weights_bytes == 1024
    # bytes/token x max_num_seqs x context in the pool, and decode's view beside it (paged)
    assert size.kv_bytes == int(512 * 64 * 100 / (1 - VIEW_SHARE))
    contiguous = ServeConfig(models=(spec,), max_context=100, cache=CacheConfig(paged=False))
    assert footprint(spec, contiguous).kv_bytes == 512 * 64 * 100
    assert size.headroom_bytes == RUNTIME_BYTES + (1024 + size.kv_bytes) // 10
    pinned_kv = ModelSpec(name="m", path=str(tmp_path), kv_cache_gb=1.0)
    assert footprint(pinned_kv, ServeConfig(models=(spec,))).kv_bytes == 2**30


def test_a_vision_models_footprint_counts_its_tower_and_feature_cache(tmp_path: Path) -> None:
    from mlxd.models.vision_layout import FEATURE_CACHE_BYTES

    text = {"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 16}
    config_json = {"text_config": {**text, "torch_dtype": "float32"}, "vision_config": {}}
    (tmp_path / "config.json").write_text(json.dumps(config_json))
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"x" * 1000)  # language model
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"x" * 24)  # vision tower
    spec = ModelSpec(name="m", path=str(tmp_path), kv_cache_gb=0.5)
    size = footprint(spec, ServeConfig(models=(spec,)))
    assert size.weights_bytes == 1024
    assert size.headroom_bytes == (
        RUNTIME_BYTES + (1024 + size.kv_bytes) // 10 + FEATURE_CACHE_BYTES
    )


def test_footprint_counts_the_draft_models_weights_and_caches(tmp_path: Path) -> None:
    for name, layers, size in (("target", 2, 1000), ("draft", 1, 200)):
        (tmp_path / name).mkdir()
        config_json = {
            "num_hidden_layers": layers,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "torch_dtype": "float32",
        }
        (tmp_path / name / "config.json").write_text(json.dumps(config_json))
        (tmp_path / name / "model.safetensors").write_bytes(b"x" * size)
    spec = ModelSpec(name="m", path=str(tmp_path / "target"))
    plain = footprint(spec, ServeConfig(models=(spec,), max_context=100))
    scheduler = SchedulerConfig(speculate="draft", draft_model=str(tmp_path / "draft"))
    drafted = footprint(spec, ServeConfig(models=(spec,), max_context=100, scheduler=scheduler))
    assert drafted.weights_bytes == plain.weights_bytes + 200
    # the draft's own caches: 1 layer's K and V per token, every row a full context
    assert drafted.kv_bytes == plain.kv_bytes + 2 * 2 * 16 * 4 * 64 * 100


QWEN3_06B_ATTENTION = {
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 1024,
    "torch_dtype": "bfloat16",
}


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[ServeConfig]:
    """Configs that `mlxd start` would serve; ``_serve`` (uvicorn + workers) is the edge."""
    from mlxd.cli import start

    seen: list[ServeConfig] = []
    monkeypatch.setattr(start, "_serve", lambda config, log_level: seen.append(config) or 0)
    monkeypatch.setenv("MLXD_HOME", str(tmp_path / "home"))
    return seen


def test_max_memory_with_kv_bits_4_reserves_about_a_quarter_of_the_float_kv(
    tmp_path: Path, started: list[ServeConfig]
) -> None:
    """`mlxd start --max-memory ... --kv-bits 4`: the KV the daemon reserves, and hands the
    worker as its pool's budget, is what the quantized pool takes (packed words, a scale and a
    bias per 64 values), not the float figure."""
    from click.testing import CliRunner

    from mlxd.cli.main import main
    from mlxd.daemon.supervisor import Supervisor
    from mlxd.daemon.worker_command import worker_config

    model = tmp_path / "qwen3-0.6b"  # its config.json alone: 28 layers, 8 KV heads of 128
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_06B_ATTENTION))
    args = ["start", "--port", "0", "--model", f"m={model}", "--max-memory", "64GiB"]
    args += ["--max-num-seqs", "2", "--max-context", "4096", "--dtype", "bfloat16"]
    for extra in ([], ["--kv-bits", "4"]):
        result = CliRunner().invoke(main, [*args, *extra], env={"MLXD_API_KEY": None})
        assert result.exit_code == 0, result.output
    reserved, handed = [], []
    for config in started:
        worker = Supervisor(config, tmp_path / "run").workers["m"]
        reserved.append(worker.size.kv_bytes)
        handed.append(worker_config(worker, config).cache.kv_cache_gb * 2**30)
    assert handed == pytest.approx(reserved)
    # per token and layer: 8 heads x (K + V) x (64 bytes of 4-bit words + 2 x 2 bytes of scale
    # and bias per 64 values) against 8 x 2 x 256 bytes in bfloat16
    assert reserved[1] / reserved[0] == pytest.approx(72 / 256, rel=1e-6)
