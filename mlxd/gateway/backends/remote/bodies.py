"""The request a remote backend is sent for a ``ParsedRequest``: one builder per backend kind,
whatever API the client spoke (OpenAI chat, Anthropic messages, Responses, Ollama...).

The prompt's messages are OpenAI-shaped (``tool_calls`` with object ``arguments``, ``tool``
messages); the sampling parameters map to the kind's fields. Defaults are not sent (a sampling
value equal to its default is indistinguishable from one not given, and some APIs refuse
``temperature`` with ``top_p``), nor are the defaults a surface filled in itself
(``ParsedRequest.defaulted``: Ollama's top_k 40 the client never sent): the upstream's own
defaults hold. What the backend's API cannot carry, when the client sent it, is a 400 naming
the field (``param``), never dropped. Images go as the API's image parts (OpenAI
``image_url`` data: URLs, Anthropic base64 ``image`` blocks) at their placeholders.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from mlxd.errors import InvalidRequest
from mlxd.gateway.images.formats import media_type
from mlxd.gateway.request import ParsedRequest
from mlxd.gateway.tools.definitions import forced_tool_name
from mlxd.protocol.messages import ChatPrompt, ImageData, JsonFormat, SamplingParams, TextPrompt

_NEUTRAL = SamplingParams()  # each sampling field's neutral value: as if not given
DEFAULT_MAX_TOKENS = 4096  # Anthropic requires max_tokens: asked for when the client set none
MIN_THINKING_BUDGET = 1024  # the Messages API's least thinking.budget_tokens
# mlxd's sampling extensions: (field, its default). Neither API carries them.
_EXTENSIONS: tuple[tuple[str, Any], ...] = (
    ("min_p", 0.0),
    ("repetition_penalty", 1.0),
    ("min_tokens", 0),
    ("ignore_eos", False),
    ("stop_token_ids", []),
    ("logprobs", False),
)
# Sampling fields the OpenAI API has and the Messages API does not: (field, its default).
_OPENAI_ONLY: tuple[tuple[str, Any], ...] = (
    ("seed", None),
    ("presence_penalty", 0.0),
    ("frequency_penalty", 0.0),
    ("logit_bias", {}),
)


def upstream_request(parsed: ParsedRequest, kind: str, model: str) -> tuple[str, dict[str, Any]]:
    """The path (under the backend's base URL) and body that ask ``model`` of a backend of
    ``kind`` for ``parsed``.

    Raises:
        InvalidRequest: the backend's API cannot carry part of the request.
    """
    if kind == "anthropic":
        return "messages", anthropic_body(parsed, model)
    if isinstance(parsed.prompt, TextPrompt):
        return "completions", openai_completion_body(parsed, model)
    return "chat/completions", openai_chat_body(parsed, model)


# OpenAI


def openai_chat_body(parsed: ParsedRequest, model: str) -> dict[str, Any]:
    """A ``/v1/chat/completions`` body."""
    prompt = _chat_prompt(parsed)
    images = iter(prompt.images or ())
    messages = [_openai_message(m, images) for m in prompt.messages]
    body: dict[str, Any] = {"model": model, "messages": messages}
    body |= _openai_sampling(parsed)
    fmt = None if parsed.forced_tool_call else parsed.sampling.response_format
    if fmt is not None:
        body["response_format"] = _openai_format(fmt)
    return body | _openai_tools(parsed, prompt)


def openai_completion_body(parsed: ParsedRequest, model: str) -> dict[str, Any]:
    """A ``/v1/completions`` body (a text prompt)."""
    assert isinstance(parsed.prompt, TextPrompt)
    return {"model": model, "prompt": parsed.prompt.text, **_openai_sampling(parsed)}


def _openai_sampling(parsed: ParsedRequest) -> dict[str, Any]:
    s = _sent(parsed)
    _refuse_extensions(s, "an OpenAI-compatible", ("top_k", 0))
    out: dict[str, Any] = {"stream": parsed.stream}
    if parsed.stream:
        out["stream_options"] = {"include_usage": True}  # usage comes last, in its own chunk
    fields = {
        "max_tokens": s.max_tokens,
        "temperature": None if s.temperature == 1.0 else s.temperature,
        "top_p": None if s.top_p == 1.0 else s.top_p,
        "n": None if parsed.n == 1 else parsed.n,
        "stop": s.stop or None,
        "seed": s.seed,
        "presence_penalty": s.presence_penalty or None,
        "frequency_penalty": s.frequency_penalty or None,
        "logit_bias": {str(k): v for k, v in s.logit_bias.items()} or None,
        "user": parsed.user,
    }
    return out | {k: v for k, v in fields.items() if v is not None}


def _openai_message(message: dict[str, Any], images: Iterator[ImageData]) -> dict[str, Any]:
    # The parsed prompt keeps tool-call arguments as objects (for chat templates); on the wire
    # they are JSON text. Replayed thinking (``reasoning_content``) stays here: OpenAI's API has
    # no field for it.
    out = {k: v for k, v in message.items() if k not in ("tool_calls", "reasoning_content")}
    if isinstance(content := message.get("content"), list):
        out["content"] = [_openai_part(p, images) for p in content]
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_openai_call(c) for c in calls]
    return out


def _openai_part(part: dict[str, Any], images: Iterator[ImageData]) -> dict[str, Any]:
    """A content part; an image placeholder as an ``image_url`` part with its bytes inline."""
    if part["type"] != "image":
        return part
    image = next(images)
    url = f"data:{media_type(image)};base64,{base64.b64encode(image.data).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


def _openai_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    arguments = function["arguments"]
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {**call, "function": {"name": function["name"], "arguments": text}}


def _openai_format(fmt: JsonFormat) -> dict[str, Any]:
    if fmt.schema is None:
        return {"type": "json_object"}
    schema = {"name": "response", "schema": json.loads(fmt.schema)}
    return {"type": "json_schema", "json_schema": schema}


def _openai_tools(parsed: ParsedRequest, prompt: ChatPrompt) -> dict[str, Any]:
    if not prompt.tools:
        return {}
    out: dict[str, Any] = {"tools": prompt.tools}
    if parsed.forced_tool_call:
        name = _forced_name(parsed, prompt)
        choice = {"type": "function", "function": {"name": name}}
        out["tool_choice"] = "required" if name is None else choice
    elif parsed.max_tool_calls == 1:
        out["parallel_tool_calls"] = False
    return out


# Anthropic


def anthropic_body(parsed: ParsedRequest, model: str) -> dict[str, Any]:
    """A Messages API (``/v1/messages``) body."""
    prompt = _chat_prompt(parsed)
    s = _sent(parsed)
    _refuse_anthropic_sampling(parsed)
    system, messages = _anthropic_messages(prompt.messages, iter(prompt.images or ()))
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": s.max_tokens or DEFAULT_MAX_TOKENS,
        "stream": parsed.stream,
    }
    fields = {
        "system": system or None,
        "temperature": None if s.temperature == 1.0 else s.temperature,
        "top_p": None if s.top_p == 1.0 else s.top_p,
        "top_k": s.top_k or None,
        "stop_sequences": s.stop or None,
        "metadata": None if parsed.user is None else {"user_id": parsed.user},
        "thinking": _anthropic_thinking(prompt.thinking, s.thinking_budget),
    }
    body |= {k: v for k, v in fields.items() if v is not None}
    return body | _anthropic_tools(parsed, prompt)


def _anthropic_thinking(thinking: bool | None, budget: int | None) -> dict[str, Any] | None:
    # The Messages API's least budget is 1024 tokens; None leaves the model's default (off).
    if thinking is None:
        return None
    if not thinking:
        return {"type": "disabled"}
    return {"type": "enabled", "budget_tokens": max(MIN_THINKING_BUDGET, budget or 0)}


def _refuse_anthropic_sampling(parsed: ParsedRequest) -> None:
    s = _sent(parsed)
    _refuse_extensions(s, "an Anthropic", *_OPENAI_ONLY)
    if parsed.n != 1:
        _refuse("n", "an Anthropic")
    if s.temperature > 1:
        raise InvalidRequest(
            "'temperature' above 1 cannot be sent to an Anthropic backend", param="temperature"
        )
    if s.response_format is not None and not parsed.forced_tool_call:
        _refuse("response_format", "an Anthropic")


def _anthropic_messages(
    messages: list[dict[str, Any]], images: Iterator[ImageData]
) -> tuple[str, list[dict[str, Any]]]:
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if message.get("name") is not None:
            _refuse(f"{where}.name", "an Anthropic")
        if message["role"] in ("system", "developer"):
            if out:
                raise InvalidRequest(
                    f"'{where}': an Anthropic backend takes system messages "
                    "only before the conversation",
                    param=f"{where}.role",
                )
            system.append(message.get("content") or "")
            continue
        role, blocks = _anthropic_turn(message, images)
        if out and out[-1]["role"] == role:  # tool results and the user's next words: one turn
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    return "\n\n".join(system), out


def _anthropic_turn(
    message: dict[str, Any], images: Iterator[ImageData]
) -> tuple[str, list[dict[str, Any]]]:
    role, text = message["role"], message.get("content") or ""
    if isinstance(text, list):  # a user's text and image parts
        return role, [_anthropic_block(p, images) for p in text if p.get("text") != ""]
    if role == "tool":
        result = {
            "type": "tool_result",
            "tool_use_id": str(message.get("tool_call_id")),
            "content": text,
        }
        return "user", [result]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for call in message.get("tool_calls") or ():
        blocks.append(_tool_use(call))
    return role, blocks


def _anthropic_block(part: dict[str, Any], images: Iterator[ImageData]) -> dict[str, Any]:
    """A content part as a block; an image placeholder as a base64 ``image`` block."""
    if part["type"] != "image":
        return part
    image = next(images)
    data = base64.b64encode(image.data).decode()
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type(image), "data": data},
    }


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    arguments = function["arguments"]
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    return {"type": "tool_use", "id": str(call.get("id")), "name": function["name"], "input": args}


def _anthropic_tools(parsed: ParsedRequest, prompt: ChatPrompt) -> dict[str, Any]:
    if not prompt.tools:
        return {}
    out: dict[str, Any] = {"tools": [_anthropic_tool(t, i) for i, t in enumerate(prompt.tools)]}
    choice: dict[str, Any] | None = None
    if parsed.forced_tool_call:
        name = _forced_name(parsed, prompt)
        choice = {"type": "any"} if name is None else {"type": "tool", "name": name}
    elif parsed.max_tool_calls == 1:
        choice = {"type": "auto", "disable_parallel_tool_use": True}
    return out | ({"tool_choice": choice} if choice else {})


def _anthropic_tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    function = tool["function"]
    if function.get("strict"):
        _refuse(f"tools[{i}].function.strict", "an Anthropic")
    schema = function.get("parameters") or {"type": "object", "properties": {}}
    out = {"name": function["name"], "input_schema": schema}
    if function.get("description"):
        out["description"] = function["description"]
    return out


# Both


def _sent(parsed: ParsedRequest) -> SamplingParams:
    """The sampling the client asked for: the surface's own defaults back to neutral."""
    if not parsed.defaulted:
        return parsed.sampling
    return replace(parsed.sampling, **{k: getattr(_NEUTRAL, k) for k in parsed.defaulted})


def _chat_prompt(parsed: ParsedRequest) -> ChatPrompt:
    if isinstance(parsed.prompt, ChatPrompt):
        return parsed.prompt
    if isinstance(parsed.prompt, TextPrompt):
        raise InvalidRequest(
            "a text prompt (no messages) cannot be sent to an Anthropic backend", param="prompt"
        )
    raise InvalidRequest(
        "a prompt of token ids cannot be sent to a remote backend (its tokenizer differs)",
        param="prompt",
    )


def _forced_name(parsed: ParsedRequest, prompt: ChatPrompt) -> str | None:
    """The function a forced call must be, ``None`` for any (one tool: any is that one)."""
    name = forced_tool_name(parsed.sampling.response_format)
    return None if prompt.tools is None or len(prompt.tools) == 1 else name


def _refuse_extensions(s: SamplingParams, what: str, *more: tuple[str, Any]) -> None:
    for name, default in (*_EXTENSIONS, *more):
        if getattr(s, name) != default:
            _refuse(name, what)


def _refuse(param: str, what: str) -> None:
    raise InvalidRequest(f"'{param}' cannot be sent to {what} backend", param=param)
