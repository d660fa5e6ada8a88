"""Which GPUs a spawned process sees, on a host with several CUDA GPUs.

MLX runs on its process's first visible GPU, so without placement every worker and every rank
of a group lands on GPU 0 while the others idle. Placement is by ``CUDA_VISIBLE_DEVICES``, as
``mlx.launch`` does for NCCL groups: the daemon gives each worker slot its GPUs
(daemon/placement.py: a model's own ``gpus``, else the host's GPUs in turn), and rank ``i`` of
a group sees the ``i``-th of its slot's. A host with one GPU (every Mac, a one-GPU Linux box, a
CPU) gets no placement: every process shares it. A user's own ``CUDA_VISIBLE_DEVICES`` is the
host's list, so ``CUDA_VISIBLE_DEVICES=2,3 mlxd start`` keeps mlxd on those two.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from mlxd.errors import ConfigError

VISIBLE = "CUDA_VISIBLE_DEVICES"
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one entry per GPU the driver sees (Linux)


def visible(environ: Mapping[str, str] = os.environ, driver: Path = NVIDIA_GPUS) -> list[str]:
    """This process's GPUs as ``CUDA_VISIBLE_DEVICES`` entries: its own list when set, else
    one index per GPU the NVIDIA driver lists, else none."""
    listed = environ.get(VISIBLE)
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    try:
        return [str(i) for i in range(len(list(driver.iterdir())))]
    except OSError:
        return []


def parse_gpus(value: object) -> tuple[str, ...]:
    """A model's ``gpus`` as written: ``"1"``, ``"0,1"``, ``1`` or ``[0, 1]`` -> ``("0", "1")``;
    entries of the host's list (``visible``), checked against it when the daemon starts."""
    items = [value] if isinstance(value, int) else value
    items = items.split(",") if isinstance(items, str) else items
    if not isinstance(items, list) or not all(_is_entry(g) for g in items):
        raise ConfigError(f"bad GPU list {value!r}: use indices such as 1 or 0,1")
    entries = tuple(str(g).strip() for g in items)
    if not entries or not all(entries):
        raise ConfigError(f"bad GPU list {value!r}: an empty entry; use indices such as 1 or 0,1")
    return entries


def _is_entry(item: object) -> bool:
    return isinstance(item, int | str) and not isinstance(item, bool)


def for_rank(rank: int, gpus: list[str]) -> dict[str, str]:
    """The environment entries that place rank ``rank`` of a group on its replica's GPUs."""
    return {VISIBLE: gpus[rank % len(gpus)]} if len(gpus) >= 2 else {}
