"""The warm-up's bound at load (worker/warmup.py): ``--warmup-s`` when given, else by device;
and what a first start on CUDA says while no compiled kernel is kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxd.config import SchedulerConfig
from mlxd.errors import ConfigError
from mlxd.worker.warmup import GPU_WARMUP_S, kernel_note, warmup_budget


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


def test_a_start_on_cuda_with_no_kernel_kept_says_it_may_take_minutes(tmp_path: Path) -> None:
    folder = tmp_path / "kernels"
    env = {"MLX_PTX_CACHE_DIR": str(folder)}
    note = kernel_note(env, cuda=True)
    assert str(folder) in note and "minutes" in note  # not made yet
    (folder / "sub").mkdir(parents=True)
    assert "minutes" in kernel_note(env, cuda=True)  # folders, no kernel
    (folder / "sub" / "gemv_bf16.ptx").write_text("//")
    assert kernel_note(env, cuda=True) == ""  # a kernel kept: later starts say nothing
    assert kernel_note({"MLX_PTX_CACHE_DIR": str(tmp_path / "none")}, cuda=False) == ""
    assert kernel_note({}, cuda=True) == ""  # MLX's own folder, not ours to look in
