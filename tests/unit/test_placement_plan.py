"""Placement (issue 40): each worker slot's GPUs, ranks and backend from the models' ``gpus``,
``group_size`` and footprints, the host's GPUs and the per-GPU ``--max-memory`` budget."""

from __future__ import annotations

import pytest

from mlxd.config import ModelSpec
from mlxd.daemon.footprint import RUNTIME_BYTES, Footprint, device_share
from mlxd.daemon.placement import Placement, check, place
from mlxd.errors import ConfigError

FOUR = ["0", "1", "2", "3"]
GB = 2**30
SMALL = Footprint(GB, GB, RUNTIME_BYTES)  # 2 GB and the runtime


def spec(name: str, **knobs: object) -> ModelSpec:
    return ModelSpec(name=name, path="/m", **knobs)  # type: ignore[arg-type]


def gpus_of(specs: list[ModelSpec], visible: list[str], **kw: object) -> list[list[str]]:
    sizes = [kw.get("size", SMALL)] * len(specs)
    budget = kw.get("budget")
    placed = place(specs, sizes, visible, budget)  # type: ignore[arg-type]
    return [[p.gpus for p in slots] for slots in placed]


def test_without_gpus_slots_take_the_gpus_in_turn_and_wrap() -> None:
    five = [spec(f"m{i}") for i in range(5)]
    assert gpus_of(five, FOUR) == [["0"], ["1"], ["2"], ["3"], ["0"]]
    mixed = [spec("a", group_size=2), spec("b"), spec("c", group_size=2)]
    assert gpus_of(mixed, FOUR) == [["0,1"], ["2"], ["3,0"]]
    assert gpus_of([spec("x", replicas=2)], ["4", "6"]) == [["4", "6"]]


def test_a_models_gpus_are_its_own_and_the_others_take_the_rest() -> None:
    models = [spec("a"), spec("pinned", gpus=("1",)), spec("b"), spec("c")]
    assert gpus_of(models, ["0", "1", "2"]) == [["0"], ["1"], ["2"], ["0"]]
    every = [spec("p", gpus=("0",)), spec("q", gpus=("1",)), spec("r")]
    assert gpus_of(every, ["0", "1"]) == [["0"], ["1"], ["0"]]  # none left: all, in turn


def test_replicas_take_group_size_of_their_gpus_in_turn_wrapping() -> None:
    replicas = spec("x", replicas=3, gpus=("2", "3"))
    assert gpus_of([replicas], FOUR) == [["2", "3", "2"]]
    groups = spec("g", replicas=2, group_size=2, gpus=("0", "1", "2"))
    assert gpus_of([groups], FOUR) == [["0,1", "2,0"]]


def test_a_group_on_gpus_talks_nccl_unless_told_and_a_lone_worker_ring() -> None:
    placed = place(
        [spec("g", group_size=2), spec("r", group_size=2, distributed="ring")],
        [SMALL, SMALL],
        FOUR,
        None,
    )
    assert placed == [[Placement("0,1", 2, "nccl")], [Placement("2,3", 2, "ring")]]
    assert place([spec("one")], [SMALL], FOUR, None) == [[Placement("0", 1, "ring")]]


def test_one_gpu_or_none_places_nothing_and_keeps_the_group_size() -> None:
    for visible in (["0"], []):
        placed = place([spec("g", group_size=2), spec("b")], [SMALL, SMALL], visible, GB)
        assert placed == [[Placement("", 2, "ring")], [Placement("", 1, "ring")]]
    assert gpus_of([spec("p", gpus=("0",))], ["0"]) == [[""]]


def test_a_model_too_big_for_one_gpu_is_a_group_of_the_fewest_that_hold_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", "mlxd.supervisor")
    big = Footprint(10 * GB, 2 * GB, RUNTIME_BYTES + GB)
    budget = device_share(big, 3).total_bytes  # 2 ranks' shares do not fit, 3 do
    assert device_share(big, 2).total_bytes > budget >= device_share(big, 3).total_bytes
    placed = place([spec("big"), spec("b")], [big, SMALL], FOUR, budget)
    assert placed == [[Placement("0,1,2", 3, "nccl")], [Placement("3", 1, "ring")]]
    assert "big needs 13.25 GB, more than one GPU's --max-memory budget" in caplog.text
    assert "placed on a group of 3 GPUs" in caplog.text
    on_its_own = place(
        [spec("big", gpus=("2", "3"))], [big], FOUR, device_share(big, 2).total_bytes
    )
    assert on_its_own == [[Placement("2,3", 2, "nccl")]]


def test_a_model_that_fits_or_has_its_group_size_or_fits_nowhere_is_left_alone() -> None:
    big = Footprint(10 * GB, 2 * GB, RUNTIME_BYTES + GB)
    assert place([spec("big")], [big], FOUR, big.total_bytes)[0][0].group_size == 1
    assert place([spec("big", group_size=1)], [big], FOUR, GB)[0][0].group_size == 1
    assert place([spec("big")], [big], FOUR, GB)[0][0].group_size == 1  # its load says why
    assert place([spec("big")], [big], ["0"], GB)[0][0] == Placement("", 1, "ring")  # the CPU


def test_a_share_splits_weights_kv_and_headroom_but_not_the_runtime() -> None:
    size = Footprint(10 * GB, 4 * GB, RUNTIME_BYTES + 2 * GB)
    assert device_share(size, 2) == Footprint(5 * GB, 2 * GB, RUNTIME_BYTES + GB)
    assert device_share(size, 1) is size


@pytest.mark.parametrize(
    ("model", "visible", "error"),
    [
        (
            spec("m", gpus=("5",)),
            ["0", "1"],
            "^model 'm': gpus 5: GPU 5 is not one of this host's \\(0, 1\\)$",
        ),
        (spec("m", gpus=("0",)), [], "GPU 0 is not one of this host's \\(none\\)$"),
        (
            spec("m", gpus=("1",), group_size=2),
            ["0", "1"],
            "^model 'm': gpus 1: too few GPUs for a group of 2$",
        ),
    ],
)
def test_check_refuses_gpus_the_host_cannot_give(
    model: ModelSpec, visible: list[str], error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        check([model], visible)


def test_check_takes_a_one_gpu_group_and_attached_models() -> None:
    check([spec("m", gpus=("0",), group_size=2)], ["0"])  # one GPU: every rank shares it
    check([ModelSpec(name="w", path="tcp://h:1", endpoint="tcp://h:1", gpus=("9",))], ["0"])
