"""Model names as Ollama clients write them: ``NAME:TAG``.

A pool model ``tiny`` is ``tiny:latest`` to Ollama, and ``ollama:llama3:8b`` (a model of
Ollama's store) is ``llama3:8b``. ``display`` gives that name; ``resolve`` maps any of a
model's spellings (``tiny``, ``tiny:latest``, ``ollama:llama3:8b``, ``llama3:8b``) back to the
name the pool and the router know, so what ``/api/tags`` lists is what ``/api/chat`` accepts.
"""

from __future__ import annotations

from collections.abc import Iterable

STORE_PREFIX = "ollama:"
DEFAULT_TAG = "latest"


def display(name: str) -> str:
    """``name`` as Ollama shows it: the store prefix dropped, ``:latest`` when it has no tag."""
    name = name.removeprefix(STORE_PREFIX)
    base = name.rsplit("/", 1)[-1]  # a namespace or host may come before NAME
    return name if ":" in base else f"{name}:{DEFAULT_TAG}"


def resolve(name: str, known: Iterable[str]) -> str:
    """The known name that ``name`` spells, or ``name`` itself (its 404 says it is unknown)."""
    known = list(known)
    if name in known:
        return name
    wanted = display(name)
    return next((k for k in known if display(k) == wanted), name)
