"""Prometheus metrics of the gateway, served at ``GET /metrics`` in the text exposition format.

Each app has its own ``CollectorRegistry``, so several apps (tests) never collide. Request
metrics are updated on the event loop: once when a model is known (in flight), once per stream
event (time to first token, inter-token latency) and once when the response is done (counters,
end-to-end latency). Values that live elsewhere are read at scrape time from *sources*: the
pool's worker restarts today, and the workers' own numbers (queue depth, running sequences, KV
blocks, prefix hits, preemptions) once the control plane reports them; see ``add_source``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from mlxd.gateway.backends.local.pool import WorkerPool
from mlxd.gateway.backends.local.workers import StreamObserver
from mlxd.gateway.http.accesslog import RequestRecord
from mlxd.protocol.messages import Finished, TokenDelta

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.5,
)
E2E_BUCKETS = (
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    900.0,
)

# A source is called at each scrape and yields finished metric families (e.g. GaugeMetricFamily).
MetricSource = Callable[[], Iterable[Metric]]


class Metrics:
    """The gateway's metrics in a registry of its own.

    Args:
        pool: read at scrape time for ``mlxd_worker_restarts_total`` and ``mlxd_model_failed``;
            ``None`` leaves them out.
    """

    def __init__(self, pool: WorkerPool | None = None) -> None:
        self.registry = CollectorRegistry()
        reg, model = self.registry, ["model"]
        self.requests = Counter(
            "mlxd_requests",
            "HTTP requests by model, endpoint and status.",
            ["model", "endpoint", "status"],
            registry=reg,
        )
        self.prompt_tokens = Counter(
            "mlxd_prompt_tokens", "Prompt tokens of finished requests.", model, registry=reg
        )
        self.completion_tokens = Counter(
            "mlxd_completion_tokens", "Completion tokens of finished requests.", model, registry=reg
        )
        self.cached_tokens = Counter(
            "mlxd_cached_tokens", "Prompt tokens served from the prefix cache.", model, registry=reg
        )
        self.ttft = Histogram(
            "mlxd_time_to_first_token_seconds",
            "Request start to first token.",
            model,
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            "mlxd_inter_token_latency_seconds",
            "Time between stream events.",
            model,
            buckets=ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "mlxd_e2e_request_latency_seconds",
            "Request start to response end.",
            model,
            buckets=E2E_BUCKETS,
            registry=reg,
        )
        self.in_flight = Gauge(
            "mlxd_requests_in_flight", "Requests sent to a worker, not done.", model, registry=reg
        )
        self._sources: list[MetricSource] = []
        self.registry.register(_Sources(self._sources))
        if pool is not None:
            self.add_source(lambda: _pool_metrics(pool))

    def add_source(self, source: MetricSource) -> None:
        """Add metric families computed at scrape time.

        The hook for worker-side metrics: ``source`` runs on the event loop during each scrape,
        so it must not block; return the latest values the control plane cached, e.g.
        ``GaugeMetricFamily("mlxd_queue_depth", "...", labels=["model"])``.
        """
        self._sources.append(source)

    def track(self, record: RequestRecord) -> StreamObserver:
        """Count ``record`` in flight for its model; the observer times each stream event.

        Called once the model is known; ``finish`` takes it out of flight again.
        """
        self.in_flight.labels(record.model).inc()
        record.in_flight = True
        return _observer(record, self.ttft.labels(record.model), self.itl.labels(record.model))

    def untrack(self, record: RequestRecord) -> None:
        """Take ``record`` out of flight before it moves to another model (failover)."""
        if record.in_flight:
            self.in_flight.labels(record.model).dec()
            record.in_flight = False

    def finish(self, record: RequestRecord) -> None:
        """Count a request whose response is done (``AccessLog`` calls it)."""
        model = record.model
        self.requests.labels(model, record.endpoint, str(record.status)).inc()
        if not model:
            return
        if record.in_flight:
            self.in_flight.labels(model).dec()
        prompt_tokens, completion_tokens, cached_tokens = record.tokens()
        self.prompt_tokens.labels(model).inc(prompt_tokens)
        self.completion_tokens.labels(model).inc(completion_tokens)
        self.cached_tokens.labels(model).inc(cached_tokens)
        if record.usage is not None:
            self.e2e.labels(model).observe(record.end - record.start)

    async def endpoint(self, request: Request) -> Response:
        """``GET /metrics``: the Prometheus text exposition (guarded by the auth middleware)."""
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


def _observer(record: RequestRecord, ttft: Histogram, itl: Histogram) -> StreamObserver:
    # Runs per stream event on the hot path: one clock read, one histogram observation.
    def observe(event: TokenDelta | Finished) -> None:
        now = time.perf_counter()
        if isinstance(event, TokenDelta):
            record.completion_seen += len(event.token_ids)
            if record.first_token_at is None:
                record.first_token_at = now
                ttft.observe(now - record.start)
            else:
                itl.observe(now - record.last_token_at)
            record.last_token_at = now
            return
        record.usage, record.finish_reason = event.usage, event.finish_reason
        record.done_at = now
        if record.first_token_at is None and event.usage.completion_tokens:
            record.first_token_at = now  # all of the text came with Finished
            ttft.observe(now - record.start)

    return observe


def _pool_metrics(pool: WorkerPool) -> Iterator[Metric]:
    family = CounterMetricFamily(
        "mlxd_worker_restarts", "Times a model's worker was restarted.", labels=["model"]
    )
    failed = GaugeMetricFamily(
        "mlxd_model_failed",
        "1 while a model is failed (not restarted; /health is degraded).",
        labels=["model"],
    )
    ready = GaugeMetricFamily(
        "mlxd_replica_ready",
        "1 while a replica of a model served by several workers is ready.",
        labels=["model", "replica"],
    )
    routed = CounterMetricFamily(
        "mlxd_replica_routed", "Requests routed to each replica.", labels=["model", "replica"]
    )
    for name in pool.names():
        info = pool.info(name)
        family.add_metric([name], pool.restarts(name))
        failed.add_metric([name], float(info.state == "failed"))
        for r in info.replica_rows:
            ready.add_metric([name, str(r.index)], float(r.state == "ready"))
            routed.add_metric([name, str(r.index)], r.routed)
    yield family
    yield failed
    yield ready
    yield routed


class _Sources(Collector):
    """A collector over the ``add_source`` callables."""

    def __init__(self, sources: list[MetricSource]) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        for source in self._sources:
            yield from source()
