"""Anthropic Messages JSON -> the OpenAI-shaped chat request the rest of the gateway serves.

Anthropic's own fields are checked here, with Anthropic's names in errors (``system``,
``messages[1].content[0].tool_use_id``, ``stop_sequences``...); the translated body then goes
through ``schemas.parse_chat``, whose checks of the shared fields (``model``, ``temperature``,
``top_p``, ``top_k``, ``stream``) keep the same names.

One rule for fields mlxd does not act on (docs/API.md): a field that only tunes how the server
runs the request (``_SERVER_SIDE``: ``cache_control``, ``service_tier``, ``metadata``...) is
accepted and ignored; a field whose effect would change the answer (``_UNSUPPORTED``: a
``container``, ``mcp_servers``, structured output) is a 400 naming it unless null; and a field
mlxd does not know is a 400 too, as Anthropic's API answers, since ignoring it might change the
answer. ``thinking`` and ``context_management`` are served (``thinking.py``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mlxd.errors import InvalidRequest
from mlxd.gateway.request import ParsedRequest
from mlxd.gateway.surfaces.anthropic import thinking
from mlxd.gateway.surfaces.openai.schemas import parse_chat
from mlxd.protocol.messages import ChatPrompt
from mlxd.protocol.validate import MAX_STOP

_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "tools",
        "tool_choice",
        "cache_control",
        "thinking",
        "context_management",
        "output_config",
    }
)
# Fields that only tune how Anthropic's servers run a request (prompt caching, capacity tier,
# region, speed, accounting): accepted and ignored.
_SERVER_SIDE = frozenset(
    {
        "service_tier",
        "inference_geo",
        "diagnostics",
        "speed",
        "user_profile_id",
        "workspace_id",
    }
)
# Fields mlxd does not serve whose effect would change the answer: accepted only when null.
_UNSUPPORTED = frozenset({"container", "mcp_servers", "output_format"})
_COUNT_FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "cache_control",
        "thinking",
        "context_management",
        "output_config",
    }
)


def parse_messages(
    body: Any, header_priority: str | None = None, tier: str | None = None
) -> ParsedRequest:
    """Validate a Messages body; ``header_priority`` and ``tier`` as for ``parse_chat``.
    Thinking is split out of the answer (where the model marks it) whatever ``thinking`` says:
    a model that thinks anyway shows it as thinking blocks, not as text."""
    parsed = parse_chat(to_openai_chat(body), header_priority, tier)
    switch = thinking.parse_thinking(body.get("thinking"))
    sampling = replace(parsed.sampling, thinking_budget=switch.budget_tokens)
    edits = thinking.applied_edits(cleared_thinking_turns(body))
    return replace(
        parsed,
        prompt=_switched(parsed.prompt, switch.enabled),
        sampling=sampling,
        reasoning=True,
        echo={"context_management": edits} if edits else {},
    )


def cleared_thinking_turns(body: dict[str, Any]) -> int | None:
    """How many assistant turns' thinking ``context_management`` drops (None: no such edit)."""
    clear = thinking.parse_context_management(body.get("context_management"))
    messages = body.get("messages")
    return None if clear is None else clear.cleared(messages if isinstance(messages, list) else [])


def to_openai_chat(body: Any) -> dict[str, Any]:
    """A Messages body, its Anthropic fields checked, as an OpenAI chat request body (absent
    fields as ``None``; tool-call ``arguments`` as objects), which ``parse_messages`` parses."""
    body = _check_fields(body, _FIELDS)
    max_tokens = body.get("max_tokens")
    if type(max_tokens) is not int or max_tokens < 1:
        raise InvalidRequest("'max_tokens' is required: an integer >= 1", param="max_tokens")
    temperature = body.get("temperature")
    if isinstance(temperature, int | float) and not 0 <= temperature <= 1:
        raise InvalidRequest("'temperature' must be in [0, 1]", param="temperature")
    stops = _stop_sequences(body.get("stop_sequences"))
    metadata = _metadata(body.get("metadata"))
    chat = {
        "model": body.get("model"),
        "messages": to_openai_messages(body),
        "max_tokens": max_tokens,
        "stream": body.get("stream"),
        "temperature": temperature,
        "top_p": body.get("top_p"),
        "top_k": body.get("top_k"),
        "stop": stops or None,
        "user": metadata.get("user_id"),
        **_tool_fields(body),
    }
    return chat


