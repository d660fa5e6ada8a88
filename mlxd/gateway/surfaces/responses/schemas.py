"""A Responses API body -> the chat request the gateway serves, and what its response echoes.

The Responses fields are checked here, under their own names (``input[2].call_id``,
``max_output_tokens``, ``text.format``); the body is then rewritten as a chat completions body
and goes through ``openai.schemas.parse_chat``, whose checks of the shared fields (``model``,
``temperature``, ``top_p``, ``seed``, the tools) keep the same names. Unknown fields follow the
OpenAI surface's rule: a 400 naming the field. Fields that only tune how the server works
(``prompt_cache_key``, ``service_tier``, ``include``...) are accepted and ignored; fields whose
loss would change the answer (``background``, ``conversation``, ``prompt``...) are a 400 unless
null or false.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from mlxd.errors import InvalidRequest
from mlxd.gateway.request import ParsedRequest
from mlxd.gateway.surfaces.openai.schemas import parse_chat
from mlxd.gateway.surfaces.responses.items import call_ids, input_items, to_messages
from mlxd.gateway.surfaces.responses.store import ResponseStore
from mlxd.gateway.surfaces.responses.tools import chat_tool_choice, chat_tools
from mlxd.protocol.messages import ChatPrompt

# Read and served (or checked and echoed).
_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "temperature",
        "top_p",
        "seed",
        "stream",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "store",
        "previous_response_id",
        "metadata",
        "user",
        "reasoning",
        "top_logprobs",
        "truncation",
    }
)
# Hints to the server that change no answer here: accepted with any value, ignored.
_IGNORED = frozenset(
    {
        "include",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
        "service_tier",
        "stream_options",
        "client_metadata",
    }
)
# Served by OpenAI, not here, and ignoring them would change the answer: null or false only.
_REFUSED = frozenset(
    {
        "background",
        "background_options",
        "conversation",
        "prompt",
        "context_management",
        "moderation",
        "image",
        "access_programs",
        "cyber",
    }
)
# Echoed in the response object as sent (defaults where absent).
_ECHOED = {
    "instructions": None,
    "max_output_tokens": None,
    "max_tool_calls": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": {"effort": None, "summary": None},
    "service_tier": "default",
    "temperature": 1.0,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "top_logprobs": 0,
    "top_p": 1.0,
    "truncation": "disabled",
    "user": None,
    "prompt_cache_key": None,
    "safety_identifier": None,
}
_MAX_METADATA = 16
_EFFORTS = (None, "none", "minimal", "low", "medium", "high", "xhigh")


@dataclass(frozen=True, slots=True)
class ResponseSpec:
    """What a Responses request adds to the chat request it runs as.

    Attributes:
        echo: the request's fields the response object repeats (``instructions``, ``tools``...).
        custom_tools: the names of the custom (freeform) tools: their calls are
            ``custom_tool_call`` items.
        dropped_tools: the types of the tools not offered to the model.
        store: whether the response is kept for ``previous_response_id`` and retrieval.
        input_items: this request's input, as items with ids (``input_items`` lists them).
        history: the conversation before the output, as chat messages, without the
            instructions (they are not carried over to a continuation).
    """

    echo: dict[str, Any] = field(default_factory=dict)
    custom_tools: frozenset[str] = frozenset()
    dropped_tools: tuple[str, ...] = ()
    store: bool = True
    input_items: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ResponsesRequest(ParsedRequest):
    """A validated ``/v1/responses`` body: the chat request it runs as, and its ``spec``."""

    spec: ResponseSpec = field(default_factory=ResponseSpec)


def parse_responses(
    body: Any, store: ResponseStore, header_priority: str | None = None, tier: str | None = None
) -> ResponsesRequest:
    """Validate a Responses body; ``previous_response_id`` is looked up in ``store`` (an
    unknown id is a 404). ``header_priority`` and ``tier`` as for ``parse_chat``."""
    body = _check_fields(body)
    tools = chat_tools(body.get("tools"))
    previous = _previous(body, store)
    items = input_items(body.get("input"))
    calls = call_ids(previous)
    history = previous + to_messages(items, calls)
    chat = {
        "model": body.get("model"),
        "messages": _with_instructions(body, history),
        "max_completion_tokens": _max_output_tokens(body),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "seed": body.get("seed"),
        "stream": body.get("stream"),
        "user": body.get("user"),
        "tools": tools.chat,
        "tool_choice": chat_tool_choice(body.get("tool_choice"), tools),
        "parallel_tool_calls": body.get("parallel_tool_calls"),
        "response_format": _response_format(body.get("text")),
    }
    parsed = parse_chat(chat, header_priority, tier)
    spec = ResponseSpec(
        echo=_echo(body),
        custom_tools=tools.custom,
        dropped_tools=tools.dropped,
        store=_bool(body, "store", True),
        input_items=items,
        history=history,
    )
    # Thinking is always split out, as reasoning items: a model that thinks whatever the
    # switch says (or without one) shows it apart from the answer, as the API does.
    parsed = replace(_with_thinking(parsed, body.get("reasoning")), reasoning=True)
    return _responses_request(parsed, spec, _max_tool_calls(body))


# Internal helpers


def _check_fields(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object")
    for key, value in body.items():
        if key in _REFUSED:
            if value is not None and value is not False:
                raise InvalidRequest(f"'{key}' is not supported by this server", param=key)
        elif key not in _FIELDS and key not in _IGNORED:
            raise InvalidRequest(f"Unrecognized request argument supplied: {key}", param=key)
    if body.get("input") is None:
        raise InvalidRequest("'input' is required", param="input")
    _reasoning(body.get("reasoning"))
    _metadata(body.get("metadata"))
    if body.get("top_logprobs") not in (None, 0):
        raise InvalidRequest("'top_logprobs' is not supported yet", param="top_logprobs")
    if body.get("truncation") not in (None, "auto", "disabled"):
        raise InvalidRequest("'truncation' must be 'auto' or 'disabled'", param="truncation")
    return body


def _previous(body: dict[str, Any], store: ResponseStore) -> list[dict[str, Any]]:
    previous_id = body.get("previous_response_id")
    if previous_id is None:
        return []
    if not isinstance(previous_id, str):
        raise InvalidRequest(
            "'previous_response_id' must be a string", param="previous_response_id"
        )
    return store.conversation(previous_id)


def _with_instructions(body: dict[str, Any], history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prompt's messages: the instructions, then the conversation, the leading system
    messages joined into one (templates that allow a system message only first accept it)."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("'instructions' must be a string", param="instructions")
    messages = [{"role": "system", "content": instructions}] if instructions else []
    messages += history
    leading = 0
    while leading < len(messages) and messages[leading]["role"] == "system":
        leading += 1
    if leading < 2:
        return messages
    joined = "\n\n".join(m["content"] for m in messages[:leading])
    return [{"role": "system", "content": joined}, *messages[leading:]]


def _max_output_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_output_tokens")
    if value is not None and (type(value) is not int or value < 1):
        raise InvalidRequest(
            "'max_output_tokens' must be an integer >= 1", param="max_output_tokens"
        )
    return value


def _max_tool_calls(body: dict[str, Any]) -> int | None:
    value = body.get("max_tool_calls")
    if value is not None and (type(value) is not int or value < 1):
        raise InvalidRequest("'max_tool_calls' must be an integer >= 1", param="max_tool_calls")
    return value


def _response_format(text: Any) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format``."""
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise InvalidRequest("'text' may hold only 'format' and 'verbosity'", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise InvalidRequest(
            "'text.format.type' must be 'text', 'json_object' or 'json_schema'",
            param="text.format.type",
        )
    if kind != "json_schema":
        return {"type": kind}
    spec = {k: v for k, v in fmt.items() if k != "type"}
    if not isinstance(spec.get("name"), str):
        raise InvalidRequest("'text.format.name' must be a string", param="text.format.name")
    if not isinstance(spec.get("schema"), dict):
        raise InvalidRequest("'text.format.schema' must be an object", param="text.format.schema")
    return {"type": "json_schema", "json_schema": spec}


def _reasoning(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise InvalidRequest("'reasoning' must be an object", param="reasoning")
    if value.get("effort") not in _EFFORTS:
        raise InvalidRequest(
            f"'reasoning.effort' must be one of {', '.join(str(e) for e in _EFFORTS[1:])}",
            param="reasoning.effort",
        )


def _with_thinking(parsed: ParsedRequest, reasoning: dict[str, Any] | None) -> ParsedRequest:
    """``reasoning.effort`` as the chat template's thinking switch: ``none`` off, any other
    effort on, absent the template's default (a template without the switch ignores it)."""
    effort = None if reasoning is None else reasoning.get("effort")
    if effort is None or not isinstance(parsed.prompt, ChatPrompt):
        return parsed
    return replace(parsed, prompt=replace(parsed.prompt, thinking=effort != "none"))


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{key}' must be a boolean", param=key)
    return value


def _echo(body: dict[str, Any]) -> dict[str, Any]:
    echo = {key: _ECHOED[key] if body.get(key) is None else body[key] for key in _ECHOED}
    echo["tools"] = [t for t in body.get("tools") or [] if t.get("type") in ("function", "custom")]
    return echo


def _metadata(value: Any) -> None:
    if value is None:
        return
    ok = isinstance(value, dict) and len(value) <= _MAX_METADATA
    if not ok or not all(isinstance(v, str) and len(v) <= 512 for v in value.values()):
        raise InvalidRequest(
            f"'metadata' must be an object of at most {_MAX_METADATA} strings", param="metadata"
        )


def _responses_request(
    parsed: ParsedRequest, spec: ResponseSpec, max_tool_calls: int | None
) -> ResponsesRequest:
    values = {f.name: getattr(parsed, f.name) for f in fields(parsed)}
    if max_tool_calls is not None:
        limit = parsed.max_tool_calls
        values["max_tool_calls"] = max_tool_calls if limit is None else min(limit, max_tool_calls)
    return ResponsesRequest(**values, spec=spec)
