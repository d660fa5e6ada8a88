"""DiskKVCache: block files round-trip, bad or foreign files are never loaded, the cap holds;
RadixCache with a tier: evicted blocks go to it, a match comes back through it."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from mlxd.worker.kv.block_pool import BlockPool
from mlxd.worker.prefix.disk_cache import DiskKVCache, block_digest
from mlxd.worker.prefix.radix_cache import RadixCache, TierBlock

TOKENS = (1, 2, 3, 4)


def _arrays(seed: int) -> list[np.ndarray]:
    return [np.full((4, 8), seed, dtype=np.uint8), np.arange(16, dtype=np.uint8)]


def test_a_block_round_trips_and_survives_a_new_instance(tmp_path: Path) -> None:
    d = block_digest(b"", TOKENS)
    DiskKVCache(tmp_path, "m1", 1 << 20).save(d, b"", TOKENS, _arrays(7))
    again = DiskKVCache(tmp_path, "m1", 1 << 20)  # as after a restart
    out = again.load(d, b"", TOKENS)
    assert out is not None and all((a == b).all() for a, b in zip(out, _arrays(7), strict=True))


@pytest.mark.parametrize("case", ["foreign model", "other tokens", "flipped byte", "truncated"])
def test_bad_files_are_skipped_with_a_warning_and_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    d = block_digest(b"", TOKENS)
    DiskKVCache(tmp_path, "m1", 1 << 20).save(d, b"", TOKENS, _arrays(7))
    (path,) = tmp_path.glob("*.kvb")
    data = bytearray(path.read_bytes())
    if case == "flipped byte":
        data[-3] ^= 1
    elif case == "truncated":
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))
    cache = DiskKVCache(tmp_path, "m2" if case == "foreign model" else "m1", 1 << 20)
    tokens = (9, 9, 9, 9) if case == "other tokens" else TOKENS
    with caplog.at_level(logging.WARNING):
        assert cache.load(d, b"", tokens) is None
    assert "skipped" in caplog.text and not path.exists() and d not in cache


def test_the_least_recently_used_files_go_at_the_cap(tmp_path: Path) -> None:
    cache = DiskKVCache(tmp_path, "m1", 1 << 20)
    one = cache.save(block_digest(b"", (0,)), b"", (0,), _arrays(0)) and cache.nbytes
    cache.files.cap_bytes = 3 * one
    digests = [block_digest(b"", (i,)) for i in range(6)]
    for i, d in enumerate(digests):
        cache.save(d, b"", (i,), _arrays(i))
        cache.load(digests[0], b"", (0,))  # the first stays in use
    assert cache.nbytes <= cache.files.cap_bytes and len(cache) == 3
    assert digests[0] in cache and digests[5] in cache and digests[1] not in cache
    assert sum(p.stat().st_size for p in tmp_path.glob("*.kvb")) == cache.nbytes


class _DictTier:
    """A tier in memory: what the pool's blocks held is a dict entry per digest."""

    def __init__(self) -> None:
        self.blocks: dict[bytes, tuple[int, ...]] = {}
        self.loaded: list[TierBlock] = []

    def save(self, blocks: list[TierBlock]) -> None:
        self.blocks.update({d: k for d, _, k, _ in blocks})

    def has(self, digest: bytes) -> bool:
        return digest in self.blocks

    def load(self, blocks: list[TierBlock]) -> int:
        self.loaded += blocks
        return len(blocks)


def test_evicted_blocks_go_to_the_tier_and_a_match_restores_them() -> None:
    pool = BlockPool(num_blocks=8, block_size=2)
    cache, tier = RadixCache(pool), _DictTier()
    cache.tier = tier
    tokens = [1, 2, 3, 4, 5, 6, 7]
    ids = pool.allocate(4)
    cache.insert(tokens, ids)
    pool.release(ids)
    assert cache.evict(3) == 3 and len(tier.blocks) == 3
    assert cache.match_prefix(tokens).num_blocks == 0
    match = cache.match_prefix(tokens, restore=True)
    assert match.num_blocks == 3 and [k for _, _, k, _ in tier.loaded] == [(1, 2), (3, 4), (5, 6)]
    assert cache.num_restored_blocks == 3 and pool.num_used == 3
    cache.check_invariants()
    pool.check_invariants()
