"""Per-backend figures for ``/metrics``: requests, errors, upstream latency, failovers, in flight,
waiting for a slot, the circuit breaker's state.

Registered in the gateway's own registry (``Metrics.registry``), beside the per-model request
metrics that remote models get like local ones. Labels are backend and model names from the
config and our error codes, never client strings, and never a key.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from prometheus_client import Counter, Gauge, Histogram

from mlxd.gateway.backends.remote.breaker import STATES
from mlxd.gateway.backends.remote.upstream import RemoteBackend
from mlxd.gateway.ops.metrics import E2E_BUCKETS, Metrics


class BackendMetrics:
    """The ``mlxd_backend_*`` families.

    Args:
        metrics: the gateway's metrics, whose registry these join.
    """

    def __init__(self, metrics: Metrics) -> None:
        reg = metrics.registry
        self.requests = Counter(
            "mlxd_backend_requests",
            "Requests sent to a backend, by outcome (ok or an error code).",
            ["backend", "model", "outcome"],
            registry=reg,
        )
        self.latency = Histogram(
            "mlxd_backend_request_seconds",
            "Request sent to a backend until its answer ended.",
            ["backend"],
            buckets=E2E_BUCKETS,
            registry=reg,
        )
        self.failovers = Counter(
            "mlxd_backend_failovers",
            "Requests moved from a failed model to its fallback.",
            ["from_model", "to_model"],
            registry=reg,
        )
        self.in_flight = Gauge(
            "mlxd_backend_requests_in_flight",
            "Requests sent to a backend, not done.",
            ["backend"],
            registry=reg,
        )
        self.waiting = Gauge(
            "mlxd_backend_requests_waiting",
            "Requests waiting for one of a backend's max_concurrency slots.",
            ["backend"],
            registry=reg,
        )
        self.breaker = Gauge(
            "mlxd_backend_breaker_state",
            "A backend's circuit breaker: 0 closed, 1 half-open (a probe may go), 2 open.",
            ["backend"],
            registry=reg,
        )

    def watch(self, backends: Iterable[RemoteBackend]) -> None:
        """Read each backend's queue and breaker whenever ``/metrics`` is scraped."""
        for b in backends:
            self.waiting.labels(b.name).set_function(partial(_waiting, b))
            self.breaker.labels(b.name).set_function(partial(_breaker_state, b))

    def done(self, backend: str, model: str, outcome: str, seconds: float | None = None) -> None:
        """Count one request to ``backend`` that ended with ``outcome`` (``ok`` or a code)."""
        self.requests.labels(backend, model, outcome).inc()
        if seconds is not None:
            self.latency.labels(backend).observe(seconds)

    def failover(self, from_model: str, to_model: str) -> None:
        """Count one request moved from ``from_model`` to ``to_model``."""
        self.failovers.labels(from_model, to_model).inc()


def _waiting(backend: RemoteBackend) -> float:
    return backend.waiting


def _breaker_state(backend: RemoteBackend) -> float:
    return STATES.index(backend.breaker.current)
