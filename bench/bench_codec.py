"""What one decode step's message costs on the wire: encoding (the worker) and decoding (the
gateway) of ``Events`` holding one ``TokenDelta`` per stream.

    python bench/bench_codec.py [STREAMS=64] [REPEATS=2000]

Prints one JSON line: microseconds per message, medians of 5 rounds.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from mlxd.protocol import codec
from mlxd.protocol.messages import Events, TokenDelta


def per_call_us(fn: object, repeats: int) -> float:
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()  # type: ignore[operator]
        rounds.append((time.perf_counter() - t0) / repeats * 1e6)
    return round(statistics.median(rounds), 1)


def main() -> None:
    streams = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    msg = Events(
        events=[
            TokenDelta(request_id=f"cmpl-{i:032x}", text=" word", token_ids=[1234])
            for i in range(streams)
        ]
    )
    frames = codec.encode(msg)
    assert codec.decode(frames) == msg
    encode_us = per_call_us(lambda: codec.encode(msg), repeats)
    decode_us = per_call_us(lambda: codec.decode(frames), repeats)
    print(
        json.dumps(
            {
                "streams": streams,
                "bytes": sum(len(f) for f in frames),
                "encode_us": encode_us,
                "decode_us": decode_us,
            }
        )
    )


if __name__ == "__main__":
    main()
