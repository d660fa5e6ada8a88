"""The worker over ZeroMQ alone (no HTTP, no gateway): isolates the gateway's share of the cost.

    python bench/bench_zmq.py ENDPOINT CONCURRENCY [MAX_TOKENS] [PROMPT_TOKENS]
Start a worker first: python -m mlxd worker serve --model DIR --bind ipc:///tmp/bench.sock
"""

from __future__ import annotations

import json
import sys
import time

import zmq

from mlxd.bench.stats import RequestTiming, summarize
from mlxd.bench.workload import make_prompts
from mlxd.protocol import codec
from mlxd.protocol.messages import (
    Events,
    Finished,
    Generate,
    Ping,
    SamplingParams,
    TokenDelta,
    TokenPrompt,
)


def run(sock: zmq.Socket, level: int, max_tokens: int, prompt_tokens: int) -> dict:  # type: ignore[type-arg]
    prompts = make_prompts(level, prompt_tokens, seed=level)
    timings: dict[str, RequestTiming] = {}
    t0 = time.perf_counter()
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        rid = f"{t0}-{i}"
        timings[rid] = RequestTiming(start=time.perf_counter() - t0)
        sock.send_multipart(
            codec.encode(
                Generate(request_id=rid, prompt=TokenPrompt(token_ids=p), sampling=sampling)
            )
        )
    done = 0
    while done < level:
        msg = codec.decode(sock.recv_multipart())
        now = time.perf_counter() - t0
        for e in msg.events if isinstance(msg, Events) else [msg]:
            t = timings[e.request_id]
            if isinstance(e, TokenDelta):
                t.first_token = t.first_token if t.first_token is not None else now
                t.token_times.append(now)
                t.output_tokens += len(e.token_ids)
            else:
                t.end, done = now, done + 1
                if not isinstance(e, Finished):
                    t.error = str(e)
    return summarize(level, list(timings.values()))


def main() -> None:
    endpoint, level = sys.argv[1], int(sys.argv[2])
    max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    prompt_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 128
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send_multipart(codec.encode(Ping(request_id="p")))
    sock.recv_multipart()
    run(sock, level, 16, prompt_tokens)  # warm-up at the same shape
    print(json.dumps(run(sock, level, max_tokens, prompt_tokens)))


if __name__ == "__main__":
    main()
