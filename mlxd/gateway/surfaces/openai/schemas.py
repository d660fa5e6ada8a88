"""OpenAI JSON <-> protocol messages: request validation and response bodies.

Every field is either validated or rejected: unknown fields and fields we do not support yet are
a 400 naming the field, never silently ignored. JSON ``null`` means "use the default".
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

from mlxd.errors import InvalidRequest
from mlxd.gateway.request import ParsedRequest
from mlxd.gateway.surfaces.images import ImageParts
from mlxd.gateway.tools.definitions import ToolUse, message_tool_calls, parse_tool_use
from mlxd.knobs import PRIORITIES
from mlxd.protocol.messages import (
    ChatPrompt,
    JsonFormat,
    Prompt,
    SamplingParams,
    TextPrompt,
    TokenPrompt,
)
from mlxd.protocol.validate import MAX_INT, MAX_SEED, MAX_STOP, MAX_TOP_LOGPROBS, SAMPLING_BOUNDS

MAX_N = 16  # choices per request: each is a sequence in the worker's batch
COMPLETION_DEFAULT_MAX_TOKENS = 16  # as OpenAI's /v1/completions

_SAMPLING_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "stream",
        "stream_options",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "user",
        "top_k",
        "min_p",
        "repetition_penalty",
        "ignore_eos",
        "min_tokens",
        "stop_token_ids",
        "priority",
        "speculate",
    }
)
_CHAT_FIELDS = _SAMPLING_FIELDS | {
    "reasoning_effort",  # chat only: the thinking switch, and thinking split out
    "messages",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "response_format",
    "logprobs",
    "top_logprobs",
    "parallel_tool_calls",
}
_COMPLETION_FIELDS = _SAMPLING_FIELDS | {"prompt", "echo", "suffix", "logprobs", "best_of"}
# OpenAI fields we do not serve yet: accepted only when null or false.
_UNSUPPORTED = frozenset(
    {
        "functions",
        "function_call",
        "audio",
        "modalities",
        "prediction",
        "service_tier",
        "store",
        "metadata",
        "reasoning_effort",
        "web_search_options",
        "verbosity",
        "prompt_cache_key",
        "safety_identifier",
    }
)
_ROLES = ("system", "developer", "user", "assistant", "tool")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
# reasoning_content: an assistant turn's thinking sent back (DeepSeek's and vLLM's name), for a
# template with a place for it (Qwen3); others ignore it.
_MESSAGE_KEYS = frozenset(
    {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"}
)
# Keys of OpenAI's response message that clients echo back in the history: null only.
_NULL_MESSAGE_KEYS = frozenset({"refusal", "annotations", "audio", "function_call"})


# Public API: requests


def parse_json(raw: bytes) -> Any:
    """Decode a request body; malformed JSON is an ``InvalidRequest``."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None


def parse_chat(
    body: Any, header_priority: str | None = None, tier: str | None = None
) -> ParsedRequest:
    """Validate a chat completions body; ``header_priority`` is the ``X-Priority`` header.

    ``tier`` is the API key's tier: the default priority and the highest one allowed.
    """
    body = _check_fields(body, _CHAT_FIELDS)
    response_format = _response_format(body.get("response_format"))
    max_tokens = _positive_int(body, "max_tokens")  # deprecated by OpenAI; the newer name wins
    max_tokens = _positive_int(body, "max_completion_tokens") or max_tokens
    tool_use = parse_tool_use(body)
    images = ImageParts()
    messages = _messages(body, images)
    prompt = ChatPrompt(messages=messages, tools=tool_use.tools, images=images.images or None)
    parsed = _parsed(body, prompt, max_tokens, header_priority, tier)
    parsed, response_format = _with_tools(parsed, tool_use, response_format)
    top = _int(body, "top_logprobs", 0, 0)
    if top > MAX_TOP_LOGPROBS:
        raise InvalidRequest(
            f"'top_logprobs' must be at most {MAX_TOP_LOGPROBS}", param="top_logprobs"
        )
    wants = _bool(body, "logprobs", False)
    if body.get("top_logprobs") is not None and not wants:
        raise InvalidRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    parsed = _with_logprobs(parsed, wants, top)
    parsed = _with_reasoning_effort(parsed, body.get("reasoning_effort"))
    if response_format is None:
        return parsed
    return replace(parsed, sampling=replace(parsed.sampling, response_format=response_format))


