"""Placement: the GPUs each worker slot runs on, its number of ranks and their backend.

Decided once when the daemon starts, from the host's GPUs (``mlxd.gpus.visible``):

- A model with ``gpus`` (its ``[models.NAME]`` key, or `mlxd start --gpus`) runs there: replica
  ``r`` takes the ``r``-th run of ``group_size`` entries of its list, wrapping.
- The other models' slots, in the configuration's order, take the GPUs that no model names in
  turn (``g`` consecutive ones for a group of ``g`` ranks), or every GPU where none is left.
- A model without ``group_size`` that does not fit one GPU's ``--max-memory`` but whose rank's
  share (``footprint.device_share``) fits becomes a group of the fewest ranks that fit, one per
  GPU, and the log says why. ``distributed`` unset: nccl for a group on the CUDA GPUs, else ring.

A host with one GPU or none (every Mac, the CPU) places nothing: every worker sees what the
daemon sees, and models keep the group size they were given (1 unless set).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from mlxd.config import ModelSpec
from mlxd.daemon.footprint import Footprint, device_share
from mlxd.errors import ConfigError

log = logging.getLogger("mlxd.supervisor")


@dataclass(frozen=True)
class Placement:
    """Where one worker slot runs: its ``CUDA_VISIBLE_DEVICES`` ("": no choice), its ranks
    (``--group-size``) and their ``mlx.distributed`` backend."""

    gpus: str
    group_size: int
    distributed: str


# Public API


def check(specs: Sequence[ModelSpec], visible: list[str]) -> None:
    """Refuse a model's ``gpus`` that names a GPU this host does not show, or has fewer GPUs
    than its group's ranks (where there are several GPUs to choose from)."""
    for spec in specs:
        if spec.endpoint is not None or not spec.gpus:
            continue
        where = f"model {spec.name!r}: gpus {','.join(spec.gpus)}"
        missing = [g for g in spec.gpus if g not in visible]
        if missing:
            shown = ", ".join(visible) or "none"
            raise ConfigError(f"{where}: GPU {missing[0]} is not one of this host's ({shown})")
        if len(visible) > 1 and len(set(spec.gpus)) < (spec.group_size or 1):
            raise ConfigError(f"{where}: too few GPUs for a group of {spec.group_size}")


def place(
    specs: Sequence[ModelSpec], sizes: Sequence[Footprint], visible: list[str], budget: int | None
) -> list[list[Placement]]:
    """Each model's slots (one per replica) as placed, in the order of ``specs``; ``sizes``
    are their footprints (attached models: any)."""
    check(specs, visible)
    named = {g for s in specs if s.endpoint is None for g in s.gpus}
    free = [g for g in visible if g not in named] or visible
    out, first = [], 0
    for spec, size in zip(specs, sizes, strict=True):
        ranks = _ranks(spec, size, budget, len(spec.gpus or visible) if len(visible) > 1 else 1)
        if spec.endpoint is not None or len(visible) < 2:
            out.append([_unplaced(spec, ranks)] * spec.num_replicas)
            continue
        pool = list(spec.gpus) or (free if len(free) >= ranks else visible)
        starts = [r * ranks for r in range(spec.num_replicas)]
        if not spec.gpus:
            starts, first = [first + s for s in starts], first + len(starts) * ranks
        out.append([_on(spec, ranks, _take(pool, s, ranks)) for s in starts])
    return out


# Internal helpers


def _ranks(spec: ModelSpec, size: Footprint, budget: int | None, gpus: int) -> int:
    """``spec``'s group size: its own, else 1, else (too big for one GPU's budget) the fewest
    of its ``gpus`` whose ranks' shares fit."""
    if spec.group_size is not None or spec.endpoint is not None:
        return spec.group_size or 1
    if budget is None or size.total_bytes <= budget:
        return 1
    for ranks in range(2, gpus + 1):
        share = device_share(size, ranks).total_bytes
        if share <= budget:
            log.info(
                "%s needs %.2f GB, more than one GPU's --max-memory budget of %.2f GB: placed "
                "on a group of %d GPUs (%.2f GB each)",
                spec.name,
                size.total_bytes / 2**30,
                budget / 2**30,
                ranks,
                share / 2**30,
            )
            return ranks
    return 1  # fits nowhere: its load says so, with the budget


def _take(pool: list[str], first: int, count: int) -> str:
    """``count`` consecutive entries of ``pool`` from ``first``, wrapping."""
    return ",".join(pool[(first + i) % len(pool)] for i in range(count))


def _on(spec: ModelSpec, ranks: int, gpus: str) -> Placement:
    return Placement(gpus, ranks, spec.distributed or ("nccl" if ranks > 1 else "ring"))


def _unplaced(spec: ModelSpec, ranks: int) -> Placement:
    return Placement("", ranks, spec.distributed or "ring")
