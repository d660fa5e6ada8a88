"""Prefix cache for models the paged pool cannot hold: snapshots of a sequence's whole cache list.

Recurrent state (Mamba, GatedDeltaNet, short convolutions) cannot be rewound and a sliding
window's buffer has dropped what fell out of it, so such a model's prefix cache keeps copies of
the sequence's caches at known token counts: the last block boundary of each prompt (a later
prompt sharing a system prompt or a document hits there) and the end of each finished sequence
(prompt and output: the next turn of a conversation resends them and hits there), and the
longest block-aligned prefix a prompt shares with an earlier one (a system prompt or document
that several requests share, whatever follows it). A new prompt
restores the longest snapshot that is a prefix of it, keeping at least one token to compute,
and prefills only the rest. Snapshots are evicted least recently used beyond a byte budget; with
a disk tier (``snapshot_disk``, ``--kv-disk-gb``) they go there instead of away, and a prompt no
snapshot in memory serves is looked up on disk.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from mlxd.worker.kv import layer_caches
from mlxd.worker.prefix.snapshot_disk import DiskSnapshots

_MAX_SEEN_BLOCKS = 1 << 16  # prefix hashes remembered (a few MB)


@dataclass
class _Entry:
    caches: list[Any]
    nbytes: int
    last_used: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class SnapshotCounters:
    hits: int = 0
    misses: int = 0
    hit_tokens: int = 0


class SnapshotCache:
    """Token prefix -> a copy of one sequence's cache list after exactly those tokens."""

    def __init__(self, budget_bytes: int, disk: DiskSnapshots | None = None) -> None:
        self.budget_bytes = budget_bytes
        self.disk = disk
        self.nbytes = 0
        self.counters = SnapshotCounters()
        self._entries: dict[tuple[int, ...], _Entry] = {}
        # Chained hashes of the block-aligned prefixes of recent prompts (token ids only).
        self._seen: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    # Public API

    def insert(self, tokens: list[int], caches: list[Any]) -> None:
        """Keep a copy of ``caches``, which hold exactly ``tokens``."""
        key = tuple(tokens)
        if not key or key in self._entries:
            return
        snapshot = copy.deepcopy([_compact(c) for c in caches])
        arrays = layer_caches.arrays(snapshot)
        mx.eval(arrays)
        size = sum(a.nbytes for a in arrays)
        if size > self.budget_bytes:
            if self.disk is not None:
                self.disk.save(key, snapshot)
            return
        self._entries[key] = _Entry(snapshot, size)
        self.nbytes += size
        self._evict(self.budget_bytes)

    def match(self, tokens: list[int]) -> tuple[int, list[Any] | None]:
        """The longest snapshot that is a proper prefix of ``tokens``: (its length, a copy of its
        caches to continue from), or (0, None). Memory first, then the disk tier, whose hit
        comes back into memory for the next one."""
        n, caches = self._match_memory(tokens)
        if caches is None and self.disk is not None:
            n, caches = self.disk.match(tokens)
            if caches is not None:
                self.insert(tokens[:n], caches)
        if caches is None:
            self.counters.misses += 1
            return 0, None
        self.counters.hits += 1
        self.counters.hit_tokens += n
        return n, caches

    def shared_prefix(self, tokens: list[int], block_size: int) -> int:
        """Record ``tokens``' block-aligned prefixes; return the longest one an earlier prompt
        had too (0: none), where a snapshot serves every prompt that shares it."""
        shared, chain = 0, 0
        for end in range(block_size, len(tokens) + 1, block_size):
            chain = hash((chain, *tokens[end - block_size : end]))
            if chain in self._seen:
                shared = end
                self._seen.move_to_end(chain)
            else:
                self._seen[chain] = None
        while len(self._seen) > _MAX_SEEN_BLOCKS:
            self._seen.popitem(last=False)
        return shared

    def clear(self) -> int:
        """Drop every snapshot from memory (to the disk tier, if any); returns how many."""
        n = len(self._entries)
        self._evict(0)
        return n

    # Internal helpers

    def _match_memory(self, tokens: list[int]) -> tuple[int, list[Any] | None]:
        for n in sorted({len(k) for k in self._entries}, reverse=True):
            entry = self._entries.get(tuple(tokens[:n])) if n < len(tokens) else None
            if entry is not None:
                entry.last_used = time.monotonic()
                return n, copy.deepcopy(entry.caches)
        return 0, None

    def _evict(self, budget: int) -> None:
        while self.nbytes > budget and self._entries:
            key = min(self._entries, key=lambda k: self._entries[k].last_used)
            entry = self._entries.pop(key)
            self.nbytes -= entry.nbytes
            if self.disk is not None:
                self.disk.save(key, entry.caches)


def _compact(cache: Any) -> Any:
    """``cache`` without the unused capacity a K/V cache grows by (256 tokens at a time): a
    snapshot copies what it holds, not its room to grow (a chunked cache's room made llama4's
    snapshots so large that the one left at a request's end evicted its prompt's)."""
    from mlx_lm.models.cache import CacheList

    if isinstance(cache, CacheList):
        return CacheList(*(_compact(c) for c in cache.caches))
    end = _held(cache)
    if end is None or cache.keys is None or cache.keys.shape[2] == end:
        return cache
    out = copy.copy(cache)
    out.keys = cache.keys[..., :end, :]
    out.values = cache.values[..., :end, :]
    return out


def _held(cache: Any) -> int | None:
    """The K/V columns ``cache`` holds, for the kinds that grow by steps (else None)."""
    from mlx_lm.models.cache import ChunkedKVCache, KVCache

    if type(cache) is KVCache:
        return int(cache.offset)
    if type(cache) is ChunkedKVCache:
        return int(cache.offset - cache.start_position)
    return None
