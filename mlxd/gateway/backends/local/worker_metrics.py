"""Worker-side figures for ``/metrics``: queue depth, running sequences, KV blocks, prefix cache,
preemptions, polled from each ready worker's control socket.

A scrape must not wait on workers (one may be busy or restarting), so a background task asks
every ``interval_s`` and ``/metrics`` shows the latest answers. The poller has its own control
connection per worker, so an admin command in flight never waits behind a poll. The workers'
counters start again from zero when a worker restarts; Prometheus' ``rate()`` handles that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mlxd.errors import MlxdError
from mlxd.gateway.backends.local.control import ControlClient
from mlxd.gateway.backends.local.pool import WorkerPool
from mlxd.protocol.messages import GetStats, GetStatus, StatsReply, StatusReply

log = logging.getLogger(__name__)

POLL_S = 2.0


@dataclass(frozen=True)
class _Snapshot:
    status: StatusReply
    stats: StatsReply


class WorkerMetrics:
    """Polls ``pool``'s ready workers; ``collect`` is a ``Metrics.add_source`` source."""

    def __init__(self, pool: WorkerPool, interval_s: float = POLL_S) -> None:
        self.pool = pool
        self.interval_s = interval_s
        self._latest: dict[str, _Snapshot] = {}
        self._clients: dict[str, ControlClient] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="mlxd-worker-metrics")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for client in self._clients.values():
            await client.close()

    def latest(self) -> dict[str, tuple[StatusReply, StatsReply]]:
        """Each ready worker's last answers (``GetStatus``, ``GetStats``), by model name; a worker
        that did not answer the last poll is absent."""
        return {name: (snap.status, snap.stats) for name, snap in self._latest.items()}

    async def poll_once(self) -> None:
        """Ask every ready worker now (the loop does this every ``interval_s``)."""
        names = [n for n in self.pool.names() if self.pool.info(n).state == "ready"]
        results = await asyncio.gather(*(self._ask(n) for n in names))
        self._latest = {n: r for n, r in zip(names, results, strict=True) if r is not None}

    def collect(self) -> Iterator[Metric]:
        latest = self._latest
        gauges: dict[str, tuple[str, Callable[[_Snapshot], float]]] = {
            "queue_depth": (
                "Requests waiting for a worker's batch.",
                lambda s: s.status.num_waiting,
            ),
            "running_sequences": (
                "Sequences in a worker's decode batch.",
                lambda s: s.status.num_running,
            ),
            "prefilling_sequences": (
                "Sequences whose prompt is being prefilled.",
                lambda s: s.status.num_prefilling,
            ),
        }
        for name, (doc, get) in gauges.items():
            family = GaugeMetricFamily(f"mlxd_{name}", doc, labels=["model"])
            for model, snap in latest.items():
                family.add_metric([model], get(snap))
            yield family
        blocks = GaugeMetricFamily(
            "mlxd_kv_blocks",
            "KV pool blocks by state (used includes cached blocks in use; paged cache only).",
            labels=["model", "state"],
        )
        for model, snap in latest.items():
            st = snap.stats
            if st.kv_block_size:
                for state in ("total", "used", "free", "cached"):
                    blocks.add_metric([model, state], getattr(st, f"kv_blocks_{state}"))
        yield blocks
        kv = GaugeMetricFamily(
            "mlxd_kv_bytes",
            "A worker's KV memory: used by requests in "
            "flight, reserved (held now; the paged pool grows in chunks and "
            "shrinks when idle), budget (the most it may hold; 0: no cap).",
            labels=["model", "state"],
        )
        for model, snap in latest.items():
            mem = snap.status.memory
            for state, value in (
                ("used", mem.kv_bytes),
                ("reserved", mem.kv_reserved_bytes),
                ("budget", mem.kv_budget_bytes),
            ):
                kv.add_metric([model, state], value)
        yield kv
        step = GaugeMetricFamily(
            "mlxd_decode_step_seconds",
            "A worker's recent decode steps: time from one to the next, by quantile.",
            labels=["model", "quantile"],
        )
        for model, snap in latest.items():
            summary = snap.stats.decode_step
            if summary.num_samples:
                for q, ms in (
                    ("0.5", summary.p50_ms),
                    ("0.95", summary.p95_ms),
                    ("0.99", summary.p99_ms),
                ):
                    step.add_metric([model, q], ms / 1000.0)
        yield step
        yield from self._counters(latest)

    # Internal helpers

    @staticmethod
    def _counters(latest: dict[str, _Snapshot]) -> Iterator[Metric]:
        counters = {
            "prefix_cache_hits": "Requests that reused a cached prefix (since the worker started).",
            "prefix_cache_misses": "Requests that found no cached prefix.",
            "prefix_cache_hit_tokens": "Prompt tokens served from the prefix cache.",
            "preemptions": "Sequences preempted because the KV pool was full.",
            "decode_gathered_steps": "Decode steps that read the KV pool's blocks instead of "
            "decode's read view (slower; a larger --kv-cache-gb gives the view more room).",
            "spec_drafted_tokens": "Draft tokens verified (speculative decoding).",
            "spec_accepted_tokens": "Draft tokens accepted (speculative decoding).",
            "images": "Images in admitted requests (a vision-language model).",
            "images_encoded": "Images run through the vision tower (a prefix-cache hit "
            "skips it; a preempted request may run it again).",
        }
        for name, doc in counters.items():
            family = CounterMetricFamily(f"mlxd_worker_{name}", doc, labels=["model"])
            for model, snap in latest.items():
                family.add_metric([model], getattr(snap.stats, name))
            yield family
        rate = GaugeMetricFamily(
            "mlxd_prefix_cache_hit_rate",
            "Hits / (hits + misses) since the worker started.",
            labels=["model"],
        )
        for model, snap in latest.items():
            asked = snap.stats.prefix_cache_hits + snap.stats.prefix_cache_misses
            rate.add_metric([model], snap.stats.prefix_cache_hits / asked if asked else 0.0)
        yield rate
        encode = CounterMetricFamily(
            "mlxd_worker_vision_encode_seconds",
            "Seconds a vision-language model's vision tower ran (on the worker's engine thread).",
            labels=["model"],
        )
        for model, snap in latest.items():
            encode.add_metric([model], snap.stats.vision_encode_s)
        yield encode
        images = GaugeMetricFamily(
            "mlxd_images_per_second",
            "Images admitted per second over the last 10 s (a vision-language model; "
            "rate(mlxd_worker_images_total) gives any other window).",
            labels=["model"],
        )
        for model, snap in latest.items():
            images.add_metric([model], snap.stats.images_per_s_recent)
        yield images
        for name, doc in (
            (
                "spec_acceptance_rate",
                "Accepted / drafted tokens since the worker started (speculative decoding).",
            ),
            (
                "tokens_per_forward",
                "Decode tokens per row and forward since the "
                "worker started (1 without speculation).",
            ),
        ):
            gauge = GaugeMetricFamily(f"mlxd_{name}", doc, labels=["model"])
            for model, snap in latest.items():
                gauge.add_metric([model], getattr(snap.stats, name))
            yield gauge

    async def _run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # noqa: BLE001 - metrics must never take the gateway down
                log.exception("polling worker metrics failed")
            await asyncio.sleep(self.interval_s)

    async def _ask(self, name: str) -> _Snapshot | None:
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = self.pool.control(name).sibling()
        try:
            status = await client.request(GetStatus(request_id=client.next_id()), self.interval_s)
            stats = await client.request(GetStats(request_id=client.next_id()), self.interval_s)
        except MlxdError:
            return None  # busy, restarting or gone: it shows again once it answers
        if not isinstance(status, StatusReply) or not isinstance(stats, StatsReply):
            return None
        return _Snapshot(status, stats)
