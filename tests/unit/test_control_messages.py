"""Control-plane messages: codec round trips, malformed frames, the control endpoint rule."""

from __future__ import annotations

import msgpack
import pytest

from mlxd.errors import ProtocolError
from mlxd.protocol import codec
from mlxd.protocol.channel import control_endpoint
from mlxd.protocol.messages import (
    PROTOCOL_VERSION,
    Ack,
    ComputeInfo,
    Drain,
    Error,
    FlushCache,
    GetStats,
    GetStatus,
    LatencySummary,
    MemoryUsage,
    Pause,
    Resume,
    SchedulerSettings,
    SetConfig,
    Shutdown,
    StatsReply,
    StatusReply,
)

MEMORY = MemoryUsage(weights_bytes=10, kv_bytes=2, active_bytes=12, peak_bytes=20, cache_bytes=0)
SETTINGS = SchedulerSettings(
    max_num_seqs=8, max_queued=16, prefill_chunk=512, stream_interval=1, aging_s=10.0
)
LATENCY = LatencySummary(num_samples=3, p50_ms=1.5, p95_ms=2.0, p99_ms=2.5)

MESSAGES = [
    GetStatus(request_id="c1"),
    GetStats(request_id="c2"),
    Drain(request_id="c3"),
    Pause(request_id="c4"),
    Resume(request_id="c5"),
    FlushCache(request_id="c6"),
    Shutdown(request_id="c7"),
    SetConfig(request_id="c8"),
    SetConfig(
        request_id="c9",
        max_num_seqs=4,
        max_queued=0,
        prefill_chunk=64,
        stream_interval=2,
        aging_s=2.5,
    ),
    Ack(request_id="c3", state="draining", message="2 request(s) left"),
    Error(request_id="c8", code="invalid_request", message="bad", param="max_num_seqs"),
    StatusReply(
        request_id="c1",
        model="m",
        model_path="/m",
        state="running",
        pid=42,
        uptime_s=1.25,
        max_context=4096,
        num_running=1,
        num_waiting=2,
        num_prefilling=0,
        memory=MEMORY,
        scheduler=SETTINGS,
    ),
    StatusReply(
        request_id="c1",
        model="m",
        model_path="/m",
        state="running",
        pid=42,
        uptime_s=1.25,
        max_context=4096,
        num_running=1,
        num_waiting=2,
        num_prefilling=0,
        memory=MEMORY,
        scheduler=SETTINGS,
        kv_cache="contiguous",
        compute=ComputeInfo(
            device="cpu",
            blas="/usr/lib/libopenblas.so.0",
            dtype="float32",
            file_dtype="float16",
            gemm_gflops=83.4,
            gemm_size=256,
        ),
    ),
    StatsReply(
        request_id="c2",
        uptime_s=3.0,
        requests_admitted=5,
        requests_finished=3,
        requests_cancelled=1,
        requests_errored=0,
        requests_rejected=1,
        prompt_tokens=50,
        output_tokens=70,
        output_tps_recent=12.5,
        output_tps_total=7.0,
        ttft=LATENCY,
        itl=LATENCY,
        preemptions=0,
        prefix_cache_hits=2,
        prefix_cache_hit_tokens=32,
    ),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: object) -> None:
    assert codec.decode(codec.encode(msg)) == msg  # type: ignore[arg-type]


def _body(obj: object) -> list[bytes]:
    return [PROTOCOL_VERSION, msgpack.packb(obj)]


def _status(**changes: object) -> dict[str, object]:
    wire = codec.to_wire(MESSAGES[11])
    return {**wire, **changes}


@pytest.mark.parametrize(
    "frames, needle",
    [
        (_body({"type": "drain"}), "missing field"),
        (_body({"type": "pause", "request_id": "x", "now": True}), "unknown field"),
        (_body({"type": "set_config", "request_id": "x", "max_num_seqs": True}), "expected int"),
        (_body({"type": "set_config", "request_id": "x", "max_num_seqs": "8"}), "expected int"),
        (_body({"type": "set_config", "request_id": "x", "aging_s": "slow"}), "expected float"),
        (_body({"type": "set_config", "request_id": "x", "max_queued": 1.5}), "expected int"),
        (_body({"type": "set_config", "request_id": "x", "temperature": 1}), "unknown field"),
        (_body({"type": "restart_everything", "request_id": "x"}), "unknown message type"),
        (_body(_status(memory=[1, 2])), "expected a map"),
        (_body(_status(memory={"weights_bytes": 1})), "missing field"),
        (_body(_status(scheduler=None)), "expected a map"),
        (_body({"type": "ack", "request_id": "x"}), "missing field"),
    ],
)
def test_rejects_malformed_control_frames(frames: list[bytes], needle: str) -> None:
    with pytest.raises(ProtocolError, match=needle):
        codec.decode(frames)


def test_set_config_accepts_an_int_for_aging() -> None:
    msg = codec.decode(_body({"type": "set_config", "request_id": "x", "aging_s": 3}))
    assert isinstance(msg, SetConfig) and msg.aging_s == 3.0 and msg.max_num_seqs is None


@pytest.mark.parametrize(
    "data, control",
    [
        ("ipc:///tmp/mlxd-x/w0.sock", "ipc:///tmp/mlxd-x/w0.ctl.sock"),
        ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"),
        ("inproc://worker", "inproc://worker.ctl"),
    ],
)
def test_control_endpoint_is_derived_from_the_data_endpoint(data: str, control: str) -> None:
    assert control_endpoint(data) == control
