"""The K/V that recent decode steps produced, held beside the pool until the next flush, and
what decode attends to.

MLX updates an array in place only when nothing else holds its buffer. A decode step still
running on the device holds the pool, so a step that writes its new token into the pool while
the previous one runs copies every layer's whole pool (gigabytes, every step); to avoid that the
paged runner used to launch each step only once the previous one was done, which serialised host
and device (on an H100 at 128 streams: 2,700 tok/s paged against 5,000 contiguous).

Instead, decode steps never write the pool. Each step writes its new K/V into a per-layer
buffer, ``(B, heads, columns, head_dim)``, and the pool is only read, so step N+1 is built and
launched while step N runs, as in mlx-lm. What decode attends to is one of:

- a **read view** (the default): the buffer starts with a copy of every row's tokens from the
  pool, gathered once when the batch forms, and decode appends to it. A step then reads one
  contiguous array, as mlx-lm's cache does. Its memory is the batch's KV again (rows padded to
  the longest), so it is used only within ``max_view_tokens`` and when rows pad to at most
  twice their tokens.
- the **gathered blocks**: otherwise each step gathers every row's blocks from the pool and
  appends the buffer, which then holds only the tokens decoded since the last flush. Memory
  stays one layer's batch at a time, at the price of two copies of the batch's K/V per layer
  and step (at 128 streams of Qwen3-0.6B on an H100: 0.75x the contiguous cache's throughput).

Decoded tokens go into the pool at a flush, when the device is idle anyway or rarely: before a
prefill (which reads and writes the pool), every ``FLUSH_EVERY`` steps, or when a view fills.
Rows that leave the batch take their unflushed tokens with them as a deferred write, applied
first at the next flush: their blocks may already be in the prefix cache, and nothing reads
those before a prefill flushes.

With quantized KV (``--kv-bits``) the buffers hold the same quantized parts as the pool (the
view included, so it costs what the pool does), a step quantizes its new token once and
dequantizes what it attends to (``kv.formats``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlxd.worker.kv.formats import KV, assign, concat, each, parts
from mlxd.worker.kv.paged_cache import KVPool

FLUSH_EVERY = 16  # steps, without a view: the buffer then costs B * 16 tokens of K/V at most
VIEW_STEP = 64  # columns a read view grows by; with a view, the steps between flushes

log = logging.getLogger(__name__)


class DecodeTail:
    """The decode batch's buffers, their unflushed tokens, and the pool slots those belong in.

    All rows have as many unflushed tokens (``length``): rows join the batch only after a
    prefill, which flushes first, and the runner calls ``restart`` then.
    """

    def __init__(self, num_layers: int, max_view_tokens: int = 0) -> None:
        self.num_layers = num_layers
        self.max_view_tokens = max_view_tokens  # B x columns a read view may hold (0: none)
        self.keys: list[Any] = [None] * num_layers  # (B, heads, capacity, key dim) KV, or None
        self.values: list[Any] = [None] * num_layers
        self.view = False  # the buffers start with the rows' pool tokens (see the module doc)
        self.base = 0  # pool columns at the front of a view
        self.in_pool: list[int] = []  # of those, each row's real ones (the rest is padding)
        self.cols = 0  # decoded columns after them
        self.length = 0  # the last of those not yet in the pool
        self.slots: mx.array | None = None  # (B, length): where those go in the pool
        # Tails of rows that left the batch: (slots (N,), keys per layer, values per layer).
        self._deferred: list[tuple[mx.array, list[KV], list[KV]]] = []
        self.outgrown = False  # a batch outgrew the view's memory once (said in the log)
        self.full = False  # this batch reads the pool's blocks because its view would not fit

    @property
    def started(self) -> bool:
        return self.keys[0] is not None

    def due(self) -> bool:
        """Whether the unflushed tokens must go into the pool before the next step."""
        if self.view:
            return self.base + self.cols >= _columns(self.keys[0])  # full: flush, then grow
        return self.length >= FLUSH_EVERY

    def start(self, pool: KVPool, block_tables: list[list[int]], positions: list[int]) -> None:
        """Buffers for a batch whose tokens are all in the pool: a read view when it fits."""
        bs, n = pool.block_size, len(positions)
        same = positions[0] if all(p == positions[0] for p in positions) else None
        base = same if same is not None else bs * max(1, max(-(-p // bs) for p in positions))
        padded_ok = n * base <= 2 * sum(positions) + n * bs
        self.view = padded_ok and self._fits(n, base)
        # refused for its memory (not the padding, not a runner without a view)
        self.full = padded_ok and not self.view and self.max_view_tokens > 0
        self.base, self.in_pool, self.cols = (base, list(positions), 0) if self.view else (0, [], 0)
        if not self.view:
            self.keys = [_zeros(pool, 0, n, FLUSH_EVERY) for _ in range(self.num_layers)]
            self.values = [_zeros(pool, 1, n, FLUSH_EVERY) for _ in range(self.num_layers)]
            return
        table = _table(pool, block_tables, max(1, -(-base // bs)))
        self.keys = [_view(pool, 0, pool.keys[i], table, base) for i in range(self.num_layers)]
        self.values = [_view(pool, 1, pool.values[i], table, base) for i in range(self.num_layers)]

    def restart(self) -> None:
        """Drop the buffers (after a flush): the next step starts from the pool."""
        assert self.length == 0, "flush first"
        self.keys = [None] * self.num_layers
        self.values = [None] * self.num_layers
        self.view, self.base, self.in_pool, self.cols = False, 0, [], 0

    def drop_batch(self) -> None:
        """Forget the batch's buffers and unflushed tokens (after a failed step: its rows are
        computed again and keep none of their blocks). The deferred writes of rows that left
        before stay for the next flush: their blocks may already be in the prefix cache."""
        self.slots, self.length = None, 0
        self.restart()

    def append_slots(self, slots: mx.array) -> None:
        """Record where this step's new tokens (``(B, t)``, t per row) go in the pool."""
        self.slots = slots if self.slots is None else mx.concatenate([self.slots, slots], axis=1)
        self.length += slots.shape[1]
        self.cols += slots.shape[1]

    def room(self, columns: int) -> bool:
        """Whether the view may take ``columns`` more decoded columns (a verification over it,
        ``ViewVerifyCache``, which grows it by ``VIEW_STEP`` as a decode step does). Without a
        view: no."""
        if not self.view:
            return False
        end, capacity = self.base + self.cols + columns, _columns(self.keys[0])
        return end <= capacity or (end <= capacity + VIEW_STEP and self._can_grow())

    def keep(self, rows: list[int], num_rows: int) -> None:
        """Only ``rows`` (indices into the current ``num_rows``) stay; the others' unflushed
        tokens are deferred to the next flush."""
        if not self.started:
            return
        kept = set(rows)
        gone_rows = [i for i in range(num_rows) if i not in kept]
        if gone_rows and self.length and self.slots is not None:
            write = self._write(mx.array(gone_rows))
            # Computed now, so the write holds its own rows' tokens: unevaluated, it would hold
            # the whole buffer, and every row leaving before a flush would keep one alive (at
            # 128 streams, one view of all the batch's K/V each).
            mx.async_eval(write)
            self._deferred.append(write)
        if not rows:
            self.drop_batch()
            return
        idx = mx.array(rows)
        self.slots = None if self.slots is None else self.slots[idx]
        self.keys = [each(k, lambda p: p[idx]) for k in self.keys]
        self.values = [each(v, lambda p: p[idx]) for v in self.values]
        self.in_pool = [self.in_pool[i] for i in rows] if self.view else []

    def flush(self, pool: KVPool) -> None:
        """Write the deferred tokens, then the current ones, into ``pool``, and evaluate every
        write the pool holds (the caller makes sure no step in flight still reads the pool).
        Older writes go first, so a block that changed hands ends with its new owner's tokens.
        Without a view, the buffers are dropped: the next step reads those tokens from the
        pool."""
        writes = list(self._deferred)
        if self.length and self.slots is not None:
            writes.append(self._write())
        for slots, keys, values in writes:
            for layer in range(self.num_layers):
                assign(pool.keys[layer], slots, keys[layer])
                assign(pool.values[layer], slots, values[layer])
        # Every write is done here, while the device is idle anyway (the caller waited for the
        # step in flight): a pending write holds the buffers it copies from, and a batch
        # decoding through its view reads the pool again only when the batch changes, so every
        # flush kept one whole view alive (memory grew with the square of the output). This
        # includes a prefill's writes of new prompts, which nothing reads back: requests done
        # at their first token would otherwise stack theirs. Not async: a pool write still in
        # flight would make the next one copy the pool.
        mx.eval(pool.keys, pool.values)
        self._deferred = []
        self.slots, self.length = None, 0
        if self.started and not self.view:
            self.restart()
        elif self.view and self.due() and not self._can_grow():
            self.restart()  # the view may not grow: the batch goes on from the pool

    def _can_grow(self) -> bool:
        rows, capacity = parts(self.keys[0])[0].shape[0], _columns(self.keys[0])
        return self._fits(rows, capacity)

    def _fits(self, rows: int, columns: int) -> bool:
        """Whether a view of ``rows`` x ``columns`` may grow once more; the first time one may
        not, the log says so: the batch goes on at the gathered path's speed (about 0.5-0.75x
        on an H100 at 128 streams), which a larger KV budget avoids."""
        if rows * (columns + VIEW_STEP) <= self.max_view_tokens:
            return True
        if not self.outgrown and self.max_view_tokens:
            self.outgrown = True
            log.warning(
                "decode's view holds %d tokens; a batch of %d rows x %d columns "
                "outgrew it and reads the pool's blocks each step instead (slower): "
                "a larger --kv-cache-gb gives the view a fifth of it",
                self.max_view_tokens,
                rows,
                columns + VIEW_STEP,
            )
        return False

    def _write(self, rows: mx.array | None = None) -> tuple[mx.array, list[KV], list[KV]]:
        """The unflushed tokens of ``rows`` (default: all) as a pool write: (slots, K, V)."""
        assert self.slots is not None
        end = self.base + self.cols

        def tokens(part: mx.array) -> mx.array:
            x = part[:, :, end - self.length : end]
            return _token_major(x if rows is None else x[rows])

        slots = self.slots if rows is None else self.slots[rows]
        return (
            slots.reshape(-1),
            [each(k, tokens) for k in self.keys],
            [each(v, tokens) for v in self.values],
        )


