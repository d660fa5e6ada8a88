from __future__ import annotations

import json

import pytest

from mlxd.gateway.toolcalls import ToolCallParser, split_tool_calls

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
