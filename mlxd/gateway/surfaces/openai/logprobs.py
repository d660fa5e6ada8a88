"""The worker's ``TokenLogprob`` entries as OpenAI ``logprobs`` objects.

Chat completions use ``{"content": [{token, logprob, bytes, top_logprobs}]}``; legacy completions
use parallel lists ``tokens``, ``token_logprobs``, ``top_logprobs`` (token -> logprob maps) and
``text_offset``. A token's text is its bytes decoded with replacement characters, since one token
may hold only part of a UTF-8 character; ``bytes`` keeps the exact value.
"""

from __future__ import annotations

from typing import Any

from mlxd.protocol.messages import TokenLogprob, TopLogprob


def chat_logprobs(entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
    """The ``choices[].logprobs`` of a chat completion (or chunk); ``None`` when not asked."""
    if entries is None:
        return None
    content = [{**_token(e), "top_logprobs": [_token(t) for t in e.top_logprobs]} for e in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(
    entries: list[TokenLogprob] | None, text_offset: int = 0
) -> dict[str, Any] | None:
    """The ``choices[].logprobs`` of a text completion whose first token starts at character
    ``text_offset`` of the output; ``None`` when not asked."""
    if entries is None:
        return None
    tokens = [_text(e.token) for e in entries]
    offsets = []
    for text in tokens:
        offsets.append(text_offset)
        text_offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{_text(t.token): t.logprob for t in e.top_logprobs} for e in entries],
        "text_offset": offsets,
    }


def _token(t: TokenLogprob | TopLogprob) -> dict[str, Any]:
    return {"token": _text(t.token), "logprob": t.logprob, "bytes": list(t.token)}


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")
