"""The gateway's OpenAPI 3 document, served at ``/openapi.json``.

Hand-written from ``openai/schemas.py`` (the validator is the reference: it also rejects what this
document cannot express, e.g. ``min_tokens`` > ``max_tokens``). Clients and fuzzers
(schemathesis) read it; every rejection it leads to is an OpenAI-shaped error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd import __version__
from mlxd.gateway.backends.local.pool import WorkerPool
from mlxd.knobs import PRIORITIES

_NUM = {"type": "number"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_STR = {"type": "string"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


_STOP = {"anyOf": [_STR, {"type": "array", "items": _STR, "maxItems": 16}, {"type": "null"}]}
_SAMPLING: dict[str, Any] = {
    "model": _STR,
    "max_tokens": _nullable({**_INT, "minimum": 1}),
    "temperature": _nullable({**_NUM, "minimum": 0, "maximum": 2}),
    "top_p": _nullable({**_NUM, "exclusiveMinimum": 0, "maximum": 1}),
    "n": _nullable({**_INT, "minimum": 1, "maximum": 16}),
    "stream": _nullable(_BOOL),
    "stream_options": _nullable(
        {"type": "object", "properties": {"include_usage": _BOOL}, "additionalProperties": False}
    ),
    "stop": _STOP,
    "seed": _nullable(_INT),
    "presence_penalty": _nullable({**_NUM, "minimum": -2, "maximum": 2}),
    "frequency_penalty": _nullable({**_NUM, "minimum": -2, "maximum": 2}),
    "logit_bias": _nullable({"type": "object", "additionalProperties": _NUM}),
    "user": _nullable(_STR),
    "top_k": _nullable({**_INT, "minimum": -1}),
    "min_p": _nullable({**_NUM, "minimum": 0, "maximum": 1}),
    "repetition_penalty": _nullable({**_NUM, "exclusiveMinimum": 0}),
    "ignore_eos": _nullable(_BOOL),
    "min_tokens": _nullable({**_INT, "minimum": 0}),
    "stop_token_ids": _nullable({"type": "array", "items": {**_INT, "minimum": 0}}),
    "priority": _nullable({"enum": list(PRIORITIES)}),
    "speculate": _nullable(_BOOL),
}
_CONTENT_PART = {
    "type": "object",
    "properties": {"type": {"enum": ["text"]}, "text": _STR},
    "required": ["type", "text"],
}
_MESSAGE = {
    "type": "object",
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"anyOf": [_STR, {"type": "array", "items": _CONTENT_PART}, {"type": "null"}]},
        "name": _STR,
        "tool_calls": _nullable({"type": "array", "items": {"type": "object"}}),
        **{key: {"type": "null"} for key in ("refusal", "annotations", "audio", "function_call")},
        "tool_call_id": _STR,
    },
    "required": ["role"],
    "additionalProperties": False,
}
_CHAT = {
    "type": "object",
    "properties": {
        **_SAMPLING,
        "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
        "max_completion_tokens": _nullable({**_INT, "minimum": 1}),
        "tools": _nullable({"type": "array", "items": {"type": "object"}}),
        "tool_choice": {
            "anyOf": [{"enum": ["auto", "none", "required"]}, {"type": "object"}, {"type": "null"}]
        },
        "parallel_tool_calls": _nullable(_BOOL),
        "response_format": _nullable({"type": "object"}),
        "logprobs": _nullable(_BOOL),
        "top_logprobs": _nullable({**_INT, "minimum": 0, "maximum": 20}),
    },
    "required": ["model", "messages"],
    "additionalProperties": False,
}
_COMPLETION = {
    "type": "object",
    "properties": {
        **_SAMPLING,
        "prompt": {"anyOf": [{**_STR, "minLength": 1}, {"type": "array", "items": _INT}]},
        "echo": _nullable(_BOOL),
        "suffix": _nullable(_STR),
        "logprobs": _nullable({**_INT, "minimum": 0, "maximum": 20}),
        "best_of": _nullable({**_INT, "minimum": 1}),
    },
    "required": ["model", "prompt"],
    "additionalProperties": False,
}
_TEXT_BLOCK = {
    "type": "object",
    "properties": {"type": {"enum": ["text"]}, "text": _STR},
    "required": ["type", "text"],
}
_BLOCK = {
    "anyOf": [
        _TEXT_BLOCK,
        {
            "type": "object",
            "properties": {
                "type": {"enum": ["tool_use"]},
                "id": _STR,
                "name": _STR,
                "input": {"type": "object"},
            },
            "required": ["type", "id", "name", "input"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"enum": ["tool_result"]},
                "tool_use_id": _STR,
                "content": {"anyOf": [_STR, {"type": "array", "items": _TEXT_BLOCK}]},
            },
            "required": ["type", "tool_use_id"],
        },
    ]
}
_ANTHROPIC_MESSAGE = {
    "type": "object",
    "properties": {
        "role": {"enum": ["user", "assistant"]},
        "content": {"anyOf": [_STR, {"type": "array", "items": _BLOCK}]},
    },
    "required": ["role", "content"],
    "additionalProperties": False,
}
_ANTHROPIC_TOOL = {
    "type": "object",
    "properties": {"name": _STR, "description": _STR, "input_schema": {"type": "object"}},
    "required": ["name", "input_schema"],
}
_ANTHROPIC_PROMPT: dict[str, Any] = {
    "model": _STR,
    "messages": {"type": "array", "items": _ANTHROPIC_MESSAGE, "minItems": 1},
    "system": {"anyOf": [_STR, {"type": "array", "items": _TEXT_BLOCK}]},
    "tools": {"type": "array", "items": _ANTHROPIC_TOOL},
    "tool_choice": {
        "type": "object",
        "properties": {
            "type": {"enum": ["auto", "any", "tool", "none"]},
            "name": _STR,
            "disable_parallel_tool_use": _BOOL,
        },
        "required": ["type"],
    },
}
_MESSAGES = {
    "type": "object",
    "properties": {
        **_ANTHROPIC_PROMPT,
        "max_tokens": {**_INT, "minimum": 1},
        "stop_sequences": {"type": "array", "items": {**_STR, "minLength": 1}, "maxItems": 16},
        "stream": _BOOL,
        "temperature": {**_NUM, "minimum": 0, "maximum": 1},
        "top_p": {**_NUM, "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {**_INT, "minimum": -1},
        "metadata": {
            "type": "object",
            "properties": {"user_id": _STR},
            "additionalProperties": False,
        },
    },
    "required": ["model", "messages", "max_tokens"],
    "additionalProperties": False,
}
_COUNT_TOKENS = {
    "type": "object",
    "properties": _ANTHROPIC_PROMPT,
    "required": ["model", "messages"],
    "additionalProperties": False,
}
_RESPONSE_ITEM = {
    "type": "object",
    "properties": {
        "type": {
            "enum": [
                "message",
                "function_call",
                "function_call_output",
                "custom_tool_call",
                "custom_tool_call_output",
                "reasoning",
            ]
        },
        "role": {"enum": ["system", "developer", "user", "assistant"]},
        "content": {"anyOf": [_STR, {"type": "array", "items": {"type": "object"}}]},
        "call_id": _STR,
        "name": _STR,
        "arguments": _STR,
        "input": _STR,
        "output": _STR,
    },
}
_RESPONSES = {
    "type": "object",
    "properties": {
        "model": _STR,
        "input": {"anyOf": [_STR, {"type": "array", "items": _RESPONSE_ITEM, "minItems": 1}]},
        "instructions": _nullable(_STR),
        "max_output_tokens": _nullable({**_INT, "minimum": 1}),
        "temperature": _nullable({**_NUM, "minimum": 0, "maximum": 2}),
        "top_p": _nullable({**_NUM, "exclusiveMinimum": 0, "maximum": 1}),
        "seed": _nullable(_INT),
        "stream": _nullable(_BOOL),
        "store": _nullable(_BOOL),
        "previous_response_id": _nullable(_STR),
        "tools": _nullable({"type": "array", "items": {"type": "object"}}),
        "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]},
        "parallel_tool_calls": _nullable(_BOOL),
        "text": _nullable({"type": "object"}),
        "metadata": _nullable({"type": "object", "additionalProperties": _STR}),
        "user": _nullable(_STR),
    },
    "required": ["model", "input"],
}
_TOKENS = {"type": "array", "items": {**_INT, "minimum": 0}, "minItems": 1}
_EMBEDDINGS = {
    "type": "object",
    "properties": {
        "model": _STR,
        "input": {
            "anyOf": [
                {**_STR, "minLength": 1},
                _TOKENS,
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 2048,
                    "items": {"anyOf": [{**_STR, "minLength": 1}, _TOKENS]},
                },
            ]
        },
        "encoding_format": _nullable({"enum": ["float", "base64"]}),
        "dimensions": {"type": "null"},
        "user": _nullable(_STR),
    },
    "required": ["model", "input"],
    "additionalProperties": False,
}
_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {"message": _STR, "type": _STR, "param": {}, "code": {}},
            "required": ["message", "type"],
        }
    },
    "required": ["error"],
}
_ERRORS = {
    str(code): {"description": what, "content": {"application/json": {"schema": _ERROR}}}
    for code, what in [
        (400, "invalid request"),
        (401, "missing or bad API key"),
        (404, "unknown model"),
        (413, "body too large"),
        (429, "rate limited or queue full"),
        (503, "worker unavailable"),
        (504, "timed out"),
    ]
}
_OK_JSON = {"200": {"description": "OK", "content": {"application/json": {"schema": {}}}}}
_OK_COMPLETION = {
    "200": {
        "description": "A completion (JSON), or server-sent events when ``stream`` is true",
        "content": {"application/json": {"schema": {}}, "text/event-stream": {"schema": _STR}},
    }
}


def _post(summary: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": [
                {
                    "name": "X-Priority",
                    "in": "header",
                    "required": False,
                    "schema": {"enum": list(PRIORITIES)},
                },
            ],
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {**_OK_COMPLETION, **_ERRORS},
        }
    }


def _get(summary: str, parameters: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {**_OK_JSON, **_ERRORS}}
    if parameters:
        op["parameters"] = parameters
    return {"get": op}


def document(models: list[str]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the OpenAI- and Anthropic-compatible endpoints serving
    ``models``."""
    model = {"type": "string", "enum": models} if models else _STR
    model_param = {"name": "model", "in": "path", "required": True, "schema": model}
    chat = {**_CHAT, "properties": {**_CHAT["properties"], "model": model}}  # type: ignore[dict-item]
    completion = {**_COMPLETION, "properties": {**_COMPLETION["properties"], "model": model}}  # type: ignore[dict-item]
    embeddings = {**_EMBEDDINGS, "properties": {**_EMBEDDINGS["properties"], "model": model}}  # type: ignore[dict-item]
    messages = {**_MESSAGES, "properties": {**_MESSAGES["properties"], "model": model}}  # type: ignore[dict-item]
    count = {**_COUNT_TOKENS, "properties": {**_ANTHROPIC_PROMPT, "model": model}}
    responses = {**_RESPONSES, "properties": {**_RESPONSES["properties"], "model": model}}  # type: ignore[dict-item]
    return {
        "openapi": "3.1.0",
        "info": {"title": "mlxd", "version": __version__},
        "paths": {
            "/health": _get(
                "Liveness: 200 while any model or backend can serve (ok, or degraded naming each "
                "failed one), 503 when none can"
            ),
            "/health/ready": _get(
                "Readiness: 200 when ?model= can serve (without it: when everything can), else 503"
            ),
            "/v1/models": _get("The models served"),
            "/v1/models/{model}": _get("One model", [model_param]),
            "/v1/chat/completions": _post("Chat completion", chat),
            "/v1/completions": _post("Text completion", completion),
            "/v1/embeddings": _post("Embeddings", embeddings),
            "/v1/messages": _post("Anthropic Messages (Anthropic-shaped errors)", messages),
            "/v1/messages/count_tokens": _post("Anthropic token count", count),
            "/v1/responses": _post("OpenAI Responses API", responses),
        },
        "components": {
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
    }


def endpoint(pool: WorkerPool) -> Callable[[Request], Awaitable[Response]]:
    """The ``GET /openapi.json`` endpoint: the document for ``pool``'s models of the moment."""

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(document(pool.names()))

    return openapi_json
