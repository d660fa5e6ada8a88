"""The prefix cache: a radix tree over block-aligned token keys, as in SGLang's RadixCache.

Each node below the root stands for one full KV block: its key is that block's ``block_size``
tokens, so a path from the root spells a token prefix and lists the physical blocks that hold
its K/V. The tree holds one pool reference per indexed block. A running sequence locks the
node it matched (and so its path to the root); only unlocked leaves whose block nobody else
references are evicted, least recently used first, and only when the pool needs room.

With a ``tier`` (the disk cache, ``worker/prefix/disk_tier.py``), evicted blocks are saved
there first, keyed by their chained digest, and a match that runs out of cached blocks goes on
with the blocks the tier holds, loaded into free blocks of the pool.

A hybrid model's recurrent layers have no blocks: their state after a node's tokens is stored
on the node (``keep_states``), a few nodes per sequence (``runners.hybrid`` says which), within a
byte budget, least recently used dropped first and always with their node. A match then ends
at the deepest node holding a state: blocks past it cannot be used without one.

A sliding-window model's window layers keep their K/V in slabs of a second pool
(``window_slabs``): each node may hold its block's slab too (``keep_slabs``), taken from the
sequence that computed it, and a match ends at the deepest block boundary whose window (the
slabs of the blocks a query there reads) is all held. Slabs go least recently used first when
their pool is short, before their node (whose full-attention block is of use to deeper hits).
Pure Python: no MLX (a state is opaque here but for its ``nbytes``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from mlxd.worker.kv.block_pool import BlockPool
from mlxd.worker.prefix.disk_cache import block_digest

_clock = itertools.count()  # a logical clock: LRU order without reading time
# Prefill keeps a state about every this many tokens (rounded to blocks): a prompt that parts
# from an earlier one recomputes at most this much of what they share, and a quarter more where
# ``state_cuts`` leaves out a periodic cut near another.
STATE_EVERY = 1024


def state_cuts(
    block_size: int, prompt_tokens: int, asked: set[int], start: int, end: int
) -> set[int]:
    """Where a prefill from token ``start`` to ``end`` keeps states for the prefix cache: the
    prompt's last block boundary (a repeated prompt hits there), where the scheduler ``asked``
    (where the prompt parts from the cache or from a prompt waiting on it), and every
    ``STATE_EVERY`` tokens (a later prompt parting from this one hits close by), but not within
    a quarter of that of one of the others: a hybrid runs a forward per span between cuts, and on
    an H200 each cost some 50 ms whatever its length (docs/PERFORMANCE.md, runs HP1-HP2)."""
    step = max(block_size, STATE_EVERY // block_size * block_size)
    kept = {(prompt_tokens - 1) // block_size * block_size, *asked}
    periodic = range(-(-(start + 1) // step) * step, end + 1, step)
    every = [c for c in periodic if all(abs(c - k) >= step // 4 for k in kept)]
    return {c for c in (*kept, *every) if start < c <= end}


@dataclass(eq=False)
class TreeNode:
    key: tuple[int, ...]
    block_id: int
    parent: TreeNode | None = None
    children: dict[tuple[int, ...], TreeNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    digest: bytes = b""  # block_digest of the prefix up to this block (the tier's key)
    state: Any = None  # a hybrid's recurrent state after this node's tokens (``nbytes`` sized)
    slab: int = -1  # a windowed model's window slab of this block (-1: none)
    depth: int = 0  # blocks from the root, this one's included


# (digest, parent digest, the block's tokens, its block id)
TierBlock = tuple[bytes, bytes, tuple[int, ...], int]


class Tier(Protocol):
    """Where evicted blocks go and come back from (``disk_tier.DiskTier``)."""

    def save(self, blocks: list[TierBlock]) -> None: ...

    def has(self, digest: bytes) -> bool: ...

    def load(self, blocks: list[TierBlock]) -> int:
        """Fill the blocks in order; returns how many, from the first, were loaded."""
        ...


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The cached blocks of a prefix (in order) and the deepest node matched (lock it).
    ``shared_blocks``: the blocks the prefix shares with the cache, more than ``block_ids``
    when a match had to end at a node with a recurrent state or a whole window; ``window``: a
    windowed model's slabs of the blocks a query after the prefix reads."""

    node: TreeNode
    block_ids: list[int]
    shared_blocks: int = 0
    window: list[int] = field(default_factory=list)

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


