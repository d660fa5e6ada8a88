"""Per-backend figures for ``/metrics``: requests, errors, upstream latency, failovers, in flight.

Registered in the gateway's own registry (``Metrics.registry``), beside the per-model request
metrics that remote models get like local ones. Labels are backend and model names from the
config and our error codes, never client strings, and never a key.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from mlxd.gateway.metrics import E2E_BUCKETS, Metrics


class BackendMetrics:
    """The ``mlxd_backend_*`` families.

    Args:
        metrics: the gateway's metrics, whose registry these join.
    """

    def __init__(self, metrics: Metrics) -> None:
        reg = metrics.registry
        self.requests = Counter("mlxd_backend_requests", "Requests sent to a backend, by outcome "
                                "(ok or an error code).", ["backend", "model", "outcome"],
                                registry=reg)  # fmt: skip
        self.latency = Histogram("mlxd_backend_request_seconds", "Request sent to a backend "
                                 "until its answer ended.", ["backend"], buckets=E2E_BUCKETS,
                                 registry=reg)  # fmt: skip
        self.failovers = Counter("mlxd_backend_failovers", "Requests moved from a failed model "
                                 "to its fallback.", ["from_model", "to_model"],
                                 registry=reg)  # fmt: skip
        self.in_flight = Gauge("mlxd_backend_requests_in_flight", "Requests sent to a backend, "
                               "not done.", ["backend"], registry=reg)  # fmt: skip

    def done(self, backend: str, model: str, outcome: str, seconds: float | None = None) -> None:
        """Count one request to ``backend`` that ended with ``outcome`` (``ok`` or a code)."""
        self.requests.labels(backend, model, outcome).inc()
        if seconds is not None:
            self.latency.labels(backend).observe(seconds)

    def failover(self, from_model: str, to_model: str) -> None:
        """Count one request moved from ``from_model`` to ``to_model``."""
        self.failovers.labels(from_model, to_model).inc()
