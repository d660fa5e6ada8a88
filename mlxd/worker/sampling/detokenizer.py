"""Incremental output text for one request: streaming detokenization plus stop strings.

Text is released only when it is final: never half of a multi-byte character (mlx-lm's streaming
detokenizers hold those back) and never the beginning of what may turn out to be a stop string.
"""

from __future__ import annotations

from typing import Any


class OutputText:
    """Feeds generated token ids in, hands out the text that is safe to send."""

    def __init__(self, detokenizer: Any, stop: list[str]) -> None:
        self._detok = detokenizer
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._sent = 0
        self.stopped = False
        self.matched_stop: str | None = None  # the stop string that ended the output

    def add(self, token_id: int) -> str:
        """Add one token; return the newly final text (may be empty)."""
        self._detok.add_token(token_id)
        return self._release(final=False)

    def finish(self) -> str:
        """The request ended: flush whatever is left (up to a stop string, if one matched)."""
        if not self.stopped:
            self._detok.finalize()
        return self._release(final=True)

    # Internal helpers

    def _release(self, final: bool) -> str:
        text: str = self._detok.text
        if self.stopped:
            return ""
        cut = self._find_stop(text)
        if cut is not None:
            self.stopped = True
            self.matched_stop = next(s for s in self._stop if text.startswith(s, cut))
            out = text[self._sent : cut]
            self._sent = max(self._sent, cut)
            return out
        end = len(text) if final else max(self._sent, len(text) - self._hold)
        out = text[self._sent : end]
        self._sent = end
        return out

    def _find_stop(self, text: str) -> int | None:
        if not self._stop:
            return None
        start = max(0, self._sent - self._hold)
        hits = [i for s in self._stop if (i := text.find(s, start)) >= 0]
        return min(hits) if hits else None