def parse_completion(
    body: Any, header_priority: str | None = None, tier: str | None = None
) -> ParsedRequest:
    """Validate a (legacy) completions body; ``header_priority`` and ``tier`` as for chat."""
    body = _check_fields(body, _COMPLETION_FIELDS)
    if _bool(body, "echo", False):
        raise InvalidRequest("'echo' is not supported yet", param="echo")
    if _typed(body, "suffix", str, "a string"):
        raise InvalidRequest("'suffix' is not supported yet", param="suffix")
    prompt = _completion_prompt(body.get("prompt"))
    max_tokens = _positive_int(body, "max_tokens") or COMPLETION_DEFAULT_MAX_TOKENS
    parsed = _parsed(body, prompt, max_tokens, header_priority, tier)
    if _int(body, "best_of", parsed.n, 1) != parsed.n:  # best_of == n: nothing to choose
        raise InvalidRequest("'best_of' other than 'n' is not supported", param="best_of")
    top = _int(body, "logprobs", -1, 0)  # legacy: the number of alternatives, 0 for none
    if top > MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"'logprobs' must be at most {MAX_TOP_LOGPROBS}", param="logprobs")
    return _with_logprobs(parsed, top >= 0, max(top, 0))


# Internal helpers: the request as a whole


def _check_fields(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object")
    for key, value in body.items():
        if key in _UNSUPPORTED and key not in allowed:
            if value is not None and value is not False:
                raise InvalidRequest(f"'{key}' is not supported by this server yet", param=key)
        elif key not in allowed:
            raise InvalidRequest(f"Unrecognized request argument supplied: {key}", param=key)
    return body


def _parsed(
    body: dict[str, Any],
    prompt: Prompt,
    max_tokens: int | None,
    header_priority: str | None,
    tier: str | None,
) -> ParsedRequest:
    model = _typed(body, "model", str, "a string")
    if not model:
        raise InvalidRequest("'model' is required", param="model")
    n = _int(body, "n", 1, 1)
    if n > MAX_N:
        raise InvalidRequest(f"'n' must be at most {MAX_N}", param="n")
    user = _typed(body, "user", str, "a string")
    stream = _bool(body, "stream", False)
    return ParsedRequest(
        model=model,
        prompt=prompt,
        sampling=_sampling(body, max_tokens),
        stream=stream,
        include_usage=_include_usage(body.get("stream_options"), stream),
        priority=priority_of(body, header_priority, tier),
        n=n,
        user=user,
    )


def _with_reasoning_effort(parsed: ParsedRequest, effort: Any) -> ParsedRequest:
    """``reasoning_effort``: the chat template's thinking switch (``none`` off, any other effort
    on), and the thinking split out of the answer as ``reasoning_content``. A request without
    it is served as before: the template's default, thinking left in ``content``."""
    if effort is None:
        return parsed
    if effort not in REASONING_EFFORTS:
        raise InvalidRequest(
            f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}",
            param="reasoning_effort",
        )
    prompt = parsed.prompt
    if isinstance(prompt, ChatPrompt):
        prompt = replace(prompt, thinking=effort != "none")
    return replace(parsed, prompt=prompt, reasoning=True)


def _sampling(body: dict[str, Any], max_tokens: int | None) -> SamplingParams:
    min_tokens = _int(body, "min_tokens", 0, 0)
    if max_tokens is not None and min_tokens > max_tokens:
        raise InvalidRequest("'min_tokens' must not exceed 'max_tokens'", param="min_tokens")
    top_k = _int(body, "top_k", 0, -1)  # -1 is vLLM's "off"
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_float(body, "temperature", 1.0, *SAMPLING_BOUNDS["temperature"]),
        top_p=_float(body, "top_p", 1.0, *SAMPLING_BOUNDS["top_p"]),
        top_k=max(top_k, 0),
        min_p=_float(body, "min_p", 0.0, *SAMPLING_BOUNDS["min_p"]),
        repetition_penalty=_float(
            body, "repetition_penalty", 1.0, *SAMPLING_BOUNDS["repetition_penalty"]
        ),
        presence_penalty=_float(
            body, "presence_penalty", 0.0, *SAMPLING_BOUNDS["presence_penalty"]
        ),
        frequency_penalty=_float(
            body, "frequency_penalty", 0.0, *SAMPLING_BOUNDS["frequency_penalty"]
        ),
        logit_bias=_logit_bias(body.get("logit_bias")),
        seed=_seed(body),
        stop=_stop(body.get("stop")),
        stop_token_ids=_token_ids(body.get("stop_token_ids"), "stop_token_ids", allow_empty=True),
        ignore_eos=_bool(body, "ignore_eos", False),
        min_tokens=min_tokens,
        speculate=_bool(body, "speculate", True),
    )


def _with_tools(
    parsed: ParsedRequest, tool_use: ToolUse, response_format: JsonFormat | None
) -> tuple[ParsedRequest, JsonFormat | None]:
    max_calls = 1 if tool_use.single_call else None
    parsed = replace(
        parsed,
        parse_tools=tool_use.parse_calls,
        max_tool_calls=max_calls,
        forced_tool_call=tool_use.forced is not None,
    )
    if tool_use.forced is None:
        return parsed, response_format
    if response_format is not None:
        raise InvalidRequest(
            "A 'tool_choice' that forces a call cannot be combined with 'response_format'",
            param="tool_choice",
        )
    return parsed, tool_use.forced


