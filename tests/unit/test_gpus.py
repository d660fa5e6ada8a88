"""The host's GPUs: the list mlxd places on, a model's ``gpus`` as written, a rank's GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxd import gpus
from mlxd.errors import ConfigError


def test_visible_reads_the_users_list_first(tmp_path: Path) -> None:
    for i in range(4):
        (tmp_path / f"0000:0{i}:00.0").mkdir()
    assert gpus.visible({"CUDA_VISIBLE_DEVICES": "2, 3"}, tmp_path) == ["2", "3"]
    assert gpus.visible({}, tmp_path) == ["0", "1", "2", "3"]
    assert gpus.visible({}, tmp_path / "absent") == []  # no NVIDIA driver: a Mac, a CPU


def test_a_gpu_list_is_text_a_number_or_a_toml_list() -> None:
    assert gpus.parse_gpus("1") == ("1",)
    assert gpus.parse_gpus(" 0, 1") == ("0", "1")
    assert gpus.parse_gpus(1) == ("1",)
    assert gpus.parse_gpus([0, "1"]) == ("0", "1")


@pytest.mark.parametrize("bad", ["", "0,,1", "0,", [], [0, ""], True, 1.5, [True], {"a": 1}])
def test_a_gpu_list_with_an_empty_or_odd_entry_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="^bad GPU list .*: .*use indices such as 1 or 0,1$"):
        gpus.parse_gpus(bad)


def test_ranks_take_their_replicas_gpus_in_order() -> None:
    assert gpus.for_rank(1, ["2", "3"]) == {"CUDA_VISIBLE_DEVICES": "3"}
    assert gpus.for_rank(3, ["2", "3"]) == {"CUDA_VISIBLE_DEVICES": "3"}
    assert gpus.for_rank(1, ["0"]) == {}  # one GPU: nothing to choose
