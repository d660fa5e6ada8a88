"""Metrics: per-request accounting from a record and its stream events, and scrape-time sources."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest

from mlxd.gateway.backends.local.pool import StaticPool
from mlxd.gateway.http.accesslog import RequestRecord
from mlxd.gateway.ops.metrics import Metrics
from mlxd.protocol.messages import Finished, TokenDelta, Usage

MODEL = "m"


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def record() -> RequestRecord:
    r = RequestRecord("rid", "POST", "/v1/chat/completions", start=0.0)
    r.model, r.endpoint, r.status = MODEL, "/v1/chat/completions", 200
    return r


def delta(n: int = 1) -> TokenDelta:
    return TokenDelta(request_id="rid", text="x", token_ids=list(range(n)))


def test_a_finished_stream_is_counted_and_timed() -> None:
    metrics, rec = Metrics(), record()
    observe = metrics.track(rec)
    assert sample(metrics, "mlxd_requests_in_flight", model=MODEL) == 1
    for event in (delta(), delta(2), delta()):
        observe(event)
    usage = Usage(prompt_tokens=7, completion_tokens=4, cached_tokens=3)
    observe(Finished(request_id="rid", finish_reason="stop", usage=usage))
    rec.end = rec.last_token_at + 0.5
    metrics.finish(rec)
    assert sample(metrics, "mlxd_requests_in_flight", model=MODEL) == 0
    assert sample(metrics, "mlxd_time_to_first_token_seconds_count", model=MODEL) == 1
    assert sample(metrics, "mlxd_inter_token_latency_seconds_count", model=MODEL) == 2
    assert sample(metrics, "mlxd_e2e_request_latency_seconds_count", model=MODEL) == 1
    assert sample(metrics, "mlxd_prompt_tokens_total", model=MODEL) == 7
    assert sample(metrics, "mlxd_completion_tokens_total", model=MODEL) == 4
    assert sample(metrics, "mlxd_cached_tokens_total", model=MODEL) == 3
    labels = {"model": MODEL, "endpoint": "/v1/chat/completions", "status": "200"}
    assert sample(metrics, "mlxd_requests_total", **labels) == 1


def test_a_cancelled_stream_counts_what_was_streamed_but_no_latency() -> None:
    metrics, rec = Metrics(), record()
    observe = metrics.track(rec)
    observe(delta(3))
    observe(delta(2))
    metrics.finish(rec)
    assert rec.tokens() == (0, 5, 0)
    assert sample(metrics, "mlxd_completion_tokens_total", model=MODEL) == 5
    assert sample(metrics, "mlxd_e2e_request_latency_seconds_count", model=MODEL) is None


def test_text_only_in_finished_still_gives_a_first_token_time() -> None:
    metrics, rec = Metrics(), record()
    usage = Usage(prompt_tokens=1, completion_tokens=2)
    metrics.track(rec)(Finished(request_id="rid", finish_reason="stop", usage=usage, text="ab"))
    assert rec.first_token_at is not None
    assert sample(metrics, "mlxd_time_to_first_token_seconds_count", model=MODEL) == 1


def test_requests_without_a_model_are_counted_with_an_empty_label() -> None:
    metrics = Metrics()
    rec = RequestRecord("rid", "GET", "/nowhere", start=0.0, endpoint="other", status=404)
    metrics.finish(rec)
    assert sample(metrics, "mlxd_requests_total", model="", endpoint="other", status="404") == 1


def test_sources_and_restarts_are_read_at_scrape_time() -> None:
    metrics = Metrics(StaticPool({MODEL: "ipc:///nowhere"}))
    depth = {"value": 2.0}

    def queue_depth() -> list[GaugeMetricFamily]:
        family = GaugeMetricFamily("mlxd_queue_depth", "Waiting requests.", labels=["model"])
        family.add_metric([MODEL], depth["value"])
        return [family]

    metrics.add_source(queue_depth)
    assert sample(metrics, "mlxd_queue_depth", model=MODEL) == 2
    depth["value"] = 5.0
    assert b'mlxd_queue_depth{model="m"} 5.0' in generate_latest(metrics.registry)
    assert sample(metrics, "mlxd_worker_restarts_total", model=MODEL) == 0


def test_two_apps_do_not_share_metrics() -> None:
    first, second = Metrics(), Metrics()
    first.finish(RequestRecord("a", "GET", "/health", start=0.0, endpoint="/health", status=200))
    labels = {"model": "", "endpoint": "/health", "status": "200"}
    assert sample(first, "mlxd_requests_total", **labels) == 1
    assert sample(second, "mlxd_requests_total", **labels) is None
