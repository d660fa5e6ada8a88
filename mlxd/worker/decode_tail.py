"""The K/V that recent decode steps produced, held beside the pool until the next flush.

MLX updates an array in place only when nothing else holds its buffer. A decode step still
running on the device holds the pool, so a step that writes its new token into the pool while
the previous one runs copies every layer's whole pool (gigabytes, every step); to avoid that the
paged runner used to launch each step only once the previous one was done, which serialised host
and device (on an H100 at 128 streams: 2,700 tok/s paged against 5,000 contiguous).

Instead, decode steps never write the pool. Each step appends its new K/V to a small per-layer
tail, ``(B, heads, T, head_dim)``, and attends to the pool's blocks (everything before the tail)
followed by the tail. The pool is only read, so step N+1 is built and launched while step N
runs, as in mlx-lm. The tail goes into the pool at a flush, when the device is idle anyway or
rarely: before a prefill (which reads and writes the pool), and every ``FLUSH_EVERY`` steps.
Rows that leave the batch take their tail slice with them as a deferred write, applied first at
the next flush: their blocks may already be in the prefix cache, and nothing reads those before
a prefill flushes.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from mlxd.worker.paged_cache import KVPool, gather_blocks

FLUSH_EVERY = 16  # steps; the tail costs B * T * (K+V bytes per token) of memory at most


class DecodeTail:
    """Every decode row's K/V since the last flush, per layer, and the pool slots they belong in.

    All rows have the same tail length ``length``: rows join the batch only after a prefill,
    which flushes first.
    """

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.length = 0
        self.keys: list[Any] = [None] * num_layers  # (B, heads, T, key dim) each, or None
        self.values: list[Any] = [None] * num_layers
        self.slots: mx.array | None = None  # (B, T): where each tail token goes in the pool
        # Tails of rows that left the batch: (slots (N,), keys per layer, values per layer).
        self._deferred: list[tuple[mx.array, list[mx.array], list[mx.array]]] = []

    def append_slots(self, slots: mx.array) -> None:
        """Record where this step's new tokens (one per row, ``(B, 1)``) go in the pool."""
        self.slots = slots if self.slots is None else mx.concatenate([self.slots, slots], axis=1)
        self.length += 1

    def keep(self, rows: list[int], num_rows: int) -> None:
        """Only ``rows`` (indices into the current ``num_rows``) stay; the others' tails are
        deferred to the next flush."""
        if self.length == 0 or self.slots is None:
            return
        kept = set(rows)
        gone_rows = [i for i in range(num_rows) if i not in kept]
        if gone_rows:
            gone = mx.array(gone_rows)
            self._deferred.append((
                self.slots[gone].reshape(-1),
                [_token_major(k[gone]) for k in self.keys],
                [_token_major(v[gone]) for v in self.values],
            ))  # fmt: skip
        if not rows:
            self._clear()
            return
        idx = mx.array(rows)
        self.slots = self.slots[idx]
        self.keys = [k[idx] for k in self.keys]
        self.values = [v[idx] for v in self.values]

    def flush(self, pool: KVPool) -> None:
        """Write the deferred tails, then the current ones, into ``pool`` (lazily: the caller
        makes sure no step in flight still reads the pool). Older writes go first, so a block
        that changed hands ends with its new owner's tokens."""
        writes = list(self._deferred)
        if self.length and self.slots is not None:
            writes.append((self.slots.reshape(-1), [_token_major(k) for k in self.keys],
                           [_token_major(v) for v in self.values]))  # fmt: skip
        for slots, keys, values in writes:
            for layer in range(self.num_layers):
                pool.keys[layer][slots] = keys[layer]
                pool.values[layer][slots] = values[layer]
        self._deferred = []
        self._clear()

    def _clear(self) -> None:
        self.length = 0
        self.keys = [None] * self.num_layers
        self.values = [None] * self.num_layers
        self.slots = None


def _token_major(x: mx.array) -> mx.array:
    """(B, heads, T, dim) -> (B * T, heads, dim), the pool's slot layout."""
    b, h, t, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b * t, h, d)


class TailKVCache:
    """One layer's cache for one decode step: reads the pool's blocks and the tail, writes only
    the tail."""

    def __init__(
        self, pool: KVPool, tail: DecodeTail, layer: int, read_blocks: mx.array,
        offset: mx.array, mask: mx.array | None, pool_len: int | None,
    ) -> None:  # fmt: skip
        self.pool = pool
        self.tail = tail
        self.layer = layer
        self.read_blocks = read_blocks
        self.offset = offset
        self.mask = mask
        self.pool_len = pool_len  # every row's pool tokens, when they are the same

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        bs = self.pool.block_size
        out = []
        for arrays, tails, new in ((self.pool.keys, self.tail.keys, keys),
                                   (self.pool.values, self.tail.values, values)):  # fmt: skip
            tail = new if tails[self.layer] is None else mx.concatenate(
                [tails[self.layer], new], axis=2)  # fmt: skip
            tails[self.layer] = tail
            cached = gather_blocks(arrays[self.layer], bs, self.read_blocks)
            if self.pool_len is not None:
                cached = cached[:, : self.pool_len]
            cached = cached.transpose(0, 2, 1, 3)
            out.append(mx.concatenate([cached, tail], axis=2))
        return out[0], out[1]

    def make_mask(
        self, N: int, return_array: bool = False, window_size: int | None = None
    ) -> mx.array | None:
        return self.mask


def decode_caches(pool: KVPool, tail: DecodeTail, block_tables: list[list[int]],
                  positions: list[int]) -> list[TailKVCache]:  # fmt: skip
    """The caches of one decode step: row ``b`` writes its token at ``positions[b]`` (inside its
    block table) into the tail, and reads its first ``positions[b] - tail.length`` tokens from
    the pool, then the tail.

    When every row has as many tokens, each reads exactly those and needs no mask, as in the
    contiguous cache: a masked attention cannot use the fused single-query kernel on every
    backend (on CUDA it costs about twice as much per layer).
    """
    bs, t = pool.block_size, tail.length
    in_pool = [p - t for p in positions]
    same = in_pool[0] if all(n == in_pool[0] for n in in_pool) else None
    width = max(1, max(-(-n // bs) for n in in_pool))
    table = mx.array([(tb + [pool.scratch_block] * width)[:width] for tb in block_tables])
    slots = mx.array([[tb[p // bs] * bs + p % bs] for tb, p in zip(block_tables, positions,
                                                                     strict=True)])  # fmt: skip
    tail.append_slots(slots)
    mask = None
    if same is None:
        kpos = mx.arange(width * bs)[None, :]
        in_tail = mx.ones((len(positions), t + 1), dtype=mx.bool_)
        mask = mx.concatenate([kpos < mx.array(in_pool)[:, None], in_tail], axis=1)
        mask = mask[:, None, None, :]
    offset = mx.array(positions)
    return [TailKVCache(pool, tail, i, table, offset, mask, same)
            for i in range(len(pool.keys))]  # fmt: skip
