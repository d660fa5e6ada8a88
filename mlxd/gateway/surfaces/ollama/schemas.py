"""Ollama's ``/api/chat`` and ``/api/generate`` bodies -> the gateway's ``ParsedRequest``.

Fields are checked for their types (a wrong type is a 400 naming it); fields mlxd does not know
are ignored, as Ollama's server ignores them. A body with nothing to answer (no ``messages``, no
``prompt``) is Ollama's way to load a model, or with ``keep_alive: 0`` to unload it: that parses
to a ``ModelOnly``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from mlxd.errors import InvalidRequest
from mlxd.gateway.request import ParsedRequest
from mlxd.gateway.surfaces.images import ImageParts
from mlxd.gateway.surfaces.ollama.options import check_num_ctx, defaulted, sampling_params
from mlxd.gateway.tools.definitions import message_tool_calls, parse_tool_use
from mlxd.protocol.messages import ChatPrompt, JsonFormat, Prompt, TextPrompt

_ROLES = ("system", "user", "assistant", "tool")
_THINK_LEVELS = ("high", "medium", "low")
_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class OllamaRequest(ParsedRequest):
    """A chat or generate body: the request every backend serves (its ``keep_alive`` in
    ``keep_alive_s``), plus Ollama's own fields.

    Attributes:
        think: the ``think`` field as sent (``True``/``False``/a level; ``None``: not sent).
            Sent, it sets the template's thinking switch and thinking text comes back apart,
            in ``thinking``; unsent, the template's default holds and the text stays inline,
            as Ollama does.
    """

    think: bool | str | None = None


@dataclass(frozen=True, slots=True)
class ModelOnly:
    """A body that names only a model: load it, or unload it (``keep_alive_s == 0``)."""

    model: str
    keep_alive_s: float | None


# Public API


def parse_chat(body: Any, *_: str | None) -> OllamaRequest | ModelOnly:
    """Validate an ``/api/chat`` body."""
    body = _object(body)
    model, keep_alive = _model(body), keep_alive_s(body.get("keep_alive"))
    messages = _typed(body, "messages", list, "a list")
    if not messages:
        return ModelOnly(model, keep_alive)
    tool_use = parse_tool_use({"tools": body.get("tools")})
    images = ImageParts()
    msgs = [_message(m, f"messages[{i}]", images) for i, m in enumerate(messages)]
    think = _think(body.get("think"))
    prompt = ChatPrompt(
        messages=msgs,
        tools=tool_use.tools,
        thinking=_switch(think),
        images=images.images or None,
    )
    parsed = _parsed(body, model, prompt, keep_alive)
    return replace(parsed, parse_tools=tool_use.parse_calls)


def parse_generate(body: Any, *_: str | None) -> OllamaRequest | ModelOnly:
    """Validate an ``/api/generate`` body: with ``raw`` the prompt goes to the model as it is,
    else through the model's chat template (with ``system``), as Ollama's template does."""
    body = _object(body)
    model, keep_alive = _model(body), keep_alive_s(body.get("keep_alive"))
    for key, why in (
        ("suffix", "fill-in-the-middle is not supported"),
        ("template", "mlxd uses the model's own chat template (use raw: true to send your own)"),
        ("context", "mlxd returns no context: send the conversation to /api/chat instead"),
    ):
        if body.get(key) not in (None, "", []):
            raise InvalidRequest(f"'{key}' is not supported: {why}", param=key)
    text = _typed(body, "prompt", str, "a string")
    system = _typed(body, "system", str, "a string")
    if not text:
        return ModelOnly(model, keep_alive)
    prompt: Prompt
    images = ImageParts()
    if _typed(body, "raw", bool, "a boolean"):
        if body.get("images"):
            raise InvalidRequest("'images' need the chat template: not with raw", param="images")
        prompt = TextPrompt(text=text)
    else:
        system_msgs = [{"role": "system", "content": system}] if system else []
        user = {"role": "user", "content": _with_images(text, body.get("images"), "images", images)}
        prompt = ChatPrompt(
            messages=[*system_msgs, user],
            thinking=_switch(_think(body.get("think"))),
            images=images.images or None,
        )
    return _parsed(body, model, prompt, keep_alive)


def keep_alive_s(value: Any) -> float | None:
    """``keep_alive``: seconds as a number, or a Go duration (``"5m"``, ``"1h30m"``, ``"-1"``)."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = value.strip() if isinstance(value, str) else None
    if text is not None:
        try:
            return float(text)
        except ValueError:
            pass
        parts = _DURATION.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNIT_S[u] for n, u in parts)
    raise InvalidRequest(
        "'keep_alive' must be a number of seconds or a duration such as \"5m\"",
        param="keep_alive",
    )


