"""Drafts from a draft model: a second, small model in the worker, sharing the target's
vocabulary, greedily decodes a few tokens ahead of each row that speculates.

**Its own KV, per row.** Each row has mlx-lm's own caches in the draft model
(``make_prompt_cache``): they hold the row's tokens and the drafts it fed itself. Not the
target's paged pool: a draft's K/V per token is a fraction of the target's, and what paging
buys the target (shared prefixes, preemption without loss) matters little for it: a row whose
draft state is missing (new) prefills it from its tokens. mlx-lm's caches trim by a count
(``trim_prompt_cache``), which is the whole rollback.

**One batch per draft position.** Each step, the drafting rows' caches are merged into one
left-padded ``BatchKVCache`` (a copy of the draft's K/V, small next to the target's), every row
feeds its last ``width`` tokens in one forward and the ``k`` draft positions run as ``k``
batched forwards; each row's caches are then extracted back (a lone row drafts on its own
caches: no merge, no copy). Where multi-query attention builds a plan per key length (CUDA,
``attention_shapes``: about 40 ms each, and a row's length changes every step), the ``width``
tokens go one query per forward instead (one row's 4-token draft: 46.9 ms before, 16.9-20.0
after on an H100, runs D2-D4).
``width`` is the same for all: after a verification a row lacks one token or a few (the new
one, accepted drafts it never fed itself); a row lacking fewer gives back a few cached
tokens and computes them again, a row further behind (a new prompt) is first fed alone. So a
step costs ``k`` draft forwards, not ``k`` per row.

**Rollback.** Before a row drafts, its caches are cut to the longest prefix of what they hold
that the row's tokens still agree with: accepted drafts stay, rejected ones go. So a row never
prefills its history again.

**Exact.** The draft is greedy: its proposal is a point mass, as prompt lookup's is, so
verification's rule ("sample the target's token with the plain step's key, keep it iff it is
the draft") is the standard speculative rule and keeps the target's distribution
(``verification``); greedy rows keep the target's argmax path whatever the draft says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    BatchKVCache,
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)

from mlxd.errors import ConfigError
from mlxd.worker.kv import attention_shapes
from mlxd.worker.sched.sequence import Sequence

PREFILL_CHUNK = 1024  # tokens of a row's history fed to the draft per forward
CATCH_UP = 16  # most new tokens per row in the batched forward; a row further behind is fed alone


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
            raise ConfigError(
                f"--draft-model {path}: its vocabulary has {vocab_size} tokens, "
                f"the model's {target_vocab_size}: a draft model must share the "
                "target's vocabulary"
            )
        if not can_trim_prompt_cache(make_prompt_cache(model)):
            raise ConfigError(
                f"--draft-model {path}: its caches cannot be rolled back (sliding "
                "windows or recurrent layers)"
            )
        self.model = model
        self._rows: dict[Sequence, _Row] = {}  # (finished rows' are dropped: ``forget``)

    def propose(self, rows: list[Sequence], lengths: list[int]) -> list[list[int]]:
        """Each row's ``lengths[i]`` greedy draft tokens (``[]`` for 0), after its tokens."""
        drafting = [(seq, k) for seq, k in zip(rows, lengths, strict=True) if k > 0]
        if not drafting:
            return [[] for _ in rows]
        seqs = [seq for seq, _ in drafting]
        width = self._catch_up(seqs)
        drafts = self._decode(seqs, width, max(k for _, k in drafting))
        by_seq = {seq: d[:k] for (seq, k), d in zip(drafting, drafts, strict=True)}
        return [by_seq.get(seq, []) for seq in rows]

    def forget(self) -> None:
        """Drop finished rows' caches (a preempted row keeps its own: it resumes)."""
        for seq in [s for s in self._rows if s.is_finished]:
            del self._rows[seq]

    @property
    def num_rows(self) -> int:
        """Rows holding draft caches now."""
        return len(self._rows)

    def _catch_up(self, seqs: list[Sequence]) -> int:
        """Bring every row's caches to its tokens but its last ``width`` (returned), the same
        for all rows, so one batched forward feeds them: rows further behind (a new row's
        prompt) are fed alone first; rows with fewer new tokens give back a few cached ones,
        which the batch computes again."""
        behind = [
            self._sync(seq, self._rows.setdefault(seq, _Row(make_prompt_cache(self.model))))
            for seq in seqs
        ]
        width = min(min(max(behind), CATCH_UP), min(_length(s) for s in seqs))
        for seq, n in zip(seqs, behind, strict=True):
            row = self._rows[seq]
            if n > width:  # fed alone, in chunks
                self._feed(row, _tokens(seq, len(row.tokens))[: n - width])
            else:
                trim_prompt_cache(row.caches, width - n)
                del row.tokens[len(row.tokens) - (width - n) :]
        return width

    def _decode(self, seqs: list[Sequence], width: int, k: int) -> list[list[int]]:
        """``k`` greedy tokens per row, in one batch over the rows' merged caches; each row's
        caches then hold its tokens and the first ``k - 1`` drafts."""
        rows = [self._rows[seq] for seq in seqs]
        merged = len(rows) > 1  # a lone row drafts on its own caches
        batch = (
            [
                BatchKVCache.merge([row.caches[i] for row in rows])
                for i in range(len(rows[0].caches))
            ]
            if merged
            else rows[0].caches
        )
        inputs = mx.array([_tokens(seq, _length(seq) - width) for seq in seqs])
        if attention_shapes.PLANNED:  # one query at a time: no attention plan per key length
            for j in range(width - 1):
                self.model(inputs[:, j : j + 1], cache=batch)
            inputs = inputs[:, -1:]
        token = self._next(inputs, batch)
        out = [token]
        for _ in range(k - 1):
            token = self._next(token[:, None], batch)
            out.append(token)
        drafts = mx.stack(out, axis=1)
        mx.eval(drafts, [c.state for c in batch])
        values: list[list[int]] = drafts.tolist()  # type: ignore[assignment]
        for b, (seq, row) in enumerate(zip(seqs, rows, strict=True)):
            if merged:
                row.caches = [c.extract(b) for c in batch]
            row.tokens += _tokens(seq, len(row.tokens)) + values[b][:-1]
        return values

    def _feed(self, row: _Row, tokens: list[int]) -> None:
        for start in range(0, len(tokens), PREFILL_CHUNK):
            chunk = tokens[start : start + PREFILL_CHUNK]
            self.model(mx.array([chunk]), cache=row.caches)
            mx.eval([c.state for c in row.caches])
            row.tokens += chunk

    def _next(self, inputs: mx.array, caches: list[Any]) -> mx.array:
        logits = self.model(inputs, cache=caches)
        return mx.argmax(logits[:, -1, :], axis=-1)

    def _sync(self, seq: Sequence, row: _Row) -> int:
        """Cut ``row``'s caches to the tokens ``seq`` still agrees with (accepted drafts stay,
        rejected ones go); returns how many of ``seq``'s tokens they lack (at least 1)."""
        total = _length(seq)
        ahead, tail = row.tokens[row.agreed :], _tokens(seq, row.agreed)
        same = 0
        while same < min(len(ahead), len(tail)) and ahead[same] == tail[same]:
            same += 1
        keep = min(row.agreed + same, total - 1)  # at least one token to feed: the last
        trim_prompt_cache(row.caches, len(row.tokens) - keep)
        del row.tokens[keep:]
        row.agreed = total
        return total - keep


def _length(seq: Sequence) -> int:
    return seq.num_prompt_tokens + seq.num_output_tokens


def _tokens(seq: Sequence, start: int) -> list[int]:
    """``(prompt + output)[start:]`` of ``seq``, without building the whole list."""
    prompt = seq.prompt_ids
    if start < len(prompt):
        return prompt[start:] + seq.output_ids
    return seq.output_ids[start - len(prompt) :]
