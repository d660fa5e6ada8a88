"""Streamed chunks: a plain text delta's frame made from a template is byte for byte the frame
of the chunk built as dicts and serialized."""

from __future__ import annotations

import pytest

from mlxd.gateway.surfaces.openai.chunks import _MARK, ChatChunks, TextChunks
from mlxd.gateway.surfaces.sse import sse
from mlxd.gateway.tools.calls import ToolCallParser

TEXTS = ["hello", " world", 'say "hi"\\n', "tab\there\nnewline", "é ü 中文 🙂", "\x00\x1f", "</s>"]


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("kind", [ChatChunks, TextChunks])
def test_a_text_frame_is_the_serialized_delta_chunk(kind: type, include_usage: bool) -> None:
    fmt = kind("cmpl-1", 'm/odel "q"', 1700000000, n=3, include_usage=include_usage)
    for index in (0, 2):
        for text in TEXTS:
            assert fmt.text_frame(index, text) == sse(fmt.delta(index, text)[0])


def test_no_template_where_text_may_be_held_back_or_the_mark_is_in_the_chunk() -> None:
    tools = ChatChunks("c", "m", 0, new_parser=ToolCallParser)
    assert tools.text_frame(0, "hi") is None
    assert ChatChunks("c", _MARK, 0).text_frame(0, "hi") is None  # two places for the text
    near = ChatChunks("c", f"model-{_MARK}", 0)
    assert near.text_frame(0, "hi") == sse(near.delta(0, "hi")[0])
