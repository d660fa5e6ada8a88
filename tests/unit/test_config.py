from __future__ import annotations

import pytest

from mlxd.config import ModelSpec, SchedulerConfig, ServeConfig, WorkerConfig, data_dir
from mlxd.errors import ConfigError


def test_data_dir_follows_injected_environ(tmp_path: object) -> None:
    assert str(data_dir({"MLXD_HOME": "/x/y"})) == "/x/y"
    assert str(data_dir({"XDG_DATA_HOME": "/d", "HOME": "/h"})) == "/d/mlxd"


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"max_num_seqs": 0}, "max-num-seqs"),
        ({"prefill_chunk": 1}, "prefill-chunk"),
        ({"stream_interval": 0}, "stream-interval"),
        ({"aging_s": 0}, "priority-aging"),
    ],
)
def test_scheduler_config_rejects_bad_values(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        SchedulerConfig(**kwargs)  # type: ignore[arg-type]


def test_serve_config_needs_unique_models_and_valid_port() -> None:
    m = ModelSpec(name="a", path="/p")
    with pytest.raises(ConfigError, match="unique"):
        ServeConfig(models=(m, m))
    with pytest.raises(ConfigError, match="port"):
        ServeConfig(models=(m,), port=70000)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"max_crashes": 0}, "max-crashes"),
        ({"crash_window_s": 0}, "crash-window"),
        ({"restart_backoff_s": -1}, "restart-backoff"),
    ],
)
def test_serve_config_rejects_bad_restart_limits(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        ServeConfig(models=(ModelSpec(name="a", path="/p"),), **kwargs)  # type: ignore[arg-type]


def test_worker_config_rejects_bad_endpoint() -> None:
    with pytest.raises(ConfigError, match="endpoint"):
        WorkerConfig(model="m", name="m", endpoint="http://x")


def test_speculate_draft_and_a_draft_model_go_together() -> None:
    assert SchedulerConfig(speculate="draft", draft_model="/m/draft").draft_model == "/m/draft"
    for kw in ({"speculate": "draft"}, {"speculate": "ngram", "draft_model": "/m/draft"}):
        with pytest.raises(ConfigError, match="--speculate draft and --draft-model PATH"):
            SchedulerConfig(**kw)  # type: ignore[arg-type]
