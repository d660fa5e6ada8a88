"""Which GPUs a spawned process sees, on a host with several CUDA GPUs.

MLX runs on its process's first visible GPU, so without placement every worker and every rank
of a group lands on GPU 0 while the others idle. Placement is by ``CUDA_VISIBLE_DEVICES``, as
``mlx.launch`` does for NCCL groups: the daemon's worker slots (every replica of every model, in
the configuration's order) take the host's GPUs in turn, a slot of ``g`` ranks
(``--group-size g``) taking ``g`` consecutive ones (wrapping when there are fewer), and rank
``i`` of that group sees the ``i``-th of those. So two models on two GPUs get one each, and two
replicas of one model too. A host with one GPU (every Mac, a one-GPU Linux box, a CPU) gets no
placement: every process shares it. A user's own ``CUDA_VISIBLE_DEVICES`` is the host's list,
so ``CUDA_VISIBLE_DEVICES=2,3 mlxd start`` keeps mlxd on those two.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

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


def for_slots(group_sizes: list[int], gpus: list[str]) -> list[str]:
    """Each worker slot's ``CUDA_VISIBLE_DEVICES`` ("" where there is no choice), the slots
    given by their group sizes in the daemon's order."""
    if len(gpus) < 2:
        return [""] * len(group_sizes)
    out, first = [], 0
    for size in group_sizes:
        out.append(",".join(gpus[(first + i) % len(gpus)] for i in range(size)))
        first += size
    return out


def for_rank(rank: int, gpus: list[str]) -> dict[str, str]:
    """The environment entries that place rank ``rank`` of a group on its replica's GPUs."""
    return {VISIBLE: gpus[rank % len(gpus)]} if len(gpus) >= 2 else {}
