"""One range per sampling parameter (issue #25 point 5): the gateway's parse and the worker's
check (protocol/validate.py) refuse the same values with the same rule."""

from __future__ import annotations

import dataclasses

import pytest

from mlxd.errors import InvalidRequest
from mlxd.gateway.surfaces.openai import schemas
from mlxd.protocol.messages import SamplingParams
from mlxd.protocol.validate import SAMPLING_BOUNDS, check_sampling

OUTSIDE = [
    (name, value)
    for name, b in SAMPLING_BOUNDS.items()
    for value in (b.low if b.low_open else b.low - 0.5, b.high + 0.5)
    if value != float("inf")
]


@pytest.mark.parametrize("name, value", OUTSIDE)
def test_gateway_and_worker_refuse_the_same_values(name: str, value: float) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], name: value}
    with pytest.raises(InvalidRequest) as gateway:
        schemas.parse_chat(body)
    with pytest.raises(InvalidRequest) as worker:
        check_sampling(dataclasses.replace(SamplingParams(), **{name: value}))
    assert gateway.value.param == worker.value.param == name
    assert SAMPLING_BOUNDS[name].words in gateway.value.message
    assert SAMPLING_BOUNDS[name].words in worker.value.message
