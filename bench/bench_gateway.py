#!/usr/bin/env python
"""The gateway alone: what each streamed token costs it, with no model in the way.

A lockstep synthetic worker (its own process, the real protocol over a real ZMQ socket) sends
every running request one token per step of STEP_MS, one ``Events`` message per step, as a
worker decoding a batch does. The real gateway serves it under uvicorn in a second process, and
``mlxd bench run``'s client drives STREAMS streams in this one. Per round it prints the
gateway's and the client's CPU per token and the tok/s and inter-token gaps the client saw,
against what the worker sent.

    .venv/bin/python bench/bench_gateway.py [STREAMS] [TOKENS] [STEP_MS] [ROUNDS] [ENDPOINT]
                                              [CLIENT_PROCS]
    .venv/bin/python bench/bench_gateway.py 64 256 10 3 chat 1

The last line is JSON. A gateway that keeps up delivers the worker's rate (STREAMS x 1000 /
STEP_MS tok/s) with inter-token p50 = STEP_MS; one that falls behind shows it in both.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import resource
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from soak import free_port, wait_healthy  # noqa: E402  (bench/ is on the path of a script run)

from mlxd.bench.clients import ClientPool  # noqa: E402
from mlxd.bench.http import Target  # noqa: E402
from mlxd.bench.stats import summarize  # noqa: E402
from mlxd.bench.workload import Request, Session  # noqa: E402

MODEL = "bench"


def main() -> int:
    args = sys.argv[1:] + ["64", "256", "10", "3", "chat", "1"][len(sys.argv[1:]) :]
    streams, tokens, step_ms, rounds = (int(a) for a in args[:4])
    endpoint, procs = args[4], int(args[5])
    ipc = f"ipc://{tempfile.mkdtemp(prefix='mlxd-gw-')}/worker.sock"
    port = free_port()
    ctx = mp.get_context("spawn")
    worker = ctx.Process(target=lockstep_worker, args=(ipc, step_ms / 1000), daemon=True)
    ours, theirs = ctx.Pipe()
    gateway = ctx.Process(target=serve_gateway, args=(ipc, port, theirs), daemon=True)
    _pin(gateway=False)  # the worker and this client share what the gateway does not use
    worker.start()
    gateway.start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped early: still stop both
    target = Target(base_url=f"http://127.0.0.1:{port}", endpoint=endpoint)
    try:
        wait_healthy(target.base_url, timeout_s=30, name="the gateway")
        with ClientPool(procs) as clients:
            _level(clients, target, streams, 16, ours)  # warm-up: connections, first calls
            results = [_level(clients, target, streams, tokens, ours) for _ in range(rounds)]
    finally:
        gateway.terminate()
        worker.terminate()
    sent = streams * 1000 / step_ms
    print(f"worker sends {sent:.0f} tok/s ({streams} streams, one token each per {step_ms} ms)")
    print(
        "round  tok/s  ttft p50  ttft p99  itl p50  itl p99  gateway us/tok  gateway cpu  "
        "client us/tok"
    )
    for i, r in enumerate(results, 1):
        print(
            f"{i:5}  {r['tok_s']:5.0f}  {r['ttft_p50_ms']:8.1f}  {r['ttft_p99_ms']:8.1f}  "
            f"{r['itl_p50_ms']:7.1f}  {r['itl_p99_ms']:7.1f}  "
            f"{r['gateway_us_per_token']:14.1f}  {r['gateway_cpu_share']:10.0%}  "
            f"{r['client_us_per_token']:13.1f}"
        )
    print(
        json.dumps(
            {
                "streams": streams,
                "tokens": tokens,
                "step_ms": step_ms,
                "endpoint": endpoint,
                "client_procs": procs,
                "worker_tok_s": sent,
                "rounds": results,
            }
        )
    )
    return 0


def _level(
    clients: ClientPool, target: Target, streams: int, tokens: int, gateway_cpu: Any
) -> dict[str, float]:
    sessions = [
        Session(turns=[Request(user="hi", max_tokens=tokens, model=MODEL)]) for _ in range(streams)
    ]
    gateway_cpu.send("cpu")
    g0, c0, t0 = gateway_cpu.recv(), _cpu(), time.perf_counter()
    timings = clients.run(target, streams, sessions)
    wall = time.perf_counter() - t0
    gateway_cpu.send("cpu")
    g1, c1 = gateway_cpu.recv(), _cpu()
    row = summarize(streams, timings)
    n = sum(t.output_tokens for t in timings)
    errors = [t.error for t in timings if t.error]
    if errors:
        raise SystemExit(f"{len(errors)} requests failed, e.g. {errors[0]}")
    return {
        "tok_s": round(float(row["output_tok_s"]), 1),
        "itl_p50_ms": round(float(row["itl_p50_ms"]), 2),
        "itl_p99_ms": round(float(row["itl_p99_ms"]), 2),
        "ttft_p50_ms": round(float(row["ttft_p50_ms"]), 2),
        "ttft_p99_ms": round(float(row["ttft_p99_ms"]), 2),
        "gateway_us_per_token": round((g1 - g0) / n * 1e6, 1),
        "gateway_cpu_share": round((g1 - g0) / wall, 3),
        # this process's CPU: the client's only when it runs here (CLIENT_PROCS 1)
        "client_us_per_token": round((c1 - c0) / n * 1e6, 1) if clients.procs == 1 else 0.0,
    }


def lockstep_worker(endpoint: str, step_s: float) -> None:
    """Every ``step_s``: one token for each running request, all in one message per client."""
    import zmq

    from mlxd.protocol import codec
    from mlxd.protocol.messages import (
        Cancel,
        Events,
        Finished,
        Generate,
        Ping,
        Pong,
        TokenDelta,
        Usage,
    )

    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind(endpoint)
    running: dict[str, list[Any]] = {}  # request id -> [client, tokens sent, max_tokens]
    due = time.monotonic()
    while True:
        while sock.poll(max(0.0, due - time.monotonic()) * 1000 if running else 50):
            client, *frames = sock.recv_multipart()
            msg = codec.decode(frames)
            if isinstance(msg, Ping):
                pong = Pong(request_id=msg.request_id, model=MODEL, max_context=4096)
                sock.send_multipart([client, *codec.encode(pong)])
            elif isinstance(msg, Generate):
                running[msg.request_id] = [client, 0, msg.sampling.max_tokens or 16]
            elif isinstance(msg, Cancel):
                running.pop(msg.request_id, None)
        if not running:
            due = time.monotonic()
            continue
        due += step_s
        out: dict[bytes, list[Any]] = {}
        for rid, state in list(running.items()):
            state[1] += 1
            first = Usage(prompt_tokens=1, completion_tokens=0) if state[1] == 1 else None
            events = out.setdefault(state[0], [])
            events.append(TokenDelta(request_id=rid, text=" tok", token_ids=[7], prompt=first))
            if state[1] == state[2]:
                usage = Usage(prompt_tokens=1, completion_tokens=state[1])
                events.append(Finished(request_id=rid, finish_reason="length", usage=usage))
                del running[rid]
        for client, events in out.items():
            sock.send_multipart([client, *codec.encode(Events(events=events))])


def serve_gateway(endpoint: str, port: int, cpu: Any) -> None:
    """The real gateway app under uvicorn (as ``mlxd start`` runs it), on a static worker;
    answers ``cpu`` on the pipe with its process's CPU seconds."""
    import uvicorn

    from mlxd.config import ModelSpec, ServeConfig
    from mlxd.gateway.app import build_app
    from mlxd.gateway.backends.local.pool import StaticPool

    def answer() -> None:
        with contextlib.suppress(EOFError):  # the bench ended
            while cpu.recv():
                cpu.send(time.process_time())

    threading.Thread(target=answer, daemon=True).start()
    _pin(gateway=True)
    config = ServeConfig(models=(ModelSpec(name=MODEL, path="synthetic"),), port=port)
    app = build_app(config, StaticPool({MODEL: endpoint}))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _pin(gateway: bool) -> None:
    """Linux: the gateway gets the last CPU to itself, so what it costs is measured alone."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) >= 2:
        os.sched_setaffinity(0, cpus[-1:] if gateway else cpus[:-1])


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


if __name__ == "__main__":
    raise SystemExit(main())
