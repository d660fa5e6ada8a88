"""``POST /v1/embeddings``: OpenAI's request and response shapes over one ``Embed`` message.

``input`` is a string, a list of strings, a list of token ids or a list of token-id lists; the
worker embeds them all in batched forward passes. ``encoding_format`` ``base64`` is the raw
little-endian float32 bytes, which is exactly what the worker sends.
"""

from __future__ import annotations

import base64
import secrets
import struct
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd.config import ServeConfig
from mlxd.errors import InvalidRequest
from mlxd.gateway.accesslog import REQUEST_ID_HEADER, record_of
from mlxd.gateway.body import read_body
from mlxd.gateway.local.pool import WorkerPool
from mlxd.gateway.openai import schemas
from mlxd.gateway.openai.endpoints import MAX_REQUEST_ID_CHARS
from mlxd.protocol.messages import Embed, Embeddings, TextPrompt, TokenPrompt

MAX_INPUTS = 2048  # OpenAI's limit per request
_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
_MAX_TOKEN_ID = 2**31 - 1


class EmbeddingsEndpoint:
    """The ``/v1/embeddings`` endpoint, bound to the config and the worker pool.

    Args:
        config: the request body limit and the timeout (``embeddings_timeout_s``).
        pool: model name -> worker client.
    """

    def __init__(self, config: ServeConfig, pool: WorkerPool) -> None:
        self.config = config
        self.pool = pool

    async def create(self, request: Request) -> Response:
        """``POST /v1/embeddings``."""
        record = record_of(request)
        body = schemas.parse_json(await read_body(request, self.config.max_body_bytes))
        model, inputs, encoding = parse_embeddings(body)
        worker = await self.pool.client(model)
        record.model = model
        # Unique on the wire even when a client reuses its X-Request-Id.
        request_id = f"{record.request_id[:MAX_REQUEST_ID_CHARS]}.emb{secrets.token_hex(6)}"
        reply = await worker.embed(
            Embed(request_id=request_id, inputs=inputs), self.config.embeddings_timeout_s
        )
        record.usage = reply.usage
        headers = {REQUEST_ID_HEADER: record.request_id}
        return JSONResponse(embeddings_body(model, reply, encoding), 200, headers)


def parse_embeddings(body: Any) -> tuple[str, list[TextPrompt | TokenPrompt], str]:
    """Validate a body: ``(model, inputs, encoding_format)``; ``InvalidRequest`` naming the
    field otherwise."""
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
        raise InvalidRequest("'encoding_format' must be 'float' or 'base64'",
                             param="encoding_format")  # fmt: skip
    if body.get("dimensions") is not None:
        raise InvalidRequest("'dimensions' is not supported", param="dimensions")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise InvalidRequest("'user' must be a string", param="user")
    return model, _inputs(body.get("input")), encoding


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
        raise InvalidRequest("'input' must be a string, a list of strings, a list of token ids "
                             "or a list of token-id lists", param="input")  # fmt: skip
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