def parse_count_tokens(body: Any) -> ParsedRequest:
    """Validate a ``/v1/messages/count_tokens`` body (no sampling fields); the prompt is
    rendered with the thinking switch, as the same ``messages`` request would be."""
    body = _check_fields(body, _COUNT_FIELDS)
    chat = {"model": body.get("model"), "messages": to_openai_messages(body), **_tool_fields(body)}
    parsed = parse_chat(chat)
    switch = thinking.parse_thinking(body.get("thinking"))
    return replace(parsed, prompt=_switched(parsed.prompt, switch.enabled))


def to_openai_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``system`` and ``messages`` as OpenAI-shaped messages for the chat template: tool_use
    blocks become ``tool_calls``, tool_result blocks become ``tool`` messages, thinking blocks
    the assistant message's ``reasoning_content`` (unless ``context_management`` clears them)."""
    out = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text(system, "system")})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list", param="messages")
    cleared = set(thinking.thinking_turns(messages)[: cleared_thinking_turns(body) or 0])
    for i, msg in enumerate(messages):
        out += _message(msg, f"messages[{i}]", keep_thinking=i not in cleared)
    return out


# Internal helpers


def _check_fields(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object")
    for key, value in body.items():
        if key in _UNSUPPORTED:
            if value is not None:
                raise InvalidRequest(f"'{key}' is not supported by this server", param=key)
        elif key not in allowed and key not in _SERVER_SIDE:
            raise InvalidRequest(f"{key}: Extra inputs are not permitted", param=key)
    _output_config(body.get("output_config"))
    return body


def _output_config(value: Any) -> None:
    """``output_config``: ``effort`` only tunes how much the model thinks (ignored); a
    ``format`` would change the answer (400)."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise InvalidRequest("'output_config' must be an object", param="output_config")
    for key, item in value.items():
        if key != "effort" and item is not None:
            raise InvalidRequest(
                f"'output_config.{key}' is not supported by this server",
                param=f"output_config.{key}",
            )


def _switched(prompt: Any, enabled: bool | None) -> Any:
    return replace(prompt, thinking=enabled) if isinstance(prompt, ChatPrompt) else prompt


def _message(msg: Any, path: str, keep_thinking: bool = True) -> list[dict[str, Any]]:
    if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant", "system"):
        raise InvalidRequest(
            f"'{path}.role' must be 'user', 'assistant' or 'system'", param=f"{path}.role"
        )
    for key in msg:
        if key not in ("role", "content"):
            raise InvalidRequest(
                f"{path}.{key}: Extra inputs are not permitted", param=f"{path}.{key}"
            )
    role, content = msg["role"], msg.get("content")
    if role == "system":  # Claude Code's mid-conversation system text (its environment)
        return [{"role": "system", "content": _text(content, f"{path}.content")}]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise InvalidRequest(
            f"'{path}.content' must be a string or a list of blocks", param=f"{path}.content"
        )
    texts: list[str] = []
    images: list[tuple[int, dict[str, Any]]] = []  # (where among the texts, its part)
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for j, block in enumerate(content):
        where = f"{path}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_str(block, "text", where))
        elif kind == "image" and role == "user":
            images.append((len(texts), _image_part(block, where)))
        elif kind in thinking.THINKING_BLOCKS and role == "assistant":
            reasoning.append(_thinking_text(block, where) if keep_thinking else "")
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, where))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, where))
        else:
            raise InvalidRequest(
                f"'{where}.type' {kind!r} is not supported in a {role} message",
                param=f"{where}.type",
            )
    text = _with_images(texts, images) if images else "".join(texts)
    out = _blocks_to_messages(role, text, calls, results)
    if "".join(reasoning):
        out[-1]["reasoning_content"] = "\n\n".join(r for r in reasoning if r)
    return out


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``image`` block as an OpenAI ``image_url`` part: base64 as a data: URL, or its URL."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise InvalidRequest(f"'{where}.source' must be an object", param=f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        media = _str(source, "media_type", f"{where}.source")
        url = f"data:{media};base64,{_str(source, 'data', f'{where}.source')}"
    elif kind == "url":
        url = _str(source, "url", f"{where}.source")
    else:
        raise InvalidRequest(
            f"'{where}.source.type' must be base64 or url", param=f"{where}.source.type"
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _with_images(texts: list[str], images: list[tuple[int, dict[str, Any]]]) -> list[Any]:
    """A user turn's text and image parts, in the order of its blocks."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": t} for t in texts]
    for offset, (at, image) in enumerate(images):
        parts.insert(at + offset, image)
    return parts


def _blocks_to_messages(
    role: str, text: str | list[Any], calls: list[dict[str, Any]], results: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = list(results)  # tool results answer the previous turn: first
    if calls:
        out.append({"role": "assistant", "content": text or None, "tool_calls": calls})
    elif text or not results:
        out.append({"role": role, "content": text})
    return out


def _thinking_text(block: dict[str, Any], where: str) -> str:
    """A replayed thinking block's text; a redacted one (encrypted by Anthropic) has none
    that a local model could read. Signatures are not checked."""
    if block["type"] == "redacted_thinking":
        return ""
    return _str(block, "thinking", where)


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    args = block.get("input", {})
    if not isinstance(args, dict):
        raise InvalidRequest(f"'{where}.input' must be an object", param=f"{where}.input")
    function = {"name": _str(block, "name", where), "arguments": args}
    return {"id": _str(block, "id", where), "type": "function", "function": function}


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    content = block.get("content", "")
    text = _text(content, f"{where}.content") if content else ""
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": _str(block, "tool_use_id", where), "content": text}


def _text(value: Any, path: str) -> str:
    """A string, or a list of text blocks joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidRequest(f"'{path}' must be a string or a list of text blocks", param=path)
    texts = []
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise InvalidRequest(
                f"'{path}[{j}]': only text blocks are supported", param=f"{path}[{j}].type"
            )
        texts.append(_str(block, "text", f"{path}[{j}]"))
    return "".join(texts)


def _str(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise InvalidRequest(f"'{where}.{key}' must be a string", param=f"{where}.{key}")
    return value


def _stop_sequences(value: Any) -> list[str]:
    if value is None:
        return []
    ok = isinstance(value, list) and all(isinstance(s, str) and s for s in value)
    if not ok or len(value) > MAX_STOP:
        raise InvalidRequest(
            f"'stop_sequences' must be a list of at most {MAX_STOP} non-empty strings",
            param="stop_sequences",
        )
    return list(value)


def _metadata(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict) or set(value) - {"user_id"}:
        raise InvalidRequest("'metadata' may only hold 'user_id'", param="metadata")
    if not isinstance(value.get("user_id"), str | None):
        raise InvalidRequest("'metadata.user_id' must be a string", param="metadata.user_id")
    return dict(value)


def _tool_fields(body: dict[str, Any]) -> dict[str, Any]:
    tools = body.get("tools")
    if tools is None:
        if body.get("tool_choice") is not None:
            raise InvalidRequest("'tool_choice' needs 'tools'", param="tool_choice")
        return {}
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be a list", param="tools")
    fields: dict[str, Any] = {"tools": [_tool(t, f"tools[{i}]") for i, t in enumerate(tools)]}
    fields.update(_tool_choice(body.get("tool_choice")))
    return fields


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
        raise InvalidRequest(
            f"'{where}': only custom tools (name, input_schema) are supported", param=where
        )
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise InvalidRequest(
            f"'{where}.input_schema' must be an object", param=f"{where}.input_schema"
        )
    function = {"name": _str(tool, "name", where), "parameters": schema}
    if tool.get("description") is not None:
        function["description"] = _str(tool, "description", where)
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> dict[str, Any]:
    if choice is None:
        return {}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise InvalidRequest(
            "'tool_choice.type' must be 'auto', 'any', 'tool' or 'none'", param="tool_choice.type"
        )
    fields: dict[str, Any] = {
        "tool_choice": {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    }
    if kind == "tool":
        name = _str(choice, "name", "tool_choice")
        fields["tool_choice"] = {"type": "function", "function": {"name": name}}
    if choice.get("disable_parallel_tool_use") and kind != "none":
        fields["parallel_tool_calls"] = False
    return fields
