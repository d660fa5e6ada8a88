"""Which replica of a model should serve a prompt: the one most likely to hold its prefix.

This is the policy alone (plain values, no sockets), after SGLang's cache-aware router: each
prompt becomes a chain of prefix keys; the router remembers which replica last served each key
and sends a prompt to the replica owning its longest remembered prefix, unless that replica is
much busier than the least loaded one (then load wins, and the prefix moves there). A prompt
nobody has seen goes to the least loaded replica, ties in turn.

**What is hashed.** The worker's prefix cache (``worker/prefix/radix_cache.py``) keys whole KV
blocks of token ids. The gateway never tokenizes (it imports neither MLX nor a tokenizer), so it can
hash token ids only for ``TokenPrompt``s; for text and chat prompts it hashes the prompt's
characters in fixed ``CHUNK_CHARS`` chunks, each key chained on the one before (as a radix
path is), so two prompts share exactly the keys of their common leading chunks. 64 characters
are about 16 tokens of English: a block or half of one at the default 32-token block, fine
enough that a conversation's next turn matches all its earlier turns, coarse enough that a
long prompt costs a few hundred hashes. Chat messages are hashed one after another (role and
content), tools first, so a conversation's next turn extends the string of the turn before.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from mlxd.protocol.messages import ChatPrompt, Prompt, TextPrompt, TokenPrompt

CHUNK_CHARS = 64  # characters per key for text and chat prompts
CHUNK_TOKENS = 16  # token ids per key for token prompts
MAX_KEYS = 1 << 17  # remembered keys (LRU), about 10 MB of gateway memory at most


@dataclass(frozen=True, slots=True)
class Balance:
    """When a replica is "much busier": its load exceeds the least loaded replica's by more
    than ``abs_slack`` requests and is more than ``rel_slack`` times it (SGLang's two
    thresholds). Load = requests waiting plus running on that replica."""

    abs_slack: int = 4
    rel_slack: float = 2.0

    def is_much_busier(self, load: int, least: int) -> bool:
        return load - least > self.abs_slack and load > self.rel_slack * least


def prefix_keys(prompt: Prompt) -> list[bytes]:
    """The prompt's chained prefix keys, one per whole leading chunk (see the module doc)."""
    if isinstance(prompt, TokenPrompt):
        ids = prompt.token_ids
        chunks: Iterator[bytes] = (
            b",".join(str(t).encode() for t in ids[i : i + CHUNK_TOKENS])
            for i in range(0, len(ids) - CHUNK_TOKENS + 1, CHUNK_TOKENS)
        )
    else:
        text = prompt.text if isinstance(prompt, TextPrompt) else _chat_text(prompt)
        data = text.encode("utf-8", "surrogatepass")
        chunks = (
            data[i : i + CHUNK_CHARS] for i in range(0, len(data) - CHUNK_CHARS + 1, CHUNK_CHARS)
        )
    keys, previous = [], b""
    for chunk in chunks:
        previous = hashlib.blake2b(previous + chunk, digest_size=12).digest()
        keys.append(previous)
    return keys


class PrefixRouter:
    """Prefix key -> the replica that last served it, and the choice made from that.

    Args:
        num_replicas: replicas are ``0 .. num_replicas - 1``.
        balance: when the owner of a prefix is too busy to get it.
        max_keys: keys remembered; the least recently used go first.
    """

    def __init__(
        self, num_replicas: int, balance: Balance | None = None, max_keys: int = MAX_KEYS
    ) -> None:
        self.num_replicas = num_replicas
        self.balance = balance or Balance()
        self.max_keys = max_keys
        # key -> (replica, its epoch when it served the key): a restarted replica (new epoch)
        # lost its cache, so what it held before counts for nothing.
        self._owners: OrderedDict[bytes, tuple[int, float]] = OrderedDict()
        self._turn = 0

    def choose(self, keys: list[bytes], loads: list[int | None], epochs: list[float]) -> int:
        """The replica for a prompt with ``keys``; ``loads[i]`` is None where replica ``i``
        cannot serve (not ready). Records the choice. Raises ``ValueError`` if none can."""
        ready = [i for i, load in enumerate(loads) if load is not None]
        if not ready:
            raise ValueError("no replica is ready")
        least = min(ready, key=lambda i: (loads[i], (i - self._turn) % self.num_replicas))
        owner = self.owner(keys, loads, epochs)
        chosen = least
        if owner is not None:
            load, least_load = loads[owner], loads[least]
            assert load is not None and least_load is not None
            chosen = least if self.balance.is_much_busier(load, least_load) else owner
        else:
            self._turn = (least + 1) % self.num_replicas
        self.record(keys, chosen, epochs[chosen])
        return chosen

    def owner(self, keys: list[bytes], loads: list[int | None], epochs: list[float]) -> int | None:
        """The ready replica that served the longest prefix of ``keys`` in its current epoch."""
        for key in reversed(keys):
            held = self._owners.get(key)
            if held is not None and loads[held[0]] is not None and epochs[held[0]] == held[1]:
                return held[0]
        return None

    def record(self, keys: list[bytes], replica: int, epoch: float) -> None:
        """``replica`` now holds the prefixes ``keys`` (it was sent the prompt)."""
        owners = self._owners
        for key in keys:
            owners[key] = (replica, epoch)
            owners.move_to_end(key)
        while len(owners) > self.max_keys:
            owners.popitem(last=False)

    def matched(self, keys: list[bytes], replica: int, epoch: float) -> int:
        """How many leading keys of ``keys`` ``replica`` holds now (for tests and stats)."""
        n = 0
        for key in keys:
            if self._owners.get(key) != (replica, epoch):
                break
            n += 1
        return n


class RoundRobin:
    """The baseline: ready replicas in turn, whatever the prompt (``--routing round_robin``)."""

    def __init__(self, num_replicas: int) -> None:
        self.num_replicas = num_replicas
        self._next = 0

    def choose(self, keys: list[bytes], loads: list[int | None], epochs: list[float]) -> int:
        for step in range(self.num_replicas):
            i = (self._next + step) % self.num_replicas
            if loads[i] is not None:
                self._next = i + 1
                return i
        raise ValueError("no replica is ready")


def _chat_text(prompt: ChatPrompt) -> str:
    parts = [json.dumps(prompt.tools, sort_keys=True)] if prompt.tools else []
    for message in prompt.messages:
        parts.append(json.dumps(message, sort_keys=True, ensure_ascii=False))
    return "\x1e".join(parts) + "\x1e"
