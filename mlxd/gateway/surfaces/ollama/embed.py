"""``/api/embed`` (``input``: a string or a list of them) and the older ``/api/embeddings``
(``prompt``: one string), over the same ``Embed`` message as OpenAI's ``/v1/embeddings``.

The worker's vectors are already unit length, as Ollama's ``/api/embed`` returns them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from mlxd.errors import InvalidRequest
from mlxd.gateway.request import EmbedRequest
from mlxd.gateway.surfaces.ollama.schemas import keep_alive_s
from mlxd.protocol.messages import Embeddings, TextPrompt, TokenPrompt

MAX_INPUTS = 2048


@dataclass(frozen=True, slots=True)
class OllamaEmbed(EmbedRequest):
    """An embed body: its inputs (and ``keep_alive_s``), and ``legacy`` for
    ``/api/embeddings``'s one-vector answer."""

    legacy: bool = False


def parse_embed(body: Any, *_: str | None) -> OllamaEmbed:
    """Validate an ``/api/embed`` body."""
    body = _object(body)
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        msg = "'input' must be a string or a non-empty list of strings"
        raise InvalidRequest(msg, param="input")
    if len(texts) > MAX_INPUTS:
        raise InvalidRequest(f"'input' must have at most {MAX_INPUTS} items", param="input")
    if body.get("dimensions") is not None:
        raise InvalidRequest("'dimensions' is not supported", param="dimensions")
    return _request(body, texts, legacy=False)


def parse_embeddings(body: Any, *_: str | None) -> OllamaEmbed:
    """Validate an ``/api/embeddings`` body."""
    body = _object(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidRequest("'prompt' must be a string", param="prompt")
    return _request(body, [prompt], legacy=True)


def embed_body(parsed: OllamaEmbed, model: str, reply: Embeddings, ns: dict[str, int]) -> Any:
    """The answer: ``{"embeddings": [...]}`` (or ``{"embedding": [...]}`` for the old route)."""
    vectors = [list(struct.unpack(f"<{reply.dimensions}f", raw)) for raw in reply.embeddings]
    if parsed.legacy:
        return {"embedding": vectors[0]}
    return {
        "model": model,
        "embeddings": vectors,
        **ns,
        "prompt_eval_count": reply.usage.prompt_tokens,
    }


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string", param="model")
    if body.get("options") is not None and not isinstance(body["options"], dict):
        raise InvalidRequest("'options' must be an object", param="options")
    return body


def _request(body: dict[str, Any], texts: list[str], legacy: bool) -> OllamaEmbed:
    # An empty string embeds as nothing in Ollama; here it would be an empty prompt.
    if any(not t for t in texts):
        raise InvalidRequest("inputs must not be empty strings", param="input")
    inputs: list[TextPrompt | TokenPrompt] = [TextPrompt(text=t) for t in texts]
    keep = keep_alive_s(body.get("keep_alive"))
    return OllamaEmbed(body["model"], inputs, "float", legacy=legacy, keep_alive_s=keep)
