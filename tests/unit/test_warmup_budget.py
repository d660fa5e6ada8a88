"""The warm-up's bound at load (worker/warmup.py): ``--warmup-s`` when given, else by device."""

from __future__ import annotations

import pytest

from mlxd.config import SchedulerConfig
from mlxd.errors import ConfigError
from mlxd.worker.warmup import GPU_WARMUP_S, warmup_budget


def test_by_default_a_gpu_warms_up_and_the_cpu_does_not() -> None:
    default = SchedulerConfig().warmup_s
    assert warmup_budget(default, "gpu") == GPU_WARMUP_S > 0
    assert warmup_budget(default, "cpu") == 0


def test_a_given_bound_holds_on_either_device() -> None:
    assert warmup_budget(SchedulerConfig(warmup_s=0).warmup_s, "gpu") == 0
    assert warmup_budget(SchedulerConfig(warmup_s=5).warmup_s, "cpu") == 5


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ConfigError, match="warmup"):
        SchedulerConfig(warmup_s=-1)
