from __future__ import annotations

import json
from typing import Any

import pytest

from mlxd.gateway.tools.calls import ToolCallParser
from mlxd.gateway.tools.calls import split_tool_calls as _split
from mlxd.gateway.tools.formats import tool_format


def split_tool_calls(text: str) -> tuple[str, list[Any]]:
    return _split(text, ToolCallParser())


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def stream(text: str, size: int, max_calls: int | None = None) -> tuple[list[str], list[str]]:
    parser = ToolCallParser(max_calls)
    contents, names = [], []
    for i in range(0, len(text), size):
        content, calls = parser.feed(text[i : i + size])
        contents.append(content)
        names += [c.name for c in calls]
    content, calls = parser.finish()
    return [*contents, content], names + [c.name for c in calls]


def test_whole_output_splits_into_content_and_calls() -> None:
    content, calls = split_tool_calls(f"Let me check. {CALL}")
    assert content == "Let me check. "
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert calls[0].id.startswith("call_")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 1000])
def test_streamed_pieces_never_leak_tag_text(size: int) -> None:
    contents, names = stream(f"Hi <tool {CALL}{CALL} bye", size)
    assert "".join(contents) == "Hi <tool  bye"
    assert names == ["get_weather", "get_weather"]
    assert all("<tool_call" not in c for c in contents)


def test_text_without_calls_passes_through_except_a_possible_tag_start() -> None:
    parser = ToolCallParser()
    assert parser.feed("a < b and <tool") == ("a < b and ", [])
    assert parser.feed("box") == ("<toolbox", [])


def test_bad_json_call_is_kept_as_content() -> None:
    content, calls = split_tool_calls("<tool_call>{not json}</tool_call>")
    assert (content, calls) == ("<tool_call>{not json}</tool_call>", [])


def test_unterminated_call_parses_if_complete_else_is_content() -> None:
    content, calls = split_tool_calls('<tool_call>{"name": "f", "arguments": {}}')
    assert content == "" and [c.name for c in calls] == ["f"]
    content, calls = split_tool_calls('<tool_call>{"name": "f", "argu')
    assert content == '<tool_call>{"name": "f", "argu' and calls == []


def test_string_arguments_must_be_json() -> None:
    _, calls = split_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert json.loads(calls[0].arguments) == {"a": 1}
    content, calls = split_tool_calls('<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>')
    assert calls == [] and content.startswith("<tool_call>")


def test_max_calls_drops_the_rest() -> None:
    _, names = stream(CALL * 3, 4, max_calls=1)
    assert names == ["get_weather"]


QWEN3_CODER = (
    "Sure.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
DAYS_TOOL = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_mlx_lm_qwen3_coder_format_streams(size: int) -> None:
    parser = ToolCallParser(fmt=tool_format("qwen3_coder"), tools=DAYS_TOOL)
    content, calls = "", []
    for i in range(0, len(QWEN3_CODER), size):
        text, new = parser.feed(QWEN3_CODER[i : i + size])
        content, calls = content + text, calls + new
    text, new = parser.finish()
    content, calls = content + text, calls + new
    assert content == "Sure."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 3})
    ]  # typed by the tool's schema


def test_mlx_lm_format_without_end_marker_runs_to_the_end() -> None:
    mistral = tool_format("mistral")
    assert mistral.end == ""
    text = 'Hi[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    content, calls = _split(text, ToolCallParser(fmt=mistral))
    assert content == "Hi"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_unknown_format_falls_back_to_json() -> None:
    assert tool_format("no_such_parser").name == "json_tools"
    assert tool_format("../etc").name == "json_tools"


def test_loading_mlx_lm_formats_does_not_import_mlx() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from mlxd.gateway.tools.formats import tool_format; "
        "tool_format('qwen3_coder'); tool_format('mistral'); "
        "sys.exit('mlx' in sys.modules or 'mlx_lm' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
