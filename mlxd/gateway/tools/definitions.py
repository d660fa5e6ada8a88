"""Tools in requests: ``tools``, ``tool_choice`` and the ``tool_calls`` of assistant messages.

The tools go to the model's chat template (the worker renders them); the model's calls come back
in its text and are parsed by ``calls``. ``tool_choice`` "required" or a named function
constrains the output (the worker's constrained decoding, as for ``response_format``) to one
call's JSON body, ``{"name": ..., "arguments": {...}}`` valid against the tool's parameters, as
vLLM does; the gateway then reads the whole output as that call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mlxd.errors import InvalidRequest
from mlxd.protocol.messages import JsonFormat


@dataclass(frozen=True, slots=True)
class ToolUse:
    """What a request asked about tools: the tools the template sees, whether to parse calls,
    whether at most one call may be returned, and the constraint that forces a call."""

    tools: list[dict[str, Any]] | None = None
    parse_calls: bool = False
    single_call: bool = False
    forced: JsonFormat | None = None


def parse_tool_use(body: dict[str, Any]) -> ToolUse:
    """Validate ``tools``, ``tool_choice`` and ``parallel_tool_calls`` of a chat body."""
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidRequest("'parallel_tool_calls' must be a boolean", param="parallel_tool_calls")
    if choice is None or choice == "none" or tools is None:
        if choice not in (None, "none"):
            raise InvalidRequest("'tool_choice' needs 'tools'", param="tool_choice")
        choice = "auto" if choice is None else choice
    if choice == "none":
        return ToolUse()
    forced = None if choice == "auto" else _forced_call(choice, tools or [])
    single = parallel is False or forced is not None
    return ToolUse(tools=tools, parse_calls=tools is not None, single_call=single, forced=forced)


def message_tool_calls(value: Any, path: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls``, with JSON-string arguments decoded to objects
    (templates such as Qwen 2.5's apply ``tojson`` to them, as mlx-lm's server also does)."""
    if not isinstance(value, list):
        raise InvalidRequest(f"'{path}' must be a list", param=path)
    out = []
    for i, call in enumerate(value):
        where = f"{path}[{i}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequest(f"'{where}' must be a function call with a name", param=where)
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except ValueError:
                raise InvalidRequest(
                    f"'{where}.function.arguments' is not valid JSON",
                    param=f"{where}.function.arguments",
                ) from None
        function = {"name": fn["name"], "arguments": args}
        out.append({"id": call.get("id"), "type": "function", "function": function})
    return out


def forced_tool_name(forced: JsonFormat | None) -> str | None:
    """The function a forcing constraint (``_forced_call``'s) names, or ``None`` when it allows
    any of the tools: what a remote backend is asked for instead of the constraint."""
    schema = json.loads(forced.schema) if forced is not None and forced.schema else {}
    name = schema.get("properties", {}).get("name", {}).get("const")
    return name if isinstance(name, str) else None


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidRequest("'tools' must be a list", param="tools")
    for i, tool in enumerate(value):
        is_function = isinstance(tool, dict) and tool.get("type") == "function"
        fn = tool.get("function") if is_function else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidRequest(
                f"'tools[{i}]' must be a function with a name", param=f"tools[{i}]"
            )
    return value or None


def _forced_call(choice: Any, tools: list[dict[str, Any]]) -> JsonFormat:
    functions = [t["function"] for t in tools]
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise InvalidRequest("'tool_choice' must name a function", param="tool_choice")
        functions = [f for f in functions if f["name"] == name]
        if not functions:
            raise InvalidRequest(
                f"'tool_choice' names {name!r}, which is not in 'tools'", param="tool_choice"
            )
    elif choice != "required":
        raise InvalidRequest(
            "'tool_choice' must be 'none', 'auto', 'required' or a function", param="tool_choice"
        )
    shapes = [_call_schema(f) for f in functions]
    schema = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
    return JsonFormat(schema=json.dumps(schema))


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    params = function.get("parameters")
    return {
        "type": "object",
        "properties": {
            "name": {"const": function["name"]},
            "arguments": params if isinstance(params, dict) and params else {"type": "object"},
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
