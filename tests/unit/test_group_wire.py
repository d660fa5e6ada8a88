"""What a worker group's rank 0 broadcasts each loop turn (worker/group.py), without MLX."""

from __future__ import annotations

from mlxd.errors import ProtocolError
from mlxd.protocol.messages import Generate, GetStatus, SamplingParams, TextPrompt
from mlxd.worker.group import _pack, _seeded, _unpack


def generate(seed: int | None) -> Generate:
    return Generate(
        request_id="r1",
        prompt=TextPrompt(text="hi"),
        sampling=SamplingParams(max_tokens=4, seed=seed),
    )


def test_messages_clock_and_stop_round_trip() -> None:
    data = [(b"client", generate(7))]
    ctl = [(b"admin", GetStatus(request_id="c1"))]
    now, got_data, got_ctl, stop = _unpack(_pack(12.5, data, ctl, True))
    assert (now, got_data, got_ctl, stop) == (12.5, data, ctl, True)


def test_frames_rank_0_could_not_decode_are_not_sent() -> None:
    bad = (b"client", ProtocolError("bad frame"))
    _, data, _, _ = _unpack(_pack(0.0, [bad, (b"c", generate(1))], [], False))
    assert [m.request_id for _, m in data] == ["r1"]  # type: ignore[union-attr]


def test_an_unseeded_request_gets_one_seed_for_every_rank() -> None:
    _, msg = _seeded((b"c", generate(None)))
    assert isinstance(msg, Generate) and msg.sampling.seed is not None
    assert _seeded((b"c", generate(5)))[1] == generate(5)  # a seed given is kept
