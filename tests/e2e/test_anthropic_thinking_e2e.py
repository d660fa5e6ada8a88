"""Extended thinking end to end: a made model whose chat template has Qwen3's thinking switch
(``enable_thinking``) and opens ``<think>`` in its generation prompt, served by a real daemon,
asked through the official anthropic client as Claude Code asks (beta client, so ``?beta=true``
and an ``anthropic-beta`` header; thinking with a budget, ``clear_thinking``, ``cache_control``
system blocks, ``metadata.user_id``, streamed). The model is random, so its text is too: the
tests check that the switch reaches the template and that the blocks are well formed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.e2e, pytest.mark.model]

# The tiny tokenizer's ChatML with Qwen3's switch: thinking on (the default) opens <think> in
# the generation prompt; off closes an empty one, as Qwen3 does.
THINKING_TEMPLATE = r"""
{%- for message in messages -%}
  {{- '<|im_start|>' + message.role + '\n' -}}
  {%- if message.reasoning_content -%}
    {{- '<think>\n' + message.reasoning_content + '\n</think>\n\n' -}}
  {%- endif -%}
  {{- message.content + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}
    {{- '<think>\n\n</think>\n\n' -}}
  {%- else -%}
    {{- '<think>\n' -}}
  {%- endif -%}
{%- endif -%}
""".strip()
SYSTEM: Any = [
    {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}},
]
ASK: Any = [{"role": "user", "content": [{"type": "text", "text": "Tell me about pathlib"}]}]
CLEAR_ALL: Any = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
BETAS = ["interleaved-thinking-2025-05-14", "context-management-2025-06-27", "no-such-beta"]


def with_thinking_template(model: Path, out: Path) -> Path:
    """A copy of ``model`` (its files linked) whose chat template is ``THINKING_TEMPLATE``."""
    out.mkdir()
    for path in model.iterdir():
        (out / path.name).symlink_to(path)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.unlink()
    config_path.write_text(json.dumps({**config, "chat_template": THINKING_TEMPLATE}))
    return out


@pytest.fixture(scope="module")
def thinker(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    model = with_thinking_template(tiny_model, tmp_path_factory.mktemp("m") / "tiny-thinker")
    d = start_daemon(model, name="thinker")
    yield d
    stop_daemon(d)


def claude(daemon: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.base_url, api_key="unused", max_retries=0)


def test_the_switch_reaches_the_template(thinker: Daemon) -> None:
    with claude(thinker) as c:
        counts = {
            kind: c.beta.messages.count_tokens(
                model=thinker.model, messages=ASK, thinking=thinking, betas=BETAS
            ).input_tokens
            for kind, thinking in [
                ("on", {"type": "enabled", "budget_tokens": 1024}),
                ("off", {"type": "disabled"}),
            ]
        }
    assert counts["off"] > counts["on"]  # off closes the <think> that on leaves open


def test_claude_code_shaped_request_streams_thinking_then_text(thinker: Daemon) -> None:
    with claude(thinker) as c:
        stream = c.beta.messages.create(
            model=thinker.model,
            max_tokens=40,
            system=SYSTEM,
            messages=ASK,
            thinking={"type": "enabled", "budget_tokens": 6},
            context_management=CLEAR_ALL,
            metadata={"user_id": "user_0123_account__session_abc"},
            extra_body={"temperature": 0},
            betas=BETAS,
            stream=True,
        )
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    # The prompt opened <think>: the output starts inside thinking, which the budget ends.
    assert starts[:1] == ["thinking"], (starts, deltas)
    assert deltas.count("signature_delta") == 1
    assert deltas.index("signature_delta") == deltas.index("text_delta") - 1
    (final,) = [e for e in events if e.type == "message_delta"]
    assert final.context_management is not None
    assert final.context_management.applied_edits[0].type == "clear_thinking_20251015"


def test_thinking_budget_ends_thinking(thinker: Daemon) -> None:
    with claude(thinker) as c:
        msg = c.messages.create(
            model=thinker.model,
            max_tokens=40,
            messages=ASK,
            thinking={"type": "enabled", "budget_tokens": 3},
            extra_body={"temperature": 0},
        )
        long = c.messages.create(
            model=thinker.model,
            max_tokens=40,
            messages=ASK,
            thinking={"type": "enabled", "budget_tokens": 30},
            extra_body={"temperature": 0},
        )
    assert [b.type for b in msg.content][:2] == ["thinking", "text"]
    short_thought = msg.content[0].thinking  # type: ignore[union-attr]
    assert msg.content[0].signature  # type: ignore[union-attr]
    assert len(short_thought) < len(long.content[0].thinking)  # type: ignore[union-attr]


def test_thinking_off_gives_text_only(thinker: Daemon) -> None:
    with claude(thinker) as c:
        msg = c.messages.create(
            model=thinker.model,
            max_tokens=20,
            messages=ASK,
            thinking={"type": "disabled"},
            extra_body={"temperature": 0},
        )
    assert "thinking" not in [b.type for b in msg.content]
