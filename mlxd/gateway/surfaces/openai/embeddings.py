"""``POST /v1/embeddings``: OpenAI's request and response shapes over one ``Embed`` message.

``input`` is a string, a list of strings, a list of token ids or a list of token-id lists; the
worker embeds them all in batched forward passes. ``encoding_format`` ``base64`` is the raw
little-endian float32 bytes, which is exactly what the worker sends.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from mlxd.errors import InvalidRequest
from mlxd.gateway.http.accesslog import RequestRecord
from mlxd.gateway.request import EmbedRequest
from mlxd.gateway.surfaces.base import EmbedSurface
from mlxd.protocol.messages import Embeddings, TextPrompt, TokenPrompt

MAX_INPUTS = 2048  # OpenAI's limit per request
_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
_MAX_TOKEN_ID = 2**31 - 1


def parse_embeddings(body: Any, *_: str | None) -> EmbedRequest:
    """Validate a body (``X-Priority`` and the key's tier do not apply); ``InvalidRequest``
    naming the field otherwise."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object")
    for key in body:
        if key not in _FIELDS:
            raise InvalidRequest(f"Unrecognized request argument supplied: {key}", param=key)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string", param="model")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidRequest(
            "'encoding_format' must be 'float' or 'base64'", param="encoding_format"
        )
    if body.get("dimensions") is not None:
        raise InvalidRequest("'dimensions' is not supported", param="dimensions")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise InvalidRequest("'user' must be a string", param="user")
    return EmbedRequest(model, _inputs(body.get("input")), encoding)


def embeddings_body(model: str, reply: Embeddings, encoding: str) -> dict[str, Any]:
    """The OpenAI ``list`` of ``embedding`` objects for ``reply``."""
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(raw, reply.dimensions, encoding)}
        for i, raw in enumerate(reply.embeddings)
    ]
    n = reply.usage.prompt_tokens
    usage = {"prompt_tokens": n, "total_tokens": n}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def _encode(raw: bytes, dimensions: int, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(raw).decode("ascii")
    return list(struct.unpack(f"<{dimensions}f", raw))


def _inputs(value: Any) -> list[TextPrompt | TokenPrompt]:
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(_is_token_id(v) for v in value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "'input' must be a string, a list of strings, a list of token ids "
            "or a list of token-id lists",
            param="input",
        )
    if len(value) > MAX_INPUTS:
        raise InvalidRequest(f"'input' must have at most {MAX_INPUTS} items", param="input")
    return [_input(v, f"input[{i}]") for i, v in enumerate(value)]


def _input(value: Any, param: str) -> TextPrompt | TokenPrompt:
    if isinstance(value, str) and value:
        return TextPrompt(text=value)
    if isinstance(value, list) and value and all(_is_token_id(v) for v in value):
        return TokenPrompt(token_ids=list(value))
    raise InvalidRequest(f"'{param}' must be a non-empty string or list of token ids", param=param)


def _is_token_id(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _MAX_TOKEN_ID


def _local_body(record: RequestRecord, parsed: EmbedRequest, reply: Embeddings) -> Any:
    return embeddings_body(parsed.model, reply, parsed.encoding)


EMBEDDINGS = EmbedSurface("openai", "embeddings", parse_embeddings, _local_body)
