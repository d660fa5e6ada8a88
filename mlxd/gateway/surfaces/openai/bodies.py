"""Non-streamed OpenAI response bodies: ``chat.completion`` and ``text_completion``."""

from __future__ import annotations

import secrets
from typing import Any

from mlxd.gateway.surfaces.collect import ChoiceResult
from mlxd.gateway.surfaces.openai.logprobs import chat_logprobs, completion_logprobs
from mlxd.protocol.messages import Usage


def new_id(prefix: str) -> str:
    """A fresh OpenAI-style object id, e.g. ``chatcmpl-<hex>``."""
    return f"{prefix}-{secrets.token_hex(12)}"


def usage_dict(usage: Usage, reasoning_tokens: int | None = None) -> dict[str, Any]:
    """The OpenAI ``usage`` object; ``reasoning_tokens`` (where thinking is split out): the
    completion tokens inside thinking."""
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def finish_reason(reason: str, has_tool_calls: bool) -> str:
    """OpenAI's ``tool_calls`` when a choice that stopped on its own made calls."""
    return "tool_calls" if has_tool_calls and reason == "stop" else reason


def chat_completion(
    completion_id: str,
    model: str,
    created: int,
    choices: list[ChoiceResult],
    usage: Usage,
    reasoning: bool = False,
) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` object; ``reasoning``: thinking was split out (each
    message's ``reasoning_content``, null when it has none; ``reasoning_tokens`` counted)."""
    thinking = sum(c.reasoning_tokens for c in choices) if reasoning else None
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [_chat_choice(i, c, reasoning) for i, c in enumerate(choices)],
        "usage": usage_dict(usage, thinking),
    }


def text_completion(
    completion_id: str, model: str, created: int, choices: list[ChoiceResult], usage: Usage
) -> dict[str, Any]:
    """A non-streamed ``text_completion`` object."""
    out = [
        {
            "index": i,
            "text": c.text,
            "logprobs": completion_logprobs(c.logprobs),
            "finish_reason": c.finish_reason,
        }
        for i, c in enumerate(choices)
    ]
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": out,
        "usage": usage_dict(usage),
    }


def _chat_choice(index: int, choice: ChoiceResult, reasoning: bool = False) -> dict[str, Any]:
    has_calls = bool(choice.tool_calls)
    content = None if has_calls and not choice.text.strip() else choice.text
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if reasoning:
        message["reasoning_content"] = choice.reasoning or None
    if has_calls:
        message["tool_calls"] = [call.to_openai() for call in choice.tool_calls]
    return {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(choice.logprobs),
        "finish_reason": finish_reason(choice.finish_reason, has_calls),
    }
