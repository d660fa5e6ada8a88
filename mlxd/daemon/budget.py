"""The memory budget: which idle workers to unload so that a new one fits (LRU first).

``evictions`` is the policy on plain values; the functions below it apply it to the supervisor's
worker slots. Every worker that is starting, ready or stopping holds its ``Footprint`` against
``--max-memory``; only ready, idle, unpinned, local ones may be unloaded to make room.

On a host with several GPUs, where workers are placed (daemon/placement.py), the budget is each
GPU's: a worker competes only with those sharing one of its GPUs, so a model on GPU 1 never
unloads one on GPU 0 and two GPUs hold twice the models. A group whose ranks have GPUs of their
own counts one rank's share of its footprint on each (``footprint.device_share``), so a model
too big for one GPU fits on two. Unplaced workers (one GPU, a Mac, the CPU) share one budget,
a group's whole footprint in it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlxd.daemon.footprint import device_share

if TYPE_CHECKING:
    from mlxd.daemon.worker_process import WorkerProcess


@dataclass(frozen=True)
class Resident:
    """A worker holding memory: its footprint, when it last served, and whether it may go."""

    name: str
    bytes: int
    last_used: float
    evictable: bool  # ready, idle and not pinned


def evictions(need: int, budget: int, residents: list[Resident]) -> list[str] | None:
    """The least recently used evictable residents to unload so ``need`` more bytes fit in
    ``budget``: ``[]`` when it fits already, ``None`` when no choice makes it fit."""
    free = budget - sum(r.bytes for r in residents)
    chosen: list[str] = []
    for r in sorted((r for r in residents if r.evictable), key=lambda r: r.last_used):
        if free >= need:
            break
        chosen.append(r.name)
        free += r.bytes
    return chosen if free >= need else None


def residents(workers: Iterable[WorkerProcess]) -> list[WorkerProcess]:
    """The workers that hold memory now: starting, ready or stopping."""
    return [w for w in workers if w.state in ("starting", "warming", "ready", "stopping")]


def neighbours(worker: WorkerProcess, workers: Iterable[WorkerProcess]) -> list[WorkerProcess]:
    """The residents other than ``worker`` whose memory ``worker``'s budget counts: those on
    one of its GPUs (every one, where workers are not placed)."""
    mine = set(worker.gpus.split(",")) if worker.gpus else None
    return [
        w
        for w in residents(workers)
        if w is not worker and (mine is None or not w.gpus or bool(mine & set(w.gpus.split(","))))
    ]


def device_bytes(worker: WorkerProcess) -> int:
    """What ``worker`` holds on each GPU its budget counts: its ranks' shares there (one, when
    each rank has a GPU of its own), or its whole footprint where it is not placed."""
    ranks = worker.spec.group_size or 1
    placed = set(worker.gpus.split(",")) if worker.gpus else set()
    if ranks == 1 or not placed:
        return worker.size.total_bytes
    per_gpu = -(-ranks // len(placed))
    return per_gpu * device_share(worker.size, ranks).total_bytes


def reserved_bytes(workers: Iterable[WorkerProcess]) -> int:
    """What the residents among ``workers`` reserve, in bytes."""
    return sum(w.size.total_bytes for w in residents(workers))


def fits(worker: WorkerProcess, workers: Iterable[WorkerProcess], budget: int | None) -> bool:
    """Whether ``worker`` fits beside the other residents, unloading none."""
    used = sum(device_bytes(w) for w in neighbours(worker, workers))
    return budget is None or used + device_bytes(worker) <= budget


def victims(
    worker: WorkerProcess, workers: Iterable[WorkerProcess], budget: int
) -> list[str] | None:
    """The names to unload, least recently used first, so ``worker`` fits; ``None``: it can't."""
    others = [
        Resident(
            w.spec.name,
            device_bytes(w),
            w.last_used,
            evictable=w.state == "ready"
            and not w.spec.pinned
            and not w.client.in_flight
            and not w.attached,
        )
        for w in neighbours(worker, workers)
    ]
    return evictions(device_bytes(worker), budget, others)


def budget_text(worker: WorkerProcess, workers: Iterable[WorkerProcess], budget: int | None) -> str:
    """Why ``worker`` does not fit: its footprint, the budget, and who holds it."""
    s = worker.size
    others = neighbours(worker, workers)
    used = sum(device_bytes(w) for w in others)
    busy = [
        w.spec.name for w in others if w.spec.pinned or w.client.in_flight or w.state != "ready"
    ]
    return (
        f"it needs {_gb(s.total_bytes)} (weights {_gb(s.weights_bytes)}, KV "
        f"{_gb(s.kv_bytes)}, headroom {_gb(s.headroom_bytes)}){_each(worker)}; the "
        "--max-memory budget "
        f"is {_gb(budget or 0)}{_on(worker)}, {_gb(used)} of it held by models that cannot "
        f"be unloaded now ({', '.join(busy) or 'none'})"
    )


def _gb(num: int) -> str:
    return f"{num / 2**30:.2f} GB"


def _each(worker: WorkerProcess) -> str:
    """A group's need on each of its GPUs, where that is less than its whole footprint."""
    need = device_bytes(worker)
    return "" if need == worker.size.total_bytes else f", {_gb(need)} on each GPU"


def _on(worker: WorkerProcess) -> str:
    """Where the budget applies, on a host whose workers are placed on GPUs."""
    if not worker.gpus:
        return ""
    return f" on each of GPUs {worker.gpus}" if "," in worker.gpus else f" on GPU {worker.gpus}"
