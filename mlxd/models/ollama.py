"""``ollama:NAME[:TAG]``: a model in Ollama's local store, found by its manifest.

Ollama keeps ``manifests/HOST/NAMESPACE/NAME/TAG`` (JSON, OCI-like) and content-addressed
``blobs/sha256-HEX`` under ``$OLLAMA_MODELS`` or ``~/.ollama/models``. The manifest's layer of
media type ``application/vnd.ollama.image.model`` is the GGUF file. Only that layer is used: the
chat template comes from the GGUF's own metadata (Ollama's template layer is a Go template).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from mlxd.errors import ConfigError

PREFIX = "ollama:"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"


def is_ollama(spec: str) -> bool:
    """Whether ``spec`` names a model in Ollama's store (``ollama:NAME[:TAG]``)."""
    return spec.startswith(PREFIX)


def store_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Ollama's model store: ``$OLLAMA_MODELS`` or ``~/.ollama/models``."""
    env = os.environ if environ is None else environ
    return Path(env.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def resolve(spec: str, environ: Mapping[str, str] | None = None) -> Path:
    """The GGUF blob that ``ollama:NAME[:TAG]`` points to.

    Args:
        spec: ``ollama:NAME[:TAG]``; NAME may be ``NAMESPACE/NAME`` or ``HOST/NAMESPACE/NAME``.
        environ: Where ``OLLAMA_MODELS`` is looked up (default: ``os.environ``).

    Returns:
        The path of the model's GGUF blob.
    """
    store = store_dir(environ)
    manifest = store / "manifests" / _manifest_path(spec[len(PREFIX) :])
    try:
        layers = json.loads(manifest.read_text())["layers"]
        digest = next(x["digest"] for x in layers if x["mediaType"] == MODEL_MEDIA_TYPE)
    except FileNotFoundError:
        raise ConfigError(f"{spec!r}: no manifest {manifest} (pull it with ollama)") from None
    except (ValueError, KeyError, TypeError, StopIteration) as exc:
        raise ConfigError(f"{spec!r}: manifest {manifest} names no model layer") from exc
    blob = store / "blobs" / str(digest).replace(":", "-")
    if not blob.is_file():
        raise ConfigError(f"{spec!r}: blob {blob} is missing")
    return blob


def cache_name(spec: str) -> str:
    """A readable name for the converted model: ``ollama-NAME-TAG``."""
    return "ollama-" + spec[len(PREFIX) :].replace("/", "-").replace(":", "-")


def _manifest_path(name: str) -> Path:
    name, _, tag = name.partition(":")
    parts = name.split("/")
    if not name or not all(parts) or len(parts) > 3 or ".." in parts or "/" in tag:
        raise ConfigError(f"bad Ollama model name {name!r}: use ollama:NAME[:TAG]")
    host_ns = [DEFAULT_HOST, DEFAULT_NAMESPACE][: 3 - len(parts)]
    return Path(*host_ns, *parts, tag or DEFAULT_TAG)