class RadixCache:
    """Index of full KV blocks by the tokens they hold, sharing blocks in ``pool``."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.root = TreeNode(key=(), block_id=-1, lock_ref=1)  # never evicted
        self.num_cached_blocks = 0
        self.tier: Tier | None = None  # set by the worker with --kv-disk-gb
        self.num_restored_blocks = 0  # loaded from the tier
        self.state_budget: int | None = None  # bytes of recurrent states (None: no states)
        self._state_room: Callable[[], int] | None = None  # their share now (``keep_states``)
        self.state_bytes = 0
        self._stated: set[TreeNode] = set()  # the nodes holding a state (trimmed by LRU)
        self.slabs: BlockPool | None = None  # a windowed model's window slabs (``keep_slabs``)
        self._span: Callable[[int], range] = lambda tokens: range(0)
        self._slabbed: set[TreeNode] = set()

    def keep_states(self, budget: int, room: Callable[[], int] | None = None) -> None:
        """The model has recurrent state: matches end at nodes holding one; ``budget`` bytes at
        most, and ``room()`` at the moment (the runner's share beside the pool it holds now)."""
        self.state_budget, self._state_room = budget, room

    @property
    def state_limit(self) -> int:
        """Bytes the states may take now: the budget, or less while the pool holds little."""
        assert self.state_budget is not None
        if self._state_room is None:
            return self.state_budget
        return min(self.state_budget, self._state_room())

    def keep_slabs(self, slabs: BlockPool, span: Callable[[int], range]) -> None:
        """The model has window layers, their K/V in ``slabs``: nodes keep their block's slab,
        and a match at ``P`` tokens needs the slabs of the blocks ``span(P)``."""
        self.slabs, self._span = slabs, span

    # Public API

    def match_prefix(
        self, token_ids: list[int], max_blocks: int | None = None, restore: bool = False
    ) -> PrefixMatch:
        """The longest cached prefix of ``token_ids``, in whole blocks (at most ``max_blocks``);
        with ``restore``, extended by the tier's blocks, loaded into free pool blocks."""
        node, ids, now, path = self.root, [], next(_clock), []
        limit = len(token_ids) // self.block_size
        if max_blocks is not None:
            limit = min(limit, max_blocks)
        for key in self._keys(token_ids, limit):
            child = node.children.get(key)
            if child is None:
                break
            node = child
            node.last_access = now
            ids.append(node.block_id)
            path.append(node)
        if self.slabs is not None:
            return self._windowed_match(path)
        if self.state_budget is not None:  # a hybrid: the tier keeps blocks, not states
            shared = len(ids)
            while node is not self.root and node.state is None:
                node = node.parent  # type: ignore[assignment]
                ids.pop()
            return PrefixMatch(node, ids, shared)
        if restore and self.tier is not None and len(ids) < limit:
            node = self._restore(node, self._keys(token_ids, limit)[len(ids) :], ids)
        return PrefixMatch(node, ids, len(ids))

    def insert(
        self,
        token_ids: list[int],
        block_ids: list[int],
        states: dict[int, Any] | None = None,
        slabs: list[int] | None = None,
    ) -> int:
        """Index the full blocks ``block_ids`` holding ``token_ids``; the tree takes a reference
        to each block it adds, and keeps ``states`` (by the tokens they follow, at block
        boundaries) on their nodes, and ``slabs`` (the blocks' window slabs, -1 for none) on
        nodes without one. Returns how many blocks of the prefix were already indexed (those
        keep their cached block; the caller's copy is not referenced)."""
        node, now, known = self.root, next(_clock), 0
        n = min(len(block_ids), len(token_ids) // self.block_size)
        for i, (key, block_id) in enumerate(zip(self._keys(token_ids, n), block_ids, strict=False)):
            child = node.children.get(key)
            if child is None:
                child = TreeNode(
                    key=key,
                    block_id=block_id,
                    parent=node,
                    depth=i + 1,
                    digest=block_digest(node.digest, key),
                )
                node.children[key] = child
                self.pool.retain([block_id])
                self.num_cached_blocks += 1
            else:
                known += 1
            child.last_access = now
            node = child
            if states and (state := states.get((i + 1) * self.block_size)) is not None:
                self._keep_state(node, state)
            if slabs and i < len(slabs) and slabs[i] >= 0 and node.slab < 0:
                self._keep_slab(node, slabs[i])
        if states:
            self._trim_states()
        return known

    def drop_slabs(self, num_slabs: int) -> int:
        """Free up to ``num_slabs`` window slabs by letting go of the tree's, least recently used
        first, and of a path's first blocks first (the last ones hold the window of its end,
        where its next turn hits); returns how many were freed. A slab a sequence also holds
        stays: letting go of it would free nothing and lose the hit."""
        assert self.slabs is not None
        freed = 0
        for node in sorted(self._slabbed, key=lambda n: (n.last_access, n.depth)):
            if freed >= num_slabs:
                break
            if self.slabs.ref_count(node.slab) == 1:
                freed += self._drop_slab(node)
        return freed

    def drop_slabs_from(self, slab: int) -> int:
        """Let go of the tree's slabs whose ids are ``slab`` or higher (so the window pool's
        arrays may shrink below it); returns how many were freed."""
        return sum(self._drop_slab(n) for n in list(self._slabbed) if n.slab >= slab)

    def lock(self, node: TreeNode) -> None:
        """Protect ``node`` and its ancestors from eviction (a running sequence uses them)."""
        while node is not None:
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: TreeNode) -> None:
        while node is not None:
            assert node.lock_ref > 0, "unlock of an unlocked node"
            node.lock_ref -= 1
            node = node.parent  # type: ignore[assignment]

    def num_cache_only(self) -> int:
        """Cached blocks no sequence holds (O(nodes): for moments the pool is short)."""
        return sum(1 for n in self._nodes() if self._tree_only(n))

    def evict(self, num_blocks: int) -> int:
        """Free up to ``num_blocks`` blocks, least recently used leaves first; returns how many.

        A locked node, or one whose block is also referenced outside the tree, stays."""
        heap = [(n.last_access, id(n), n) for n in self._nodes() if self._is_evictable(n)]
        heapq.heapify(heap)
        gone: list[TreeNode] = []
        while heap and len(gone) < num_blocks:
            _, _, node = heapq.heappop(heap)
            parent = self._remove_leaf(node)
            gone.append(node)
            if parent is not None and self._is_evictable(parent):
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return self._release(gone)

    def evict_from(self, block_id: int) -> int:
        """Free the evictable cached blocks whose ids are ``block_id`` or higher, and the blocks
        cached after them (useless without them), so the pool's arrays may shrink below
        ``block_id``; returns how many blocks were freed."""
        doomed: set[int] = set()
        nodes = self._nodes()  # parents before their children
        for node in nodes:
            if node.block_id >= block_id or id(node.parent) in doomed:
                doomed.add(id(node))
        gone: list[TreeNode] = []
        for node in reversed(nodes):  # children first: a parent is a leaf once they are gone
            if id(node) in doomed and self._is_evictable(node):
                self._remove_leaf(node)
                gone.append(node)
        return self._release(gone)

    def spill(self) -> int:
        """Save every cached block to the tier (at shutdown: a restart finds them there);
        returns how many were handed to it."""
        if self.tier is None:
            return 0
        nodes = self._nodes()
        self.tier.save([self._tier_block(n) for n in nodes])
        return len(nodes)

    @property
    def num_evictable(self) -> int:
        """Blocks that ``evict`` could free now (held only by the tree, not locked)."""
        frees: dict[int, bool] = {}
        for node in reversed(self._nodes()):  # children before their parents
            frees[id(node)] = (
                node.lock_ref == 0
                and self.pool.ref_count(node.block_id) == 1
                and all(frees[id(c)] for c in node.children.values())
            )
        return sum(frees.values())

    def check_invariants(self) -> None:
        nodes = list(self._nodes())
        assert len(nodes) == self.num_cached_blocks, "node count != cached blocks"
        held = sum(n.state.nbytes for n in nodes if n.state is not None)
        assert held == self.state_bytes, "state bytes != the states held"
        assert self._stated == {n for n in nodes if n.state is not None}, "stated set is off"
        assert self._slabbed == {n for n in nodes if n.slab >= 0}, "slabbed set is off"
        assert all(self.slabs.ref_count(n.slab) for n in self._slabbed if self.slabs)
        assert self.state_budget is None or held <= self.state_budget, "states over budget"
        assert len({n.block_id for n in nodes}) == len(nodes), "a block indexed twice"
        for n in nodes:
            assert self.pool.ref_count(n.block_id) >= 1, "an indexed block is free"
            assert n.lock_ref >= 0, "negative lock count"
            assert n.lock_ref >= sum(c.lock_ref for c in n.children.values()), "lock not on path"

    # Internal helpers

    def _keys(self, token_ids: list[int], n: int) -> list[tuple[int, ...]]:
        bs = self.block_size
        return [tuple(token_ids[i * bs : (i + 1) * bs]) for i in range(n)]

    def _nodes(self) -> list[TreeNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _is_evictable(self, node: TreeNode) -> bool:
        return node is not self.root and not node.children and self._tree_only(node)

    def _tree_only(self, node: TreeNode) -> bool:
        """Unlocked, its block referenced by the tree alone (no sequence holds it)."""
        return node.lock_ref == 0 and self.pool.ref_count(node.block_id) == 1

    def _release(self, gone: list[TreeNode]) -> int:
        """Save evicted nodes' blocks to the tier (before anyone may reuse them), then free."""
        if self.tier is not None and gone:
            self.tier.save([self._tier_block(n) for n in gone])
        return sum(self.pool.release([n.block_id]) for n in gone)

    def _tier_block(self, node: TreeNode) -> TierBlock:
        assert node.parent is not None
        return node.digest, node.parent.digest, node.key, node.block_id

    def _restore(self, node: TreeNode, keys: list[tuple[int, ...]], ids: list[int]) -> TreeNode:
        """Extend a match at ``node`` with the tier's blocks for ``keys``, as far as they go
        and free blocks allow; appends their ids to ``ids``; returns the deepest node."""
        assert self.tier is not None
        wanted: list[TierBlock] = []
        parent = node.digest
        for key in keys[: self.pool.num_free]:
            digest = block_digest(parent, key)
            if not self.tier.has(digest):
                break
            wanted.append((digest, parent, key, -1))
            parent = digest
        if not wanted:
            return node
        block_ids = self.pool.allocate(len(wanted))
        blocks = [(d, p, k, b) for (d, p, k, _), b in zip(wanted, block_ids, strict=True)]
        loaded = self.tier.load(blocks)
        self.pool.release(block_ids[loaded:])
        now = next(_clock)
        for digest, _, key, block_id in blocks[:loaded]:
            child = TreeNode(
                key=key,
                block_id=block_id,
                parent=node,
                digest=digest,
                last_access=now,
                depth=node.depth + 1,
            )
            node.children[key] = child  # the tree keeps the reference allocate gave
            self.num_cached_blocks += 1
            ids.append(block_id)
            node = child
        self.num_restored_blocks += loaded
        return node

    def _keep_state(self, node: TreeNode, state: Any) -> None:
        """Store ``state`` on ``node`` (a newer one replaces it: both hold the same tokens)."""
        if self.state_budget is None or state.nbytes > self.state_limit:
            return
        self._drop_state(node)
        node.state = state
        self.state_bytes += state.nbytes
        self._stated.add(node)

    def _drop_state(self, node: TreeNode) -> None:
        if node.state is not None:
            self.state_bytes -= node.state.nbytes
            node.state = None
            self._stated.discard(node)

    def _trim_states(self) -> None:
        """Drop the least recently used states until they fit ``state_limit``."""
        limit = self.state_limit
        if self.state_bytes <= limit:
            return
        for node in sorted(self._stated, key=lambda n: n.last_access):
            if self.state_bytes <= limit:
                break
            self._drop_state(node)

    def _keep_slab(self, node: TreeNode, slab: int) -> None:
        assert self.slabs is not None
        self.slabs.retain([slab])
        node.slab = slab
        self._slabbed.add(node)

    def _drop_slab(self, node: TreeNode) -> int:
        """Let go of ``node``'s slab; returns 1 if that freed it."""
        if node.slab < 0:
            return 0
        assert self.slabs is not None
        freed = self.slabs.release([node.slab])
        node.slab = -1
        self._slabbed.discard(node)
        return freed

    def _windowed_match(self, path: list[TreeNode]) -> PrefixMatch:
        """The deepest prefix of ``path`` whose window's slabs the tree holds, with them."""
        bs, depth = self.block_size, len(path)
        while depth and any(path[i].slab < 0 for i in self._span(depth * bs)):
            depth -= 1
        node = path[depth - 1] if depth else self.root
        window = [path[i].slab for i in self._span(depth * bs)]
        return PrefixMatch(node, [n.block_id for n in path[:depth]], len(path), window)

    def _remove_leaf(self, node: TreeNode) -> TreeNode | None:
        parent = node.parent
        assert parent is not None and not node.children
        del parent.children[node.key]
        self._drop_state(node)
        self._drop_slab(node)
        self.num_cached_blocks -= 1
        return None if parent is self.root else parent
