"""A request's thinking budget: how many more tokens it may think before it must answer.

The worker follows each output token; once the budget is spent inside thinking, the sampler
forces the end marker (one token) as the next token, so the model goes on to its answer. The
runner reads every pending token first when a row is one token from its budget (``near``), so
the decision never lags the pipelined decode step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ThinkingBudget:
    """Thinking tokens left to one request, and whether its output is inside thinking now."""

    start_id: int
    end_id: int
    left: int
    inside: bool

    def follow(self, token: int) -> None:
        """Account for one output token."""
        if token == self.end_id:
            self.inside = False
        elif token == self.start_id:
            self.inside = True
        elif self.inside:
            self.left -= 1

    @property
    def due(self) -> bool:
        """The next token must be the end marker."""
        return self.inside and self.left <= 0

    @property
    def near(self) -> bool:
        """The next token read may make the end marker due."""
        return self.inside and self.left <= 1
