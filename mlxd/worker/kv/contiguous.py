"""Contiguous KV caches behind the mlx-lm cache contract (``offset``, ``update_and_fetch``,
``make_mask``), so ``mlx_lm.models.*`` run unchanged.

A sequence prefills into its own ``SequenceKVCache``; when its prompt is done it joins the decode
batch's ``BatchKVCache`` (rows left-padded to a common length). The paged cache replaces these
two without touching the scheduler or the models.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask

_STEP = 256  # grow in steps so decode does not reallocate every token


def _grow(buf: mx.array | None, used: int, new: mx.array) -> mx.array:
    """Return ``buf`` with room for ``new`` after its first ``used`` positions (axis 2)."""
    need = used + new.shape[2]
    if buf is not None and need <= buf.shape[2]:
        return buf
    n_steps = (need - used + _STEP - 1) // _STEP
    shape = (new.shape[0], new.shape[1], n_steps * _STEP, new.shape[3])
    extra = mx.zeros(shape, new.dtype)
    if buf is None:
        return extra
    return mx.concatenate([buf[..., :used, :], extra], axis=2)


class SequenceKVCache:
    """One layer's K/V for a single sequence (batch size 1), as mlx-lm's ``KVCache``."""

    def __init__(self) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        prev = self.offset
        self.keys = _grow(self.keys, prev, keys)
        self.values = _grow(self.values, prev, values)
        self.offset += keys.shape[2]
        self.keys[..., prev : self.offset, :] = keys
        self.values[..., prev : self.offset, :] = values
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    def make_mask(
        self, N: int, return_array: bool = False, window_size: int | None = None
    ) -> mx.array | str | None:
        if window_size is not None and self.offset + N > window_size:
            # Some key is outside some query's window (a later chunk sees earlier ones' keys).
            return create_causal_mask(N, offset=self.offset, window_size=window_size)
        if N == 1:
            return None
        if return_array:
            return create_causal_mask(N, offset=self.offset)
        return "causal"

    @property
    def state(self) -> tuple[mx.array, mx.array]:
        assert self.keys is not None and self.values is not None
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes  # type: ignore[union-attr]


class BatchKVCache:
    """One layer's K/V for the decode batch: rows right-aligned, ``left_padding`` per row."""

    def __init__(self) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.left_padding = mx.zeros((0,), mx.int32)
        self.offset = mx.zeros((0,), mx.int32)
        self._idx = 0
        self._pads: list[int] = []

    @property
    def batch_size(self) -> int:
        return len(self._pads)

    @property
    def state(self) -> list[mx.array]:
        """The arrays this layer holds (``layer_caches.nbytes`` counts them)."""
        return [a for a in (self.keys, self.values) if a is not None]

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        prev = self._idx
        if any(p > prev for p in self._pads):  # padding K/V are zeroed, as in paged_cache
            real = mx.arange(prev, prev + keys.shape[2]) >= self.left_padding[:, None]
            keys = mx.where(real[:, None, :, None], keys, 0)
            values = mx.where(real[:, None, :, None], values, 0)
        self.keys = _grow(self.keys, prev, keys)
        self.values = _grow(self.values, prev, values)
        self._idx += keys.shape[2]
        self.offset = self.offset + keys.shape[2]
        self.keys[..., prev : self._idx, :] = keys
        self.values[..., prev : self._idx, :] = values
        return self.keys[..., : self._idx, :], self.values[..., : self._idx, :]

    def make_mask(
        self, N: int, return_array: bool = False, window_size: int | None = None
    ) -> mx.array | str | None:
        if not any(self._pads) and window_size is None and not return_array:
            return None if N == 1 else "causal"  # every row's keys are all real
        return create_causal_mask(
            N, offset=self._idx, left_padding=self.left_padding, window_size=window_size
        )

    @classmethod
    def for_prefill(cls, left_padding: list[int]) -> BatchKVCache:
        """An empty cache for a left-padded prefill batch (row i starts after its padding)."""
        cache = cls()
        cache._pads = list(left_padding)
        cache._sync_arrays()
        return cache

    @classmethod
    def from_single(cls, single: SequenceKVCache) -> BatchKVCache:
        cache = cls()
        cache.keys, cache.values = single.state
        cache._idx, cache._pads = single.offset, [0]
        cache._sync_arrays()
        return cache

    def extend(self, other: BatchKVCache) -> None:
        """Append ``other``'s rows after ours: one copy, whichever side needs padding."""
        if other.batch_size == 0:
            return
        if self.batch_size == 0:
            self.keys, self.values, self._idx, self._pads = (
                other.keys,
                other.values,
                other._idx,
                list(other._pads),
            )
            self._sync_arrays()
            return
        width = max(self._idx, other._idx)
        parts = [(self, width - self._idx), (other, width - other._idx)]
        self.keys = mx.concatenate([self._left_pad(c.keys[..., : c._idx, :], n) for c, n in parts])  # type: ignore[index]
        self.values = mx.concatenate(
            [self._left_pad(c.values[..., : c._idx, :], n) for c, n in parts]  # type: ignore[index]
        )
        self._pads = [p + n for c, n in parts for p in c._pads]
        self._idx = width
        self._sync_arrays()

    def filter(self, keep: list[int]) -> None:
        """Keep only the rows ``keep`` (in that order) and drop padding no row needs."""
        self._pads = [self._pads[i] for i in keep]
        if not keep:
            self.keys = self.values = None
            self._idx = 0
            self._sync_arrays()
            return
        assert self.keys is not None and self.values is not None
        idx = mx.array(keep)
        trim = min(self._pads)
        self.keys = self.keys[idx, :, trim : self._idx, :]
        self.values = self.values[idx, :, trim : self._idx, :]
        self._idx -= trim
        self._pads = [p - trim for p in self._pads]
        self._sync_arrays()

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes  # type: ignore[union-attr]

    # Internal helpers

    def _sync_arrays(self) -> None:
        self.left_padding = mx.array(self._pads, dtype=mx.int32)
        self.offset = mx.array([self._idx - p for p in self._pads], dtype=mx.int32)

    @staticmethod
    def _left_pad(x: mx.array, n: int) -> mx.array:
        if n == 0:
            return x
        return mx.pad(x, [(0, 0), (0, 0), (n, 0), (0, 0)])
