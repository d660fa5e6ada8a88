"""Tool-call formats: the markers around a call and the function that parses its text.

The Hermes / Qwen JSON format is built in. The others are mlx-lm's ``tool_parsers`` modules (the
worker names the one its tokenizer uses, see ``Pong.tool_parser``). Those modules are plain
Python (``json``, ``ast``, ``regex``), but importing them through ``mlx_lm`` would run
``mlx_lm/__init__`` and load MLX, which the gateway never does; so they are loaded from their
files as a package of their own, with their relative imports intact.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_PACKAGE = "_mlxd_mlx_lm_tool_parsers"

# parse(text between the markers, the request's tools) -> {"name", "arguments"} or a list of
# them; raises or returns None when the text is not a call.
Parse = Callable[[str, list[dict[str, Any]] | None], Any]


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """How one model family writes tool calls. ``end`` is empty when a call runs to the end;
    ``keeps_ids``: a call's ``id`` in the text is its id (only the gateway's own format)."""

    name: str
    start: str
    end: str
    parse: Parse
    keeps_ids: bool = False


def _parse_json(text: str, tools: list[dict[str, Any]] | None = None) -> Any:
    return json.loads(text.strip())


JSON_TOOLS = ToolFormat("json_tools", "<tool_call>", "</tool_call>", _parse_json)
_TOKEN = secrets.token_hex(8)
UPSTREAM_TOOLS = ToolFormat(
    "mlxd_upstream",
    f"\x1emlxd-call-{_TOKEN}\x1e",
    f"\x1e/mlxd-call-{_TOKEN}\x1e",
    _parse_json,
    keeps_ids=True,
)


def upstream_call_text(call_id: str, name: str, arguments: str) -> str:
    """A remote backend's tool call as event text in ``UPSTREAM_TOOLS`` (``arguments``: JSON)."""
    body = json.dumps({"id": call_id, "name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{UPSTREAM_TOOLS.start}{body}{UPSTREAM_TOOLS.end}"


@functools.cache
def tool_format(name: str | None) -> ToolFormat:
    """The format called ``name`` (mlx-lm's parser module name); JSON when unknown or None."""
    if name is None or name == JSON_TOOLS.name:
        return JSON_TOOLS
    if name == UPSTREAM_TOOLS.name:
        return UPSTREAM_TOOLS
    module = _load(name)
    if module is None:
        log.warning("no tool parser %r in mlx-lm: parsing tool calls as JSON", name)
        return JSON_TOOLS
    return ToolFormat(name, module.tool_call_start, module.tool_call_end, module.parse_tool_call)


def _load(name: str) -> Any:
    if not name.isidentifier():
        return None
    package = _package()
    if package is None:
        return None
    path = Path(package.__path__[0]) / f"{name}.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"{_PACKAGE}.{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@functools.cache
def _package() -> Any:
    # find_spec of a top-level package locates it without running its __init__.
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "tool_parsers"
    init = importlib.util.spec_from_file_location(
        _PACKAGE, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    assert init is not None and init.loader is not None
    package = importlib.util.module_from_spec(init)
    sys.modules[_PACKAGE] = package
    init.loader.exec_module(package)
    return package