def _with_logprobs(parsed: ParsedRequest, wants: bool, top: int) -> ParsedRequest:
    if not wants:
        return parsed
    sampling = replace(parsed.sampling, logprobs=True, top_logprobs=top)
    return replace(parsed, sampling=sampling)


def _response_format(value: Any) -> JsonFormat | None:
    """``response_format``'s shape; the worker compiles (and so fully checks) the schema."""
    if value is None:
        return None
    param = "response_format"
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise InvalidRequest(
            f"'{param}.type' must be 'text', 'json_object' or 'json_schema'", param=f"{param}.type"
        )
    _only_keys(value, {"type", "json_schema"} if kind == "json_schema" else {"type"}, param)
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonFormat()
    spec, param = value.get("json_schema"), f"{param}.json_schema"
    if not isinstance(spec, dict):
        raise InvalidRequest(f"'{param}' must be an object", param=param)
    _only_keys(spec, {"name", "description", "schema", "strict"}, param)
    name = _typed(spec, "name", str, "a string", f"{param}.name")
    if not name or len(name) > 64 or not name.replace("_", "").replace("-", "").isalnum():
        raise InvalidRequest(
            f"'{param}.name' must be 1-64 letters, digits, _ or -", param=f"{param}.name"
        )
    _typed(spec, "description", str, "a string", f"{param}.description")
    _typed(spec, "strict", bool, "a boolean", f"{param}.strict")
    schema = _typed(spec, "schema", dict, "an object", f"{param}.schema")
    return JsonFormat(schema=None if schema is None else json.dumps(schema))


def _only_keys(obj: dict[str, Any], allowed: set[str], path: str) -> None:
    for key in obj:
        if key not in allowed:
            name = f"{path}.{key}"
            raise InvalidRequest(f"Unrecognized request argument supplied: {name}", param=name)


def _include_usage(options: Any, stream: bool) -> bool:
    if options is None:
        return False
    if not stream:
        raise InvalidRequest(
            "'stream_options' is only allowed when 'stream' is true", param="stream_options"
        )
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    for key in options:
        if key != "include_usage":
            name = f"stream_options.{key}"
            raise InvalidRequest(f"Unrecognized request argument supplied: {name}", param=name)
    return _bool(options, "include_usage", False, "stream_options.include_usage")


def priority_of(body: dict[str, Any], header: str | None, tier: str | None) -> str:
    """A request's priority: its ``priority`` field, else the ``X-Priority`` header, else the
    key's tier; never above the tier (remote backends queue by it too)."""
    value = _typed(body, "priority", str, "a string")
    param = "priority"
    if value is None and header is not None:
        value, param = header.strip().lower(), "X-Priority"
    if value is None:
        return tier or "normal"
    if value not in PRIORITIES:
        raise InvalidRequest(f"'{param}' must be one of {', '.join(PRIORITIES)}", param=param)
    if tier is not None and PRIORITIES.index(value) < PRIORITIES.index(tier):
        return tier  # a key may lower its priority, never raise it above its tier
    return str(value)


# Internal helpers: prompts


def _messages(body: dict[str, Any], images: ImageParts) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list", param="messages")
    return [_message(m, f"messages[{i}]", images) for i, m in enumerate(messages)]


def _message(msg: Any, path: str, images: ImageParts) -> dict[str, Any]:
    if not isinstance(msg, dict):
        raise InvalidRequest(f"'{path}' must be an object", param=path)
    for key, value in msg.items():
        if key in _NULL_MESSAGE_KEYS and value not in (None, []):
            raise InvalidRequest(f"'{path}.{key}' is not supported", param=f"{path}.{key}")
        if key not in _MESSAGE_KEYS and key not in _NULL_MESSAGE_KEYS:
            raise InvalidRequest(f"Unrecognized field '{path}.{key}'", param=f"{path}.{key}")
    role = msg.get("role")
    if role not in _ROLES:
        raise InvalidRequest(
            f"'{path}.role' must be one of {', '.join(_ROLES)}", param=f"{path}.role"
        )
    content = _content(msg.get("content"), path, images if role == "user" else None)
    out: dict[str, Any] = {"role": role, "content": content}
    for key in ("name", "tool_call_id", "reasoning_content"):
        value = _typed(msg, key, str, "a string", f"{path}.{key}")
        if value is not None:
            out[key] = value
    if msg.get("tool_calls") is not None:
        out["tool_calls"] = message_tool_calls(msg["tool_calls"], f"{path}.tool_calls")
    if out["content"] is None and "tool_calls" not in out:
        raise InvalidRequest(f"'{path}.content' is required", param=f"{path}.content")
    return out


