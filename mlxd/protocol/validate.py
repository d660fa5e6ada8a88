"""Range checks on sampling parameters, shared by the gateway and the worker.

The worker checks again because anything may connect to its socket, not only our gateway.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from mlxd.errors import InvalidRequest
from mlxd.knobs import PRIORITIES
from mlxd.protocol.messages import SamplingParams

MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_STOP = 16  # stop strings per request, on every API
MAX_INT = 2**31 - 1  # the largest count or token id a request may send
MAX_SEED = 2**63 - 1  # seeds are signed 64-bit


class Bounds(NamedTuple):
    """A float parameter's range; ``low_open`` leaves ``low`` itself out."""

    low: float
    high: float = math.inf
    low_open: bool = False

    def contains(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    @property
    def words(self) -> str:
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"


# One range per float parameter: the gateway parses with these
# (gateway/surfaces/openai/schemas.py), the worker checks them again, so both give the same
# rule (OpenAI's where it has one).
SAMPLING_BOUNDS = {
    "temperature": Bounds(0.0, 2.0),
    "top_p": Bounds(0.0, 1.0, low_open=True),
    "min_p": Bounds(0.0, 1.0),
    "repetition_penalty": Bounds(0.0, low_open=True),
    "presence_penalty": Bounds(-2.0, 2.0),
    "frequency_penalty": Bounds(-2.0, 2.0),
}


def check_sampling(p: SamplingParams) -> None:
    """Raise ``InvalidRequest`` naming the first out-of-range parameter."""
    checks: list[tuple[bool, str, str]] = [
        (p.max_tokens is None or p.max_tokens >= 1, "max_tokens", "must be >= 1"),
        *(
            (b.contains(getattr(p, name)), name, f"must be {b.words}")
            for name, b in SAMPLING_BOUNDS.items()
        ),
        (p.top_k >= 0, "top_k", "must be >= 0"),
        (
            all(-100.0 <= b <= 100.0 for b in p.logit_bias.values()),
            "logit_bias",
            "values must be in [-100, 100]",
        ),
        (p.min_tokens >= 0, "min_tokens", "must be >= 0"),
        (
            p.thinking_budget is None or p.thinking_budget >= 0,
            "thinking_budget",
            "must be >= 0",
        ),
        (all(t >= 0 for t in p.stop_token_ids), "stop_token_ids", "must be >= 0"),
        (
            0 <= p.top_logprobs <= MAX_TOP_LOGPROBS,
            "top_logprobs",
            f"must be in [0, {MAX_TOP_LOGPROBS}]",
        ),
        (p.logprobs or not p.top_logprobs, "top_logprobs", "needs logprobs"),
        # The grammar decides where the output ends; forbidding EOS would leave no valid token.
        (
            p.response_format is None or not p.ignore_eos,
            "ignore_eos",
            "cannot be used with response_format",
        ),
        (
            p.response_format is None or not p.min_tokens,
            "min_tokens",
            "cannot be used with response_format",
        ),
    ]
    for ok, param, rule in checks:
        if not ok:
            raise InvalidRequest(f"{param} {rule}", param=param)


def check_priority(priority: str) -> None:
    if priority not in PRIORITIES:
        raise InvalidRequest(f"priority must be one of {', '.join(PRIORITIES)}", param="priority")
