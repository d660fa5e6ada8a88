"""Range checks on sampling parameters, shared by the gateway and the worker.

The worker checks again because anything may connect to its socket, not only our gateway.
"""

from __future__ import annotations

from mlxd.errors import InvalidRequest
from mlxd.protocol.messages import PRIORITIES, SamplingParams

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


def check_sampling(p: SamplingParams) -> None:
    """Raise ``InvalidRequest`` naming the first out-of-range parameter."""
    checks: list[tuple[bool, str, str]] = [
        (p.max_tokens is None or p.max_tokens >= 1, "max_tokens", "must be >= 1"),
        (p.temperature >= 0.0, "temperature", "must be >= 0"),
        (0.0 < p.top_p <= 1.0, "top_p", "must be in (0, 1]"),
        (p.top_k >= 0, "top_k", "must be >= 0"),
        (0.0 <= p.min_p <= 1.0, "min_p", "must be in [0, 1]"),
        (p.repetition_penalty > 0.0, "repetition_penalty", "must be > 0"),
        (-2.0 <= p.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]"),
        (-2.0 <= p.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]"),
        (
            all(-100.0 <= b <= 100.0 for b in p.logit_bias.values()),
            "logit_bias",
            "values must be in [-100, 100]",
        ),  # fmt: skip
        (p.min_tokens >= 0, "min_tokens", "must be >= 0"),
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
