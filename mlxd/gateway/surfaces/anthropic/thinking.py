"""Anthropic's extended thinking on a local model: the ``thinking`` switch, thinking blocks sent
back in assistant turns, and the ``clear_thinking_20251015`` context edit.

``thinking`` maps to the chat template's switch (``enable_thinking``) and the worker's thinking
budget; thinking blocks of earlier turns become the assistant message's ``reasoning_content``,
which a template with a place for it (Qwen3, DeepSeek-R1) renders and others ignore. The context
edit drops thinking from all but the last ``keep`` assistant turns that have any, before the
prompt is rendered, and the response reports it (``context_management.applied_edits``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from mlxd.errors import InvalidRequest

CLEAR_THINKING = "clear_thinking_20251015"
THINKING_BLOCKS = ("thinking", "redacted_thinking")


@dataclass(frozen=True, slots=True)
class ThinkingSwitch:
    """What a request's ``thinking`` asks: the template's switch (None: the field was absent)
    and a budget of thinking tokens (None: none but ``max_tokens``)."""

    enabled: bool | None = None
    budget_tokens: int | None = None


def parse_thinking(value: Any) -> ThinkingSwitch:
    """``thinking``: ``enabled`` (with ``budget_tokens``), ``adaptive`` (on, no budget of its
    own) or ``disabled``. A budget at or over ``max_tokens`` never binds (Anthropic refuses it;
    mlxd lets ``max_tokens`` decide, as Claude Code sends ``budget_tokens`` = max_tokens - 1)."""
    if value is None:
        return ThinkingSwitch(enabled=False)  # Anthropic's default: no thinking
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return ThinkingSwitch(enabled=False)
    if kind == "adaptive":  # its ``display`` (summarized, omitted) is not applied: text is shown
        return ThinkingSwitch(enabled=True)
    if kind != "enabled":
        raise InvalidRequest(
            "'thinking.type' must be 'enabled', 'adaptive' or 'disabled'", param="thinking.type"
        )
    budget = value.get("budget_tokens")
    if type(budget) is not int or not 1 <= budget:
        raise InvalidRequest(
            "'thinking.budget_tokens' must be an integer >= 1", param="thinking.budget_tokens"
        )
    return ThinkingSwitch(enabled=True, budget_tokens=budget)


@dataclass(frozen=True, slots=True)
class ClearThinking:
    """The ``clear_thinking_20251015`` edit: thinking stays in the last ``keep`` assistant
    turns that have any (None: in all of them)."""

    keep: int | None

    def cleared(self, messages: list[Any]) -> int:
        """How many assistant turns of ``messages`` lose their thinking."""
        turns = len(thinking_turns(messages))
        return 0 if self.keep is None else max(0, turns - self.keep)


def parse_context_management(value: Any) -> ClearThinking | None:
    """The clear_thinking edit of ``context_management``, if it has one; an edit mlxd does not
    apply is a 400 naming it."""
    if value is None:
        return None
    edits = value.get("edits", []) if isinstance(value, dict) else None
    if not isinstance(edits, list):
        raise InvalidRequest(
            "'context_management.edits' must be a list", param="context_management.edits"
        )
    clear = None
    for i, edit in enumerate(edits):
        where = f"context_management.edits[{i}]"
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind != CLEAR_THINKING:
            raise InvalidRequest(
                f"'{where}.type' {kind!r} is not supported by this server "
                f"(supported: {CLEAR_THINKING})",
                param=f"{where}.type",
            )
        keep = edit.get("keep", {"type": "thinking_turns", "value": 1})  # Anthropic's default
        clear = ClearThinking(_keep(keep, f"{where}.keep"))
    return clear


def applied_edits(cleared_turns: int | None) -> dict[str, Any]:
    """The response's ``context_management``: the clear_thinking edit, when one was asked.
    ``cleared_input_tokens`` is 0: the dropped text is never tokenized on its own."""
    if cleared_turns is None:
        return {}
    edit = {"type": CLEAR_THINKING, "cleared_thinking_turns": cleared_turns}
    return {"applied_edits": [{**edit, "cleared_input_tokens": 0}]}


def thinking_turns(messages: list[Any]) -> list[int]:
    """The indices of assistant messages holding thinking blocks, in order."""
    return [i for i, msg in enumerate(messages) if _has_thinking(msg)]


def signature(thinking: str) -> str:
    """The ``signature`` of a thinking block mlxd wrote: a digest of its text. Replayed
    blocks are accepted whatever their signature (a local model has nothing to protect)."""
    return "mlxd-" + hashlib.sha256(thinking.encode()).hexdigest()[:40]


# Internal helpers


def _keep(value: Any, where: str) -> int | None:
    if value == "all":
        return None
    ok = isinstance(value, dict) and value.get("type") == "thinking_turns"
    count = value.get("value") if isinstance(value, dict) else None
    if not ok or type(count) is not int or count < 1:
        raise InvalidRequest(
            f"'{where}' must be 'all' or {{'type': 'thinking_turns', 'value': N >= 1}}",
            param=where,
        )
    return count


def _has_thinking(msg: Any) -> bool:
    if not isinstance(msg, dict) or msg.get("role") != "assistant":
        return False
    content = msg.get("content")
    if not isinstance(content, list):
        return False
    return any(isinstance(b, dict) and b.get("type") in THINKING_BLOCKS for b in content)
