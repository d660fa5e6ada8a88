"""Drafts from a draft model: a second, small model in the worker, sharing the target's
vocabulary, greedily decodes a few tokens ahead of each row that speculates.

**Its own KV, per row.** Each row has mlx-lm's own caches in the draft model
(``make_prompt_cache``): they hold the row's tokens and the drafts it fed itself. Not the
target's paged pool: a draft's K/V per token is a fraction of the target's, and what paging
buys the target (shared prefixes, preemption without loss, one batched forward over block
tables) matters little for it: a row whose draft state is missing (new, or after a worker
restart of the row) prefills it from its tokens, one cheap forward. mlx-lm's caches trim by a
count (``trim_prompt_cache``), which is the whole rollback. The cost: the draft decodes row by
row, one forward per draft token, so at large batches its share of a step grows; the batch
controller (``speculator``) measures the steps whole and stops drafting where it does not pay.

**Rollback.** Before a row drafts, its caches are cut to the longest prefix of what they hold
that the row's tokens still agree with: accepted drafts stay, rejected ones go, and the tokens
since (the verification's new token, plain steps' tokens) are fed. So a row never prefills its
history again: after a verification it feeds one or two tokens, then its drafts.

**Exact.** The draft is greedy: its proposal is a point mass, as prompt lookup's is, so
verification's rule ("sample the target's token with the plain step's key, keep it iff it is
the draft") is the standard speculative rule and keeps the target's distribution
(``verification``); greedy rows keep the target's argmax path whatever the draft says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from mlxd.errors import ConfigError
from mlxd.worker.sequence import Sequence

PREFILL_CHUNK = 1024  # tokens of a row's history fed to the draft per forward


@dataclass(slots=True)
class _Row:
    """One row's draft caches and the tokens they hold; ``agreed`` of them are known to be the
    row's own (the row's length when it last drafted)."""

    caches: list[Any]
    tokens: list[int] = field(default_factory=list)
    agreed: int = 0


class DraftModel:
    """Greedy drafts for a batch's rows (``Drafter`` in ``speculator``)."""

    def __init__(self, model: Any, vocab_size: int, target_vocab_size: int, path: str) -> None:
        """``model``: loaded with mlx-lm (its head on the last position only); refused unless
        it shares the target's vocabulary and its caches can be trimmed."""
        if vocab_size != target_vocab_size:
            raise ConfigError(f"--draft-model {path}: its vocabulary has {vocab_size} tokens, "
                              f"the model's {target_vocab_size}: a draft model must share the "
                              "target's vocabulary")  # fmt: skip
        if not can_trim_prompt_cache(make_prompt_cache(model)):
            raise ConfigError(f"--draft-model {path}: its caches cannot be rolled back (sliding "
                              "windows or recurrent layers)")  # fmt: skip
        self.model = model
        self._rows: dict[Sequence, _Row] = {}  # (finished rows' are dropped: ``forget``)

    def propose(self, rows: list[Sequence], lengths: list[int]) -> list[list[int]]:
        """Each row's ``lengths[i]`` greedy draft tokens (``[]`` for 0), after its tokens."""
        lazy = [self._draft(seq, k) if k > 0 else None
                for seq, k in zip(rows, lengths, strict=True)]  # fmt: skip
        mx.eval([d for d in lazy if d is not None])
        out: list[list[int]] = []
        for seq, d in zip(rows, lazy, strict=True):
            drafts: list[int] = [] if d is None else d.tolist()  # type: ignore[assignment]
            if drafts:
                self._rows[seq].tokens += drafts[:-1]  # the last one was never fed
            out.append(drafts)
        return out

    def forget(self) -> None:
        """Drop finished rows' caches (a preempted row keeps its own: it resumes)."""
        for seq in [s for s in self._rows if s.is_finished]:
            del self._rows[seq]

    @property
    def num_rows(self) -> int:
        """Rows holding draft caches now."""
        return len(self._rows)

    def _draft(self, seq: Sequence, k: int) -> mx.array:
        """``k`` greedy tokens after ``seq``'s, lazily; its caches then hold its tokens and all
        but the last draft."""
        row = self._rows.get(seq)
        if row is None:
            row = self._rows[seq] = _Row(make_prompt_cache(self.model))
        new = self._sync(seq, row)
        while len(new) > PREFILL_CHUNK:  # a long history: in chunks, each evaluated
            self.model(mx.array([new[:PREFILL_CHUNK]]), cache=row.caches)
            mx.eval([c.state for c in row.caches])
            new = new[PREFILL_CHUNK:]
        token = self._next(mx.array([new]), row)
        drafts = [token]
        for _ in range(k - 1):
            token = self._next(token[None], row)
            drafts.append(token)
        return mx.concatenate(drafts)

    def _next(self, inputs: mx.array, row: _Row) -> mx.array:
        logits = self.model(inputs, cache=row.caches)
        return mx.argmax(logits[:, -1, :], axis=-1)

    def _sync(self, seq: Sequence, row: _Row) -> list[int]:
        """Cut ``row``'s caches to the tokens ``seq`` still agrees with; the tokens to feed."""
        total = seq.num_prompt_tokens + seq.num_output_tokens
        ahead, tail = row.tokens[row.agreed :], _tokens(seq, row.agreed)
        same = 0
        while same < min(len(ahead), len(tail)) and ahead[same] == tail[same]:
            same += 1
        keep = min(row.agreed + same, total - 1)  # at least one token to feed: the last
        trim_prompt_cache(row.caches, len(row.tokens) - keep)
        del row.tokens[keep:]
        new = _tokens(seq, keep)
        row.tokens += new
        row.agreed = total
        return new


def _tokens(seq: Sequence, start: int) -> list[int]:
    """``(prompt + output)[start:]`` of ``seq``, without building the whole list."""
    prompt = seq.prompt_ids
    if start < len(prompt):
        return prompt[start:] + seq.output_ids
    return seq.output_ids[start - len(prompt) :]