def _zeros(pool: KVPool, kind: int, rows: int, columns: int) -> KV:
    """Empty decode columns of K (``kind`` 0) or V (1), stored as the pool stores them."""
    return pool.zeros(kind, (rows, pool.n_kv_heads, columns))


def _columns(buf: KV) -> int:
    return int(parts(buf)[0].shape[2])


def _rows(buf: KV) -> int:
    return int(parts(buf)[0].shape[0])


def _table(pool: KVPool, block_tables: list[list[int]], width: int) -> mx.array:
    """(B, width) block ids, short tables padded with the scratch block (as -1 entries are)."""
    table = mx.array([(tb + [-1] * width)[:width] for tb in block_tables])
    return mx.where(table < 0, pool.scratch_block, table)


def _view(pool: KVPool, kind: int, pool_layer: KV, table: mx.array, base: int) -> KV:
    """The rows' first ``base`` pool tokens, ``(B, heads, base, dim)``, and room after them."""
    cached = each(pool.gather(pool_layer, table), lambda p: p[:, :base].transpose(0, 2, 1, 3))
    return concat(cached, _zeros(pool, kind, table.shape[0], VIEW_STEP), axis=2)


def _with_columns(pool: KVPool, kind: int, buf: KV, columns: int) -> KV:
    """``buf`` (K: ``kind`` 0, V: 1), grown by ``VIEW_STEP`` columns if it has fewer than
    ``columns`` (the flush before decided it may grow: ``DecodeTail.due``, ``room``)."""
    if columns <= _columns(buf):
        return buf
    return concat(buf, _zeros(pool, kind, _rows(buf), VIEW_STEP), axis=2)