# Internal helpers


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def _model(body: dict[str, Any]) -> str:
    model = _typed(body, "model", str, "a string")
    if not model:
        raise InvalidRequest("'model' is required", param="model")
    return str(model)


def _parsed(
    body: dict[str, Any], model: str, prompt: Prompt, keep_alive: float | None
) -> OllamaRequest:
    options = body.get("options")
    sampling = sampling_params(options)
    check_num_ctx(options)
    fmt = _format(body.get("format"))
    if fmt is not None:
        sampling = replace(sampling, response_format=fmt)
    think = _think(body.get("think"))
    return OllamaRequest(
        model=model,
        prompt=prompt,
        sampling=sampling,
        stream=_stream(body),
        reasoning=think is not None,
        defaulted=defaulted(options),
        keep_alive_s=keep_alive,
        think=think,
    )


def _stream(body: dict[str, Any]) -> bool:
    value = _typed(body, "stream", bool, "a boolean")
    return True if value is None else bool(value)  # Ollama streams unless told not to


def _format(value: Any) -> JsonFormat | None:
    if value is None or value == "":
        return None
    if value == "json":
        return JsonFormat()
    if isinstance(value, dict):
        return JsonFormat(schema=json.dumps(value))
    raise InvalidRequest("'format' must be \"json\" or a JSON schema object", param="format")


def _think(value: Any) -> bool | str | None:
    if value is None or isinstance(value, bool) or value in _THINK_LEVELS:
        return value  # type: ignore[no-any-return]
    raise InvalidRequest("'think' must be a boolean or 'high', 'medium' or 'low'", param="think")


def _switch(think: bool | str | None) -> bool | None:
    """The template's thinking switch: a level (``"high"``...) switches it on."""
    return think if think is None or isinstance(think, bool) else True


def _message(msg: Any, path: str, images: ImageParts) -> dict[str, Any]:
    if not isinstance(msg, dict):
        raise InvalidRequest(f"'{path}' must be an object", param=path)
    role = msg.get("role")
    if role not in _ROLES:
        raise InvalidRequest(f"'{path}.role' must be one of {', '.join(_ROLES)}", param=path)
    content: Any = _typed(msg, "content", str, "a string", f"{path}.content") or ""
    if msg.get("images"):
        if role != "user":
            raise InvalidRequest(f"'{path}.images': only user messages take images", param=path)
        content = _with_images(content, msg["images"], f"{path}.images", images)
    out: dict[str, Any] = {"role": role, "content": content}
    thinking = _typed(msg, "thinking", str, "a string", f"{path}.thinking")
    if thinking and role == "assistant":
        out["reasoning_content"] = thinking  # where templates (Qwen3's) replay it
    name = _typed(msg, "tool_name", str, "a string", f"{path}.tool_name")
    if name:
        out["name"] = name  # the tool that answered, where a template shows it
    calls = _typed(msg, "tool_calls", list, "a list", f"{path}.tool_calls")
    if calls:
        calls = [_tool_call(c, f"{path}.tool_calls[{i}]") for i, c in enumerate(calls)]
        out["tool_calls"] = message_tool_calls(calls, f"{path}.tool_calls")
    return out


def _tool_call(call: Any, path: str) -> Any:
    # Ollama's calls carry no id or type; arguments are an object (a JSON string works too).
    if isinstance(call, dict) and isinstance(call.get("function"), dict):
        return {"type": "function", **call}
    raise InvalidRequest(f"'{path}' must be an object with a 'function'", param=path)


def _with_images(text: str, value: Any, path: str, images: ImageParts) -> Any:
    """A user turn's ``images`` (base64 strings) and text as chat content parts: the images
    first, as Ollama's templates place them; the text alone when there are none."""
    if not value:
        return text
    if not isinstance(value, list):
        raise InvalidRequest(f"'{path}' must be a list of base64 strings", param=path)
    for i, data in enumerate(value):
        images.add_base64(data, f"{path}[{i}]")
    return [*({"type": "image"} for _ in value), {"type": "text", "text": text}]


def _typed(
    obj: dict[str, Any], key: str, kind: type, kind_name: str, param: str | None = None
) -> Any:
    value = obj.get(key)
    if value is None or (isinstance(value, kind) and (kind is bool or not isinstance(value, bool))):
        return value
    name = param or key
    raise InvalidRequest(f"'{name}' must be {kind_name}", param=name)
