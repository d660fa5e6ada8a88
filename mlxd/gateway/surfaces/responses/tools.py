"""Responses tools -> chat tools: what the model is offered, and what is dropped.

``function`` tools become chat functions; ``custom`` (freeform) tools, such as Codex's
``apply_patch``, become functions of one string argument, ``input``, and their calls go back as
``custom_tool_call`` items. Tools the server cannot run (``web_search``, ``file_search``,
``computer_use``, ``local_shell``, ``mcp``, ``namespace``...) are not offered and do not fail
the request: clients such as Codex send some by default. A ``tool_choice`` that forces one of
them is a 400, since ignoring it would change the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxd.errors import InvalidRequest

# The one argument a custom tool's call carries: its freeform text.
CUSTOM_INPUT = "input"
_CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {CUSTOM_INPUT: {"type": "string"}},
    "required": [CUSTOM_INPUT],
    "additionalProperties": False,
}
_RUNNABLE = ("function", "custom")
_CHOICE_MODES = ("none", "auto", "required")


@dataclass(frozen=True, slots=True)
class Tools:
    """A request's tools as the chat request sees them.

    Attributes:
        chat: the chat ``tools`` (``None`` when none is offered).
        custom: the names of the custom tools among them.
        dropped: the types of the tools not offered, in request order, without repeats.
    """

    chat: list[dict[str, Any]] | None
    custom: frozenset[str]
    dropped: tuple[str, ...]


def chat_tools(value: Any) -> Tools:
    """Validate ``tools``; split them into the offered and the dropped."""
    if value is None:
        return Tools(None, frozenset(), ())
    if not isinstance(value, list):
        raise InvalidRequest("'tools' must be a list", param="tools")
    offered, custom, dropped = [], set(), []
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(kind, str):
            raise InvalidRequest(f"'tools[{i}].type' must be a string", param=f"tools[{i}].type")
        if kind not in _RUNNABLE:
            if kind not in dropped:
                dropped.append(kind)
            continue
        offered.append(_function(tool, f"tools[{i}]", kind))
        if kind == "custom":
            custom.add(tool["name"])
    return Tools(offered or None, frozenset(custom), tuple(dropped))


def chat_tool_choice(value: Any, tools: Tools) -> Any:
    """``tool_choice`` as chat's: a mode, or ``{"type": "function", ...}`` naming one tool;
    ``None`` when nothing is offered and nothing is forced."""
    if value is None or value in _CHOICE_MODES:
        return None if tools.chat is None and value in (None, "auto", "none") else value
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in _RUNNABLE:
        name = value.get("name")
        if not isinstance(name, str):
            raise InvalidRequest("'tool_choice.name' must be a string", param="tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    if kind == "allowed_tools":
        raise InvalidRequest(
            "'tool_choice' of type 'allowed_tools' is not supported by this server",
            param="tool_choice.type",
        )
    if isinstance(kind, str):
        raise InvalidRequest(
            f"'tool_choice' forces a {kind!r} tool, which this server cannot run",
            param="tool_choice.type",
        )
    raise InvalidRequest(
        "'tool_choice' must be 'none', 'auto', 'required' or an object naming a tool",
        param="tool_choice",
    )


def _function(tool: dict[str, Any], where: str, kind: str) -> dict[str, Any]:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"'{where}.name' must be a non-empty string", param=f"{where}.name")
    function: dict[str, Any] = {"name": name}
    description = tool.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise InvalidRequest(
                f"'{where}.description' must be a string", param=f"{where}.description"
            )
        function["description"] = description
    if not isinstance(tool.get("strict", False), bool | None):
        raise InvalidRequest(f"'{where}.strict' must be a boolean", param=f"{where}.strict")
    if kind == "custom":
        function["parameters"] = _CUSTOM_PARAMETERS
        return {"type": "function", "function": function}
    parameters = tool.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidRequest(f"'{where}.parameters' must be an object", param=f"{where}.parameters")
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}