def _token_major(x: mx.array) -> mx.array:
    """(B, heads, T, dim) -> (B * T, heads, dim), the pool's slot layout."""
    b, h, t, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b * t, h, d)


class TailKVCache:
    """One layer's cache for one decode step: writes its token into the decode buffer at
    column ``column``; reads the view up to it, or the pool's blocks then the buffer."""

    def __init__(
        self,
        pool: KVPool,
        tail: DecodeTail,
        layer: int,
        column: int,
        read_blocks: mx.array | None,
        offset: mx.array,
        mask: mx.array | None,
        pool_len: int | None,
        keys: KeyLayout,
    ) -> None:
        self.keys = keys  # where each key sits, for a windowed layer's mask
        self.pool = pool
        self.tail = tail
        self.layer = layer
        self.column = column
        self.read_blocks = read_blocks  # None: the buffer is a view, nothing to gather
        self.offset = offset
        self.mask = mask
        self.pool_len = pool_len  # every row's pool tokens, when they are the same

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.read_blocks is None and not self.pool.fmt.quantized:
            return self._view_fetch(keys, values)
        c, fmt, n = self.column, self.pool.fmt, self.pool_len
        out = []
        sides = (
            (0, self.tail.keys, self.pool.keys, keys),
            (1, self.tail.values, self.pool.values, values),
        )
        for kind, buffers, pool, new in sides:
            buf = _with_columns(self.pool, kind, buffers[self.layer], c + 1)
            assign(buf, (slice(None), slice(None), slice(c, c + 1)), fmt.pack(new))
            buffers[self.layer] = buf
            decoded = fmt.unpack(each(buf, lambda p: p[:, :, : c + 1]))
            if self.read_blocks is None:
                out.append(decoded)
                continue
            cached = self.pool.gather(pool[self.layer], self.read_blocks)
            if n is not None:
                cached = each(cached, lambda p: p[:, :n])
            out.append(mx.concatenate([fmt.unpack(cached).transpose(0, 2, 1, 3), decoded], axis=2))
        return out[0], out[1]

    def _view_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """``update_and_fetch`` where the buffers are a float view: a decode step's common
        case, in the fewest Python calls (one stream's step is bound by the host's time)."""
        c, layer = self.column, self.layer
        out = []
        for kind, buffers, new in ((0, self.tail.keys, keys), (1, self.tail.values, values)):
            buf = buffers[layer]
            if c >= buf.shape[2]:
                buf = buffers[layer] = _with_columns(self.pool, kind, buf, c + 1)
            buf[:, :, c : c + 1] = new
            out.append(buf[:, :, : c + 1])
        return out[0], out[1]

    def make_mask(
        self, N: int, return_array: bool = False, window_size: int | None = None
    ) -> mx.array | None:
        if window_size and max(self.keys.positions) >= window_size:
            return self.keys.window_mask(window_size, self.mask)
        return self.mask


