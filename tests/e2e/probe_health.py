"""Poll ``GET /health`` every 20 ms until stdin closes; print the latencies (ms) as JSON.

Run as a separate process by the load test, so the load generator's own event loop cannot
delay the measurement.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

INTERVAL_S = 0.02


def probe(host: str, port: int) -> float:
    started = time.perf_counter()
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:100]
    return (time.perf_counter() - started) * 1000


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    latencies = []
    while not stop.is_set():
        latencies.append(probe(host, port))
        time.sleep(INTERVAL_S)
    print(json.dumps(latencies))


if __name__ == "__main__":
    main()
