"""The memory budget: which idle workers to unload so that a new one fits (LRU first)."""

from __future__ import annotations

from dataclasses import dataclass


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