class ViewVerifyCache:
    """One layer's cache for a verification of the view's one row: its ``n`` inputs (the next
    token and its drafts) run as ``n`` rows of one query each, input ``j`` at position
    ``offset[j]``. Their K/V go into the view at columns ``column .. column + n`` and input ``j``
    reads the view up to its own column, so nothing is flushed, gathered or rebuilt: the view
    stays as decode left it, and the next plain step reads it as before.

    One query per row because attention with several builds a cuDNN plan on CUDA for every
    key length (about 40 ms each on an H100, against 0.2 ms for single-query rows with a mask:
    ``scripts/probe_verify_attention.py`` (removed; at commit 6e4ae59)); the rows read one
    broadcast view, not copies.
    """

    def __init__(
        self,
        pool: KVPool,
        tail: DecodeTail,
        layer: int,
        offset: mx.array,
        mask: mx.array,
        keys: mx.array,
    ) -> None:
        self.pool = pool
        self.tail = tail
        self.layer = layer
        self.column = tail.base + tail.cols
        self.offset = offset
        self.mask = mask
        self.key_positions = keys  # each view column's token position, for a window's mask

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        c, n, fmt = self.column, keys.shape[0], self.pool.fmt
        out = []
        for kind, buffers, new in ((0, self.tail.keys, keys), (1, self.tail.values, values)):
            buf = _with_columns(self.pool, kind, buffers[self.layer], c + n)
            # (n, heads, 1, dim): the inputs as rows -> (1, heads, n, dim), the view's columns
            assign(
                buf,
                (slice(None), slice(None), slice(c, c + n)),
                fmt.pack(new.transpose(2, 1, 0, 3)),
            )
            buffers[self.layer] = buf
            seen = fmt.unpack(each(buf, lambda p: p[:, :, : c + n]))
            out.append(mx.broadcast_to(seen, (n, *seen.shape[1:])))
        return out[0], out[1]

    def make_mask(
        self, N: int, return_array: bool = False, window_size: int | None = None
    ) -> mx.array:
        if not window_size:
            return self.mask
        near = self.key_positions[None] > self.offset[:, None] - window_size
        return self.mask & near[:, None, None, :]


