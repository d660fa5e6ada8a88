"""Constrained decoding for ``response_format``: one llguidance matcher per constrained request.

The matcher follows the request's output token by token; before each sample it fills a bitmask
of the tokens that keep the output a prefix of a valid document. Masks are filled on the host
(llguidance's Rust threads, without the GIL) and applied on the device with portable MLX ops,
only to the constrained rows of the batch. Why llguidance: docs/decisions/0002-*.md.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import Any

import llguidance
import llguidance.numpy
import mlx.core as mx

from mlxd.errors import InvalidRequest
from mlxd.protocol.messages import JsonFormat
from mlxd.worker.sched.sequence import Sequence

log = logging.getLogger(__name__)

SCHEMA_PARAM = "response_format.json_schema.schema"
_ANY_OBJECT = '{"type": "object"}'


class Grammar:
    """One request's constraint: an llguidance ``LLMatcher`` that follows its output."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher
        self.failed = False

    @classmethod
    def compile(cls, fmt: JsonFormat, tokenizer: Any) -> Grammar:
        """The matcher for ``fmt``; ``InvalidRequest`` naming the schema when it is not usable."""
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                fmt.schema or _ANY_OBJECT,
                # Compact JSON: flexible whitespace lets a weak model emit blank lines until
                # max_tokens.
                defaults={"whitespace_flexible": False},
            )
        except ValueError as exc:
            raise InvalidRequest(f"invalid JSON schema: {exc}", param=SCHEMA_PARAM) from None
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequest(f"invalid JSON schema: {matcher.get_error()}", param=SCHEMA_PARAM)
        return cls(matcher)

    def consume(self, token: int) -> None:
        """Follow one sampled token. A token the grammar refuses (it cannot happen unless the
        mask was bypassed) leaves the row unconstrained rather than failing the batch."""
        if self.failed:
            return
        if not self.matcher.consume_token(token):
            log.warning("grammar refused token %d: %s", token, self.matcher.get_error())
            self.failed = True

    @property
    def is_active(self) -> bool:
        return not self.failed


def advance(events: Iterable[tuple[Sequence, int]]) -> None:
    """Feed tokens just read back to their rows' matchers."""
    for seq, token in events:
        if seq.grammar is not None:
            seq.grammar.consume(token)


def constrain(logits: mx.array, seqs: list[Sequence]) -> mx.array:
    """``logits`` (B, V) with every token a constrained row's grammar forbids set to -inf; the
    same array when no row is constrained. Each matcher must have seen the row's last token."""
    rows = [i for i, s in enumerate(seqs) if s.grammar is not None and s.grammar.is_active]
    if not rows:
        return logits
    vocab = logits.shape[-1]
    bitmask = llguidance.numpy.allocate_token_bitmask(len(rows), vocab)
    matchers = [(seqs[i].grammar.matcher, j) for j, i in enumerate(rows)]
    llguidance.numpy.fill_next_token_bitmask_par(_executor(), matchers, bitmask)
    words = mx.array(bitmask)
    bits = (words[:, :, None] >> mx.arange(32, dtype=mx.int32)) & 1
    allowed = bits.reshape(len(rows), -1)[:, :vocab].astype(mx.bool_)
    # An additive 0/-inf bias on the constrained rows only: work grows with them, not the batch.
    bias = mx.where(allowed, mx.array(0.0, dtype=logits.dtype), float("-inf"))
    return logits.at[mx.array(rows)].add(bias)


def valid_drafts(seq: Sequence, drafts: list[int]) -> list[int]:
    """The longest prefix of ``drafts`` that ``seq``'s grammar accepts after its output so far
    (all of them for an unconstrained row): a draft the mask would forbid can never be sampled,
    so verifying it would only cost a position."""
    if seq.grammar is None or not seq.grammar.is_active or not drafts:
        return drafts
    return drafts[: seq.grammar.matcher.validate_tokens(drafts)]


def constrain_drafts(logits: mx.array, rows: list[tuple[Sequence, list[int]]]) -> mx.array:
    """``logits`` (N, V) of a verification: row ``i`` of ``rows`` owns the next
    ``1 + len(drafts)`` positions, in order; position ``j`` of a constrained row is masked by
    its grammar after the first ``j`` drafts (consumed, masked, then rolled back, so the
    matcher still follows only the output; the drafts are ``valid_drafts``)."""
    spans, start = [], 0
    for seq, drafts in rows:
        if seq.grammar is not None and seq.grammar.is_active:
            spans.append((seq.grammar.matcher, drafts, start))
        start += 1 + len(drafts)
    if not spans:
        return logits
    vocab = logits.shape[-1]
    positions = [start + j for _, drafts, start in spans for j in range(1 + len(drafts))]
    bitmask = llguidance.numpy.allocate_token_bitmask(len(positions), vocab)
    n = 0
    for matcher, drafts, _ in spans:
        for j in range(1 + len(drafts)):
            if j:
                matcher.consume_token(drafts[j - 1])
            llguidance.numpy.fill_next_token_bitmask(matcher, bitmask, n)
            n += 1
        if drafts:
            matcher.rollback(len(drafts))
    words = mx.array(bitmask)
    bits = (words[:, :, None] >> mx.arange(32, dtype=mx.int32)) & 1
    allowed = bits.reshape(len(positions), -1)[:, :vocab].astype(mx.bool_)
    bias = mx.where(allowed, mx.array(0.0, dtype=logits.dtype), float("-inf"))
    return logits.at[mx.array(positions)].add(bias)


@functools.cache
def _executor() -> Any:
    return llguidance.LLExecutor()