def _content(value: Any, path: str, images: ImageParts | None) -> str | list[dict[str, Any]] | None:
    """A message's content: its text, or with images (a user's ``image_url`` parts) its parts
    in order, each image as ``{"type": "image"}`` (its bytes go to ``images``)."""
    if value is None or isinstance(value, str):
        return value
    path = f"{path}.content"
    if not isinstance(value, list):
        raise InvalidRequest(f"'{path}' must be a string or a list of parts", param=path)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(value):
        where = f"{path}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image_url" and images is not None:
            images.add_url(_image_url(part, where), f"{where}.image_url.url")
            parts.append({"type": "image"})
        elif kind == "text":
            text = _typed(part, "text", str, "a string", f"{where}.text") or ""
            parts.append({"type": "text", "text": text})
        else:
            what = "text and image_url" if images is not None else "text"
            raise InvalidRequest(
                f"'{where}': only {what} parts are supported", param=f"{where}.type"
            )
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _image_url(part: dict[str, Any], where: str) -> object:
    spec = part.get("image_url")
    if not isinstance(spec, dict):
        raise InvalidRequest(f"'{where}.image_url' must be an object", param=f"{where}.image_url")
    return spec.get("url")


def _completion_prompt(value: Any) -> TextPrompt | TokenPrompt:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise InvalidRequest("'prompt' must not be empty", param="prompt")
        return TextPrompt(text=value)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        raise InvalidRequest("A list of prompts is not supported yet", param="prompt")
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        raise InvalidRequest("A batch of token lists is not supported yet", param="prompt")
    return TokenPrompt(token_ids=_token_ids(value, "prompt"))


# Internal helpers: typed fields


def _typed(
    obj: dict[str, Any], key: str, kind: type, kind_name: str, param: str | None = None
) -> Any:
    value = obj.get(key)
    is_bool = isinstance(value, bool)
    if value is None or (isinstance(value, kind) and (kind is bool or not is_bool)):
        return value
    name = param or key
    raise InvalidRequest(f"'{name}' must be {kind_name}", param=name)


def _bool(obj: dict[str, Any], key: str, default: bool, param: str | None = None) -> bool:
    value = _typed(obj, key, bool, "a boolean", param)
    return default if value is None else bool(value)


def _int(obj: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = _typed(obj, key, int, "an integer", key)
    if value is None:
        return default
    if not minimum <= value <= MAX_INT:
        raise InvalidRequest(f"'{key}' must be an integer >= {minimum}", param=key)
    return int(value)


def _positive_int(obj: dict[str, Any], key: str) -> int | None:
    return _int(obj, key, 0, 1) if obj.get(key) is not None else None


def _float(
    obj: dict[str, Any],
    key: str,
    default: float,
    low: float,
    high: float,
    low_open: bool = False,
    param: str | None = None,
) -> float:
    value = obj.get(key)
    if value is None:
        return default
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    above = is_number and (value > low if low_open else value >= low)
    if not (above and math.isfinite(value) and value <= high):
        opening = "(" if low_open else "["
        bounds = f"> {low:g}" if high == math.inf else f"in {opening}{low:g}, {high:g}]"
        name = param or key
        raise InvalidRequest(f"'{name}' must be a number {bounds}", param=name)
    return float(value)


def _seed(obj: dict[str, Any]) -> int | None:
    value = _typed(obj, "seed", int, "an integer")
    if value is not None and not -MAX_SEED - 1 <= value <= MAX_SEED:
        raise InvalidRequest("'seed' must fit in 64 bits", param="seed")
    return value  # type: ignore[no-any-return]


def _stop(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else [] if value is None else value
    ok = isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)
    if not ok or len(stops) > MAX_STOP:
        msg = f"'stop' must be a non-empty string or a list of at most {MAX_STOP} of them"
        raise InvalidRequest(msg, param="stop")
    return list(stops)


def _token_ids(value: Any, param: str, allow_empty: bool = False) -> list[int]:
    if value is None and allow_empty:
        return []
    ok = isinstance(value, list) and (allow_empty or value)
    if not ok or not all(type(v) is int and 0 <= v <= MAX_INT for v in value):
        what = "a list of token ids" if allow_empty else "a string or a non-empty list of token ids"
        raise InvalidRequest(f"'{param}' must be {what}", param=param)
    return list(value)


def _logit_bias(value: Any) -> dict[int, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest("'logit_bias' must be an object", param="logit_bias")
    out: dict[int, float] = {}
    for key in value:
        if not (key.isascii() and key.isdigit() and int(key) <= MAX_INT):
            raise InvalidRequest(f"'logit_bias' key {key!r} is not a token id", param="logit_bias")
        out[int(key)] = _float(value, key, 0.0, -100.0, 100.0, param="logit_bias")
    return out