def verify_caches(
    pool: KVPool, tail: DecodeTail, block_table: list[int], position: int, count: int
) -> list[ViewVerifyCache]:
    """The caches of a verification of the view's one row (``ViewVerifyCache``): ``count``
    inputs from ``position``. The caller made room (``DecodeTail.room``) and records where the
    kept ones go (``append_slots``)."""
    bs = pool.block_size
    pool.ensure(block_table[(position + count - 1) // bs])
    # The view's front holds the row's pool tokens, then padding if it was a longer row's
    # batch; after it, input j reads the decoded columns and the inputs up to its own.
    front = mx.broadcast_to(mx.arange(tail.base)[None] < tail.in_pool[0], (count, tail.base))
    own = mx.arange(tail.cols + count)[None] <= tail.cols + mx.arange(count)[:, None]
    mask = mx.concatenate([front, own], axis=1)[:, None, None, :]
    offset = mx.arange(position, position + count)
    keys = mx.concatenate([mx.arange(tail.base), tail.in_pool[0] + mx.arange(tail.cols + count)])
    return [ViewVerifyCache(pool, tail, i, offset, mask, keys) for i in range(len(pool.keys))]


@dataclass(frozen=True)
class KeyLayout:
    """The keys a decode step reads, row by row: ``front`` columns of pool tokens (row ``b``'s
    first ``valid[b]`` of them real, at their positions), then ``cols`` decoded tokens and the
    step's own, at ``valid[b]`` onwards; the query of row ``b`` is at ``positions[b]``."""

    front: int
    valid: list[int]
    cols: int
    positions: list[int]

    def window_mask(self, window: int, mask: mx.array | None) -> mx.array:
        """``mask`` (None: every key) narrowed to the keys within ``window`` positions of
        each row's query, as ``PagedStep.window_mask``."""
        rows = len(self.positions)
        pooled = mx.broadcast_to(mx.arange(self.front)[None], (rows, self.front))
        decoded = mx.array(self.valid)[:, None] + mx.arange(self.cols + 1)[None]
        kpos = mx.concatenate([pooled, decoded], axis=1)
        near = (kpos > mx.array(self.positions)[:, None] - window)[:, None, None, :]
        return near if mask is None else mask & near


def decode_caches(
    pool: KVPool, tail: DecodeTail, block_tables: list[list[int]], positions: list[int]
) -> list[TailKVCache]:
    """The caches of one decode step: row ``b`` writes its token at ``positions[b]`` (inside its
    block table) into the decode buffer, and reads its first ``positions[b]`` tokens: from the
    view, or from the pool's blocks and then the buffer.

    When every row has as many tokens, each reads exactly those and needs no mask, as in the
    contiguous cache: a masked attention cannot use the fused single-query kernel on every
    backend (on CUDA it costs about twice as much per layer).
    """
    bs = pool.block_size
    pool.ensure(max(tb[p // bs] for tb, p in zip(block_tables, positions, strict=True)))
    if not tail.started:
        tail.start(pool, block_tables, positions)
    cols = tail.cols
    table, same = None, None
    if tail.view:
        front, valid = tail.base, tail.in_pool
        same = front if all(v == front for v in valid) else None
    else:
        valid = [p - cols for p in positions]
        same = valid[0] if all(n == valid[0] for n in valid) else None
        width = max(1, max(-(-n // bs) for n in valid))
        table = _table(pool, block_tables, width)
        front = width * bs
    slots = mx.array(
        [[tb[p // bs] * bs + p % bs] for tb, p in zip(block_tables, positions, strict=True)]
    )
    tail.append_slots(slots)
    mask = None
    if same is None:
        in_front = mx.arange(front)[None, :] < mx.array(valid)[:, None]
        decoded = mx.ones((len(positions), cols + 1), dtype=mx.bool_)
        mask = mx.concatenate([in_front, decoded], axis=1)[:, None, None, :]
    offset = mx.array(positions)
    column = tail.base + cols
    keys = KeyLayout(front if tail.view or same is None else same, valid, cols, positions)
    return [
        TailKVCache(pool, tail, i, column, table, offset, mask, same, keys)
        for i in range(len(pool.keys))
    ]
