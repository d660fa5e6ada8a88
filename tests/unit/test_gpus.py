"""GPU placement: replicas and ranks spread over the host's GPUs, nothing on one GPU."""

from __future__ import annotations

from pathlib import Path

from mlxd import gpus


def test_visible_reads_the_users_list_first(tmp_path: Path) -> None:
    for i in range(4):
        (tmp_path / f"0000:0{i}:00.0").mkdir()
    assert gpus.visible({"CUDA_VISIBLE_DEVICES": "2, 3"}, tmp_path) == ["2", "3"]
    assert gpus.visible({}, tmp_path) == ["0", "1", "2", "3"]
    assert gpus.visible({}, tmp_path / "absent") == []  # no NVIDIA driver: a Mac, a CPU


def test_slots_take_the_gpus_in_turn_and_wrap() -> None:
    four = ["0", "1", "2", "3"]
    assert gpus.for_slots([1, 1, 1, 1, 1], four) == ["0", "1", "2", "3", "0"]
    assert gpus.for_slots([2, 1, 2], four) == ["0,1", "2", "3,0"]
    assert gpus.for_slots([1, 1], ["4", "6"]) == ["4", "6"]


def test_ranks_take_their_replicas_gpus_in_order() -> None:
    assert gpus.for_rank(1, ["2", "3"]) == {"CUDA_VISIBLE_DEVICES": "3"}
    assert gpus.for_rank(3, ["2", "3"]) == {"CUDA_VISIBLE_DEVICES": "3"}


def test_one_gpu_or_none_places_nothing() -> None:
    assert gpus.for_slots([2, 1], ["0"]) == ["", ""]
    assert gpus.for_slots([1], []) == [""]
    assert gpus.for_rank(1, ["0"]) == {}
