"""Paged KV storage behind the mlx-lm cache contract, so ``mlx_lm.models.*`` run unchanged.

Every layer keeps K and V for all sequences in one pool of fixed-size blocks, token-major:
``(num_blocks * block_size, n_kv_heads, head_dim)``. A sequence is a block table (logical ->
physical block ids). For each forward the runner builds one ``PagedStep`` (where the new tokens
are written, which slots each row reads, RoPE offsets and the mask) from the block tables, with
vectorized MLX ops. The portable attention path gathers each row's slots and calls
``mx.fast.scaled_dot_product_attention`` (through the model); a fused paged kernel may replace
the gather later without changing this contract.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx

from mlxd.models.kv_layout import KVLayout
from mlxd.worker.kv import attention_shapes
from mlxd.worker.kv.formats import KV, KVFormat, assign, concat, each, parts


class KVPool:
    """K/V blocks for every layer, plus one scratch block that padding writes go to.

    The arrays are elastic: they start with one chunk of blocks, grow in whole chunks (at least
    a quarter of what they hold, so growing n blocks copies O(n) in all) as block ids beyond
    them are written, up to ``num_blocks`` (the KV budget), and shrink back when the worker is
    idle (``shrink``). Growing copies the blocks held so far into new arrays: one copy, between
    two steps. The scratch block is the one after the last (``scratch_block == capacity``), so
    it moves as the arrays change; steps read it when they are built.

    With a quantized ``fmt`` (``--kv-bits``) each layer's K and V is a tuple of arrays (see
    ``kv.formats``) in the same slot layout; ``arrays`` lists them all.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        n_kv_heads: int,
        k_head_dim: int,
        v_head_dim: int,
        dtype: mx.Dtype,
        chunk_blocks: int | None = None,
        fmt: KVFormat | None = None,
    ) -> None:
        self.num_blocks = num_blocks  # the most the arrays may hold (the budget)
        self.block_size = block_size
        self.chunk_blocks = min(num_blocks, chunk_blocks or num_blocks)
        self.capacity = 0
        self._shapes = [(n_kv_heads, k_head_dim), (n_kv_heads, v_head_dim)]
        self._dtype = dtype
        self.n_kv_heads = n_kv_heads
        self.fmt = fmt or KVFormat()
        self.keys: list[KV] = [self._zeros(0, 0) for _ in range(num_layers)]
        self.values = [self._zeros(0, 1) for _ in range(num_layers)]
        self.grow_to(self.chunk_blocks)

    @property
    def scratch_block(self) -> int:
        return self.capacity

    def ensure(self, block_id: int, limit: int | None = None) -> int:
        """Make room for ``block_id`` (one of the allocator's, so below ``num_blocks``), within
        ``limit`` blocks if given (an allocator whose budget the arrays count in: ``BlockPool``'s
        ``grow``); returns the blocks the arrays hold."""
        if block_id >= self.capacity:
            step = max(self.chunk_blocks, self.capacity // 4)
            top = min(self.num_blocks, self.num_blocks if limit is None else limit)
            self.grow_to(min(top, -(-(block_id + 1) // step) * step))
        return self.capacity

    def grow_to(self, capacity: int) -> None:
        """Hold ``capacity`` blocks (the old scratch block becomes a free one)."""
        assert self.capacity <= capacity <= self.num_blocks
        extra = (capacity - self.capacity) * self.block_size + (
            0 if self.capacity else self.block_size
        )
        for arrays, kind in ((self.keys, 0), (self.values, 1)):
            for i, a in enumerate(arrays):
                arrays[i] = concat(a, self._zeros(extra, kind), axis=0)
        self.capacity = capacity
        mx.eval(self.keys, self.values)

    def shrink(self, highest_used: int) -> int:
        """Drop the whole chunks above block ``highest_used`` (the allocator's highest id in
        use; nothing may hold a step or a write on the arrays). Returns the blocks dropped."""
        capacity = max(
            self.chunk_blocks, -(-(highest_used + 1) // self.chunk_blocks) * self.chunk_blocks
        )
        if capacity >= self.capacity:
            return 0
        slots, dropped = (capacity + 1) * self.block_size, self.capacity - capacity
        for arrays in (self.keys, self.values):
            for i, a in enumerate(arrays):
                arrays[i] = each(a, lambda p: mx.contiguous(p[:slots]))  # a copy: old freed
        mx.eval(self.keys, self.values)
        self.capacity = capacity
        return dropped

    def _zeros(self, slots: int, kind: int) -> KV:
        heads, dim = self._shapes[kind]
        return self.fmt.zeros((slots, heads), dim, self._dtype)

    def zeros(self, kind: int, lead: tuple[int, ...]) -> KV:
        """Zero K (``kind`` 0) or V (1) as stored, ``(*lead, head_dim)``."""
        return self.fmt.zeros(lead, self._shapes[kind][1], self._dtype)

    def gather(self, kv: KV, table: mx.array) -> KV:
        """One layer's K or V blocks for a ``(B, W)`` block table, as stored (``gather_blocks``)."""
        return each(kv, lambda p: gather_blocks(p, self.block_size, table))

    @property
    def arrays(self) -> list[mx.array]:
        """Every array the pool stores K/V in (slots first), layer by layer, K then V."""
        return [p for kv in self.keys + self.values for p in parts(kv)]

    @classmethod
    def for_model(
        cls,
        model: Any,
        num_blocks: int,
        block_size: int,
        chunk_blocks: int | None = None,
        fmt: KVFormat | None = None,
        windows: bool = False,
    ) -> KVPool:
        """A pool for ``model`` (shapes from ``kv_shape``); all ``num_blocks`` at once unless
        ``chunk_blocks`` is given; ``windows``: for its sliding-window layers' slabs."""
        layers, heads, kd, vd, dtype = kv_shape(model, windows)
        return cls(layers, num_blocks, block_size, heads, kd, vd, dtype, chunk_blocks, fmt)

    @staticmethod
    def bytes_per_token(model: Any, fmt: KVFormat | None = None, windows: bool = False) -> int:
        """K and V bytes one token takes in every layer of ``model`` (``windows``: every
        sliding-window layer) as ``fmt`` stores them."""
        layers, heads, kd, vd, dtype = kv_shape(model, windows)
        fmt = fmt or KVFormat()
        # the daemon's footprint sizes by this same rule, from config.json
        return KVLayout(layers, heads, kd, vd, dtype.size).token_bytes(fmt.bits, fmt.group_size)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    @property
    def bytes_per_block(self) -> int:
        per_slot = self.nbytes // parts(self.keys[0])[0].shape[0]
        return per_slot * self.block_size

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one block's K/V in every layer (copy-on-write of a shared partial block).

        The block is taken out and evaluated before it is written back: a write whose source is
        a slice of the same array cannot update that array in place, so MLX would copy every
        layer's whole pool."""
        self.ensure(dst)
        s, d, n = src * self.block_size, dst * self.block_size, self.block_size
        arrays = self.arrays
        blocks = [mx.take(a, mx.arange(s, s + n), axis=0) for a in arrays]
        mx.eval(blocks)
        for a, block in zip(arrays, blocks, strict=True):
            a[d : d + n] = block  # in place: the pool's lists hold these same array objects


def gather_blocks(buf: mx.array, block_size: int, table: mx.array) -> mx.array:
    """Whole blocks of one layer's pool, ``(B, W * block_size, heads, dim)`` for a ``(B, W)``
    block table: one index per block, each block moved as 8-byte words. Element-wise indexing
    of the ``(blocks, block_size, heads, dim)`` view cost 3x as much on an H100 (28 layers of
    K and V, 128 rows of 384 tokens: 17.2 ms against 5.5; scripts/profile_paged_ops.py (removed;
    at commit 6e4ae59))."""
    slots, heads, dim = buf.shape
    nbytes = block_size * heads * dim * buf.dtype.size
    word = next(w for w in (mx.uint64, mx.uint32, mx.uint16, mx.uint8) if nbytes % w.size == 0)
    rows = buf.reshape(slots // block_size, block_size * heads * dim).view(word)
    blocks = mx.take(rows, table.reshape(-1), axis=0).view(buf.dtype)
    return blocks.reshape(table.shape[0], -1, heads, dim)


def kv_shape(model: Any, windows: bool = False) -> tuple[int, int, int, int, mx.Dtype]:
    """(layers, kv heads, key dim, value dim, dtype) of ``model``'s KV, from one token run
    through its caches: the layers are its plain K/V caches (a hybrid's recurrent layers have
    none in the pool), or with ``windows`` its sliding-window ones (``runners.window``)."""
    from mlx_lm.models.cache import make_prompt_cache

    from mlxd.worker.kv.layer_caches import attention_entries, window_entries

    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    pick = window_entries(cache) if windows else attention_entries(cache)
    plain = [c for c, a in zip(cache, pick, strict=True) if a]
    k, v = plain[0].state[0], plain[0].state[1]
    return len(plain), k.shape[1], k.shape[3], v.shape[3], k.dtype


@dataclass(frozen=True)
class PagedStep:
    """Where one forward writes and reads KV, for every row of its batch.

    ``write_slots`` (B*L,) are the pool slots of the new tokens (row-major; left padding goes to
    the scratch block); ``read_blocks`` (B, W) are each row's block table, padded with the
    scratch block to a common width, as its -1 entries are (a window layer's slabs gone back),
    so each row reads W whole blocks, Lk = W * block_size keys; ``offset`` (B,) is the RoPE
    position of each row's first query.

    When every row has as many cached and as many new tokens (always, for one request), rows
    read exactly their ``read_len`` keys and attend with the "causal" mask, as mlx-lm's own
    cache does, so such a forward runs the attention mlx-lm runs and builds no mask array.
    Otherwise ``mask`` says which keys each query sees.

    When no row has cached tokens (``fresh``: new prompts), attention reads the step's own
    keys, left-padded as the queries are, and not the pool: the pool is written but not read
    back. (On an H100, a 128-token prompt's forward on Qwen3-0.6B took 1.42x what it takes
    through mlx-lm's own cache when it read its blocks back, 0.80x since: docs/PERFORMANCE.md.)
    The write is not needed for the first token, so it runs with the next step that reads the
    pool (MLX evaluates lazily; a prefix hit on these blocks reads them through it too).
    """

    write_slots: mx.array
    read_blocks: mx.array
    offset: mx.array
    mask: mx.array | None
    read_len: int | None = None  # uniform rows: the keys each row reads (then causal, no mask)
    fresh: bool = False  # nothing cached: keys are the step's own, not read from the pool
    real: mx.array | None = None  # (B, 1, L, 1): which new tokens are not padding, when some are
    qpos: mx.array | None = None  # (B, L): each query's position (negative: padding)
    longest: int = 0  # the most tokens a row has after this step
    key_start: int = 0  # position of the first key read (a window's slabs gone back before it)
    both_ways: mx.array | None = None  # (B, 1, L, K): query and key in one image (``with_spans``)

    @classmethod
    def build(
        cls,
        block_tables: list[list[int]],
        context_lens: list[int],
        new_lens: list[int],
        pool: KVPool,
        exact: bool = False,
        right: bool = False,
    ) -> PagedStep:
        """Rows have ``context_lens[b]`` tokens cached and ``new_lens[b]`` new ones, right-aligned
        in a query window of ``attention_shapes.queries(max(new_lens))`` tokens (shorter rows
        are left-padded; the caller pads its tokens the same way); ``exact``: a window of
        ``max(new_lens)``, whatever the backend (a recurrent layer cannot skip padding);
        ``right``: rows left-aligned instead, padded after their tokens (where a recurrent
        layer takes padding: ``runners.hybrid``).

        Leading blocks no row has (-1: a window layer's slabs gone back) are not read: the
        keys start at ``key_start``, so a window layer's read stays near its window."""
        pool.ensure(max((max(t) for t in block_tables if t), default=0))
        longest_new = max(new_lens)
        bs = pool.block_size
        skip = min(next((i for i, b in enumerate(t) if b >= 0), len(t)) for t in block_tables)
        start = skip * bs
        longest = max(c + n for c, n in zip(context_lens, new_lens, strict=True))
        # no key past the step's last token is seen: a prompt's later blocks (allocated for
        # its whole length) are not read, so chunk j of a long prompt reads (j + 1) chunks
        # of keys and reuses the attention plan a shorter prompt built
        need = -(-(longest - start) // bs)
        block_tables = [t[skip : skip + need] for t in block_tables]
        q_len = longest_new if exact else attention_shapes.queries(longest_new)
        width = attention_shapes.key_blocks(max(len(t) for t in block_tables), q_len > 1)
        uniform = (
            len(set(new_lens)) == 1
            and len(set(context_lens)) == 1
            and q_len == new_lens[0]
            and (q_len == 1 or not attention_shapes.BUCKETED)
        )
        table = mx.array([t + [-1] * (width - len(t)) for t in block_tables])
        table = mx.where(table < 0, pool.scratch_block, table)  # -1: no block, read the scratch
        ctx, lens = mx.array(context_lens), mx.array(new_lens)
        total = ctx + lens  # tokens per row after this step
        cols = mx.arange(q_len)[None, :]
        # query i of row b is position ctx + i - pad (below ctx: padding); right-aligned rows'
        # padding after them is at -1
        pad = mx.zeros_like(lens) if right else q_len - lens
        qpos = ctx[:, None] + cols - pad[:, None]
        real = (qpos >= ctx[:, None]) & (qpos < total[:, None])
        if right:
            qpos = mx.where(real, qpos, -1)
        block = mx.take_along_axis(table, mx.maximum(qpos - start, 0) // bs, axis=1)
        write = mx.where(real, block * bs + mx.maximum(qpos, 0) % bs, pool.scratch_block * bs)
        write, table = write.reshape(-1).astype(mx.int32), table.astype(mx.int32)
        fresh = not any(context_lens)
        if uniform:
            return cls(
                write,
                table,
                ctx.astype(mx.int32),
                None,
                context_lens[0] + q_len - start,
                fresh,
                qpos=qpos,
                longest=longest,
                key_start=start,
            )
        # Padding K/V are zeroed: a masked key still multiplies its (zero) weight into the
        # output, so a non-finite one would poison real rows. Padding queries sit at negative
        # positions, and some models' position terms are not finite there (Mistral 3's
        # log(1 + floor(pos / n)) attention scale).
        keep = real[:, None, :, None]
        if fresh:  # keys are the step's own, left-padded: key j is query j of the same row
            kpos = mx.arange(q_len)[None, None, :]
            qcol = mx.arange(q_len)[None, :, None]
            mask = (kpos <= qcol) & real[:, None, :]  # key j is query j: a row's own tokens
            mask = mask | ((kpos == 0) & ~real[:, :, None])  # padding queries see one key
            return cls(
                write,
                table,
                (ctx - pad).astype(mx.int32),
                mask[:, None],
                fresh=True,
                real=keep,
                qpos=qpos,
                longest=longest,
            )
        kpos = start + mx.arange(width * bs)[None, None, :]
        mask = (kpos <= qpos[:, :, None]) & (kpos < total[:, None, None])
        # a padding query must still see one key, or its softmax row is all -inf (NaN)
        mask = mask | ((kpos == start) & ~real[:, :, None])
        return cls(
            write,
            table,
            (ctx - pad).astype(mx.int32),
            mask[:, None, :, :],
            real=keep,
            qpos=qpos,
            longest=longest,
            key_start=start,
        )

    def with_spans(self, spans: list[list[tuple[int, int]]]) -> PagedStep:
        """This step with each row's image ``spans`` (``[start, end)`` positions) seen both
        ways: a query inside a span sees every key of it too, as mlx-vlm's Gemma 4 overlays its
        causal masks (``use_bidirectional_attention: vision``). A span's keys are all written
        by this step or before it (the scheduler keeps a span in one chunk), so none is unread.
        """
        assert self.qpos is not None
        keys = self._key_positions()
        q_in, k_in = _span_ids(self.qpos, spans), _span_ids(keys, spans)
        both = ((q_in[:, :, None] == k_in[:, None, :]) & (q_in[:, :, None] >= 0))[:, None]
        if (causal := self.mask) is None:  # (B, 1, L, K): one per row, broadcast over heads
            causal = (keys[:, None, :] <= self.qpos[..., None])[:, None]
        return replace(self, mask=causal | both, both_ways=both)

    def _key_positions(self) -> mx.array:
        """Each key's position, (B or 1, K): a fresh step's keys are its own, left-padded."""
        assert self.qpos is not None
        if self.fresh:
            return self.qpos
        keys = self.read_len if self.mask is None else self.mask.shape[-1]
        assert keys is not None
        return self.key_start + mx.arange(keys)[None, :]

    def window_mask(self, window: int) -> mx.array | None:
        """The mask of a layer that sees only its last ``window`` positions (mlx-lm's
        ``create_causal_mask(window_size=...)``: query q sees key k when q - window < k <= q),
        or None when no row is longer than the window (the layer sees what the others do).
        The pool holds such a layer's keys like any other's (docs/decisions/0003)."""
        if self.longest <= window:
            return None
        assert self.qpos is not None
        qpos = self.qpos[:, :, None]
        kpos = self._key_positions()[:, None, :]
        near = kpos > qpos - window
        if self.real is not None:  # a padding query keeps the one key it sees
            near = near | ~self.real[:, 0]
        causal = self.mask if self.mask is not None else (kpos <= qpos)[:, None]
        windowed = causal & near[:, None]
        # an image's tokens see each other both ways, past the window too (as mlx-vlm's overlay)
        return windowed if self.both_ways is None else windowed | self.both_ways


def _span_ids(positions: mx.array, spans: list[list[tuple[int, int]]]) -> mx.array:
    """Which of its row's ``spans`` each of ``positions`` (B or 1, N) lies in (-1: none)."""
    width = max(1, *(len(s) for s in spans))
    bounds = mx.array([[list(x) for x in s] + [[0, 0]] * (width - len(s)) for s in spans])
    pos = positions[:, :, None]
    inside = (pos >= bounds[:, None, :, 0]) & (pos < bounds[:, None, :, 1])
    return mx.where(inside.any(axis=-1), mx.argmax(inside, axis=-1).astype(mx.int32), -1)


class PagedKVCache:
    """One layer's cache for one step: writes into the pool, reads each row's slots back."""

    def __init__(self, pool: KVPool, layer: int, step: PagedStep) -> None:
        self.pool = pool
        self.layer = layer
        self.step = step
        self.offset = step.offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        b, h, q, _ = keys.shape
        if self.step.real is not None:
            keys = mx.where(self.step.real, keys, 0)
            values = mx.where(self.step.real, values, 0)
        out = []
        fmt = self.pool.fmt
        for arrays, new in ((self.pool.keys, keys), (self.pool.values, values)):
            stored = fmt.pack(new.transpose(0, 2, 1, 3).reshape(b * q, h, -1))
            assign(arrays[self.layer], self.step.write_slots, stored)
            if self.step.fresh:  # quantized: the values the pool will give back
                out.append(
                    fmt.unpack(stored).reshape(b, q, h, -1).transpose(0, 2, 1, 3)
                    if fmt.quantized
                    else new
                )
                continue
            # Whole blocks (one index per block, not per token), laid out as each row's keys.
            blocks = self.pool.gather(arrays[self.layer], self.step.read_blocks)
            if (n := self.step.read_len) is not None:
                blocks = each(blocks, lambda p: p[:, :n])  # noqa: B023 (called here)
            out.append(fmt.unpack(blocks).transpose(0, 2, 1, 3))
        return out[0], out[1]

    def make_mask(
        self, N: int, return_array: bool = False, window_size: int | None = None
    ) -> mx.array | str | None:
        if window_size and (window := self.step.window_mask(window_size)) is not None:
            return window
        n = self.step.read_len
        if n is None or self.step.both_ways is not None:
            return self.step.mask
        if N == 1:
            return None  # one query sees every key it reads
        if return_array:  # the model wants an array: the causal one, bottom-right aligned
            return mx.arange(n)[None, :] <= mx.arange(n - N, n)[:, None]
        return "causal"

    @staticmethod
    def for_step(pool: KVPool, step: PagedStep) -> list[PagedKVCache]:
        return [PagedKVCache(pool, i, step) for i in range(len(pool.keys))]
