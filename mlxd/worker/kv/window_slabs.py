"""A sliding-window model's window layers in the block pool: the slabs each sequence holds.

A windowed model (Gemma 3, GPT-OSS, OLMo 3, EXAONE 4, Cohere 2...) has full-attention layers,
whose K/V every later token reads, and window layers, whose query at position q reads only the
keys in ``(q - window, q]``. The full layers' K/V are the pool's blocks, as for any model
(``Sequence.block_ids``). The window layers' K/V live in a second pool of the same block size,
in *slabs*: ``Sequence.window_ids`` gives, for each block of the sequence, the slab holding its
window layers' K/V, or -1 once the block has fallen behind every later query's window and its
slab went back (the runner reads the scratch block there, masked out). A sequence so holds its
whole context in the full layers' blocks and only its window in the window layers' slabs: on
Gemma 3 (five window layers to one full) an 8k-token sequence with a 1k window takes about a
quarter of the memory it took in plain blocks. Both kinds are paid from one ``KVBudget``.

Slabs are taken as prefill reaches their blocks (``grow``, a chunk's worth ahead) and as decode
opens a block; they go back (``drop_behind``) ``margin`` tokens after they leave the window: a
decode step's K/V reach the pool only at the next flush (``decode_tail``), and a slab must not
change hands while tokens are on their way into it.

A prefix hit at block boundary P needs, beside the full layers' blocks, the window layers' K/V
of ``[P - window, P)``: the prefix cache keeps each block's slab on its node beside the block
(``RadixCache.keep_slabs``), handed over as prefill completes each chunk and when a sequence
finishes or is preempted, before the sequence gives its own references back. A cached slab is
memory the pool may take back (least recently used first) when it is short: a live sequence
holds only its window; the cache holds the rest while nothing needs the room, and a hit lands
at the deepest boundary whose window survived. Pure Python: no MLX.
"""

from __future__ import annotations

from mlxd.worker.kv.block_pool import BlockPool
from mlxd.worker.sched.sequence import Sequence


class WindowSlabs:
    """The slab pool of a windowed model and the rules for taking and returning slabs."""

    def __init__(self, slabs: BlockPool, window: int, margin: int) -> None:
        """``window``: tokens each window layer sees (the largest, if they differ); ``margin``:
        tokens a slab is kept after leaving it (at least the tokens decode leaves unflushed,
        and a block)."""
        assert margin >= slabs.block_size, "a finished sequence keeps its last boundary's window"
        self.pool = slabs
        self.window = window
        self.margin = margin

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    def span(self, tokens: int) -> range:
        """The blocks a query at position ``tokens`` reads in the window layers."""
        return range(max(0, tokens - self.window + 1) // self.block_size, tokens // self.block_size)

    def missing(self, seq: Sequence, end: int) -> int:
        """Slabs ``seq`` lacks for its blocks before token ``end``."""
        return max(0, -(-end // self.block_size) - len(seq.window_ids))

    def grow(self, seq: Sequence, end: int) -> None:
        """Slabs for ``seq``'s blocks up to token ``end`` (the caller made room)."""
        seq.window_ids += self.pool.allocate(self.missing(seq, end))

    def drop_behind(self, seq: Sequence) -> None:
        """Give back the slabs of blocks no later query of ``seq`` reads (and no unflushed
        token may still be written into)."""
        last = (seq.num_computed - self.window - self.margin) // self.block_size
        ids, i = seq.window_ids, min(last, len(seq.window_ids))
        # the slabs gone back are a prefix (a hit's, and each earlier call's): walk back to it,
        # not from the first block on every decode step
        gone = []
        while i > 0 and ids[i - 1] >= 0:
            i -= 1
            gone.append(ids[i])
            ids[i] = -1
        if gone:
            self.pool.release(gone)

    def restore(self, seq: Sequence, window: list[int], tokens: int) -> None:
        """``seq`` starts from a prefix hit of ``tokens`` tokens: the hit's ``window`` slabs."""
        assert not seq.window_ids, "a sequence takes a hit only when admitted"
        self.pool.retain(window)
        seq.window_ids = [-1] * (tokens // self.block_size - len(window)) + list(window)

    def release(self, seq: Sequence) -> None:
        """Every slab ``seq`` holds goes back (it finished, was preempted or failed)."""
        self.pool.release([i for i in seq.window_ids if i >= 0])
        seq.window_ids = []

    def check(self, seqs: list[Sequence]) -> None:
        """Every slab a sequence holds is in use."""
        self.pool.check_invariants()
        for seq in seqs:
            assert all(self.pool.ref_count(i) > 0 for i in seq.window_ids if i >= 0)
            assert len(seq.window_ids) <= len(seq.block_ids), "a slab past the blocks"
            held = [i >= 0 for i in seq.window_ids]
            assert held == sorted(held), "a slab gone back after one held (drop_behind)"
