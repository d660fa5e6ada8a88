"""``/api/tags``, ``/api/ps``, ``/api/show``, ``/api/version`` and the model-management routes
mlxd refuses (``/api/pull``, ``push``, ``create``, ``copy``, ``delete``).

Models are listed under their Ollama names (``names.display``). ``digest`` is a hash of the
name, an id for clients that key on it, not of the weights. ``size`` is the weights' size as
the memory budget counts it. ``/api/show`` loads nothing: the family and sizes come from the
model directory's ``config.json``, the context length from its worker when it is loaded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlxd import __version__
from mlxd.errors import InvalidRequest, MlxdError
from mlxd.gateway.http.body import read_body
from mlxd.gateway.surfaces.ollama.names import display, resolve
from mlxd.gateway.surfaces.ollama.surface import error_response, render_error
from mlxd.gateway.surfaces.openai.schemas import parse_json
from mlxd.protocol.messages import Pong

# What Ollama clients check the server's version against: the API mlxd follows.
OLLAMA_VERSION = "0.12.0"
FOREVER = datetime(9999, 12, 31, tzinfo=UTC)
LOADED = ("ready",)
CAPABILITIES = ["completion", "tools", "embedding"]
REFUSED = {
    "pull": "mlxd serves the models it was started with: `mlxd start --model ollama:NAME:TAG` "
    "serves a model already in Ollama's store, or any Hugging Face repo id or directory",
    "push": "mlxd does not publish models",
    "create": "mlxd does not build models from a Modelfile: serve a model directory, repo id or "
    "GGUF file with `mlxd start --model NAME=PATH`",
    "copy": "give a model more names with aliases (`[models.NAME] aliases = [...]` in the "
    "config file) instead",
    "delete": "mlxd does not manage a model store: unload a model with `mlxd unload NAME`",
}


class ModelPool(Protocol):
    """What the listings read of the worker pool (``WorkerPool`` has these)."""

    def names(self) -> list[str]: ...

    def info(self, name: str) -> Any: ...


Describe = Callable[[str], Awaitable[Pong | None]]  # a loaded model's Pong, else None


class OllamaModels:
    """The model routes of the Ollama API.

    Args:
        pool: the local models.
        remote: the remote models' names (listed; /api/chat and /api/generate serve them).
        describe: a loaded model's ``Pong`` (its path and context), ``None`` if not loaded.
        max_body_bytes: the body limit of ``/api/show``.
    """

    def __init__(
        self, pool: ModelPool, remote: list[str], describe: Describe, max_body_bytes: int
    ) -> None:
        self.pool = pool
        self.remote = remote
        self.describe = describe
        self.max_body_bytes = max_body_bytes

    async def tags(self, http: Request) -> Response:
        """``GET /api/tags``: every model, local then remote."""
        rows = [self._row(n) for n in self.pool.names()] + [_remote_row(n) for n in self.remote]
        return JSONResponse({"models": rows})

    async def ps(self, http: Request) -> Response:
        """``GET /api/ps``: the loaded local models."""
        rows = []
        for name in self.pool.names():
            info = self.pool.info(name)
            if info.state in LOADED:
                pong = await self.describe(name)
                rows.append(self._loaded_row(name, info, pong))
        return JSONResponse({"models": rows})

    async def show(self, http: Request) -> Response:
        """``POST /api/show``: a model's details."""
        try:
            body = parse_json(await read_body(http, self.max_body_bytes))
            name = _show_name(body)
            local = resolve(name, self._known())
            info = self.pool.info(local)  # ModelNotFound (404) when unknown
        except MlxdError as exc:
            return render_error(http, exc)
        pong = await self.describe(local) if info.state in LOADED else None
        return JSONResponse(_show_body(name, info.path, pong))

    async def version(self, http: Request) -> Response:
        """``GET /api/version``."""
        return JSONResponse({"version": OLLAMA_VERSION, "mlxd": __version__})

    def refused(self, what: str) -> Callable[[Request], Awaitable[Response]]:
        """The endpoint of ``/api/{what}``: 501 saying what mlxd does instead."""

        async def endpoint(http: Request) -> Response:
            return error_response(501, f"/api/{what} is not supported by mlxd: {REFUSED[what]}")

        return endpoint

    def _known(self) -> list[str]:
        names = self.pool.names()
        return names + [a for n in names for a in self.pool.info(n).aliases]

    def _row(self, name: str) -> dict[str, Any]:
        info = self.pool.info(name)
        shown = display(name)
        return {
            "name": shown,
            "model": shown,
            "modified_at": _iso(datetime.now(UTC)),
            "size": info.weights_bytes,
            "digest": _digest(name),
            "details": _details(info.path),
        }

    def _loaded_row(self, name: str, info: Any, pong: Pong | None) -> dict[str, Any]:
        row = self._row(name)
        row.pop("modified_at")
        left = info.keep_alive_s - (info.idle_s or 0.0)
        expires = FOREVER if info.keep_alive_s <= 0 else datetime.now(UTC) + timedelta(seconds=left)
        row["size"] = info.memory_bytes
        row["size_vram"] = info.memory_bytes
        row["expires_at"] = _iso(expires)
        if pong is not None:
            row["context_length"] = pong.max_context
        return row


# Internal helpers


def _show_name(body: Any) -> str:
    name = body.get("model") or body.get("name") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidRequest("'model' must be a non-empty string", param="model")
    return name


def _show_body(name: str, path: str, pong: Pong | None) -> dict[str, Any]:
    config = _config(path)
    arch = str(config.get("model_type") or "unknown")
    info: dict[str, Any] = {"general.architecture": arch}
    if pong is not None:
        info[f"{arch}.context_length"] = pong.max_context
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if key in config:
            info[f"{arch}.{key}"] = config[key]
    return {
        "modelfile": f"# served by mlxd\nFROM {path or display(name)}\n",
        "parameters": "",
        "template": "{{ .Prompt }}",  # mlxd renders the model's own (Jinja) chat template
        "details": _details(path),
        "model_info": info,
        "capabilities": CAPABILITIES,
        "modified_at": _iso(datetime.now(UTC)),
    }


def _config(path: str) -> dict[str, Any]:
    """The model's config.json when it is a directory (cheap: one small file)."""
    if not path:
        return {}
    try:
        data = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _details(path: str) -> dict[str, Any]:
    config = _config(path)
    family = str(config.get("model_type", ""))
    gguf = path.endswith(".gguf") or path.startswith("ollama:")
    return {
        "parent_model": "",
        "format": "gguf" if gguf else "safetensors",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": "",
        "quantization_level": _quantization(config),
    }


def _quantization(config: dict[str, Any]) -> str:
    quant = config.get("quantization")
    if isinstance(quant, dict) and "bits" in quant:
        return f"Q{quant['bits']}"
    return str(config.get("torch_dtype", "")).upper().replace("FLOAT", "F")  # F16, BF16, F32


def _remote_row(name: str) -> dict[str, Any]:
    shown = display(name)
    row = {"name": shown, "model": shown, "size": 0, "digest": _digest(name)}
    return {**row, "modified_at": _iso(datetime.now(UTC)), "details": _details("")}


def _digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def _iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")
