"""``GET /metrics``: Prometheus text that parses; counters and histograms follow traffic."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from scripted_worker import DEFAULT_REPLY, MODEL

if TYPE_CHECKING:
    from conftest import Gateway

HELLO = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
REPLY_TOKENS = len(DEFAULT_REPLY.split())


@pytest.fixture(scope="module")
def observed(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway()


@pytest.fixture
def http(observed: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=observed.url, timeout=10) as session:
        yield session


@pytest.fixture
def oai(observed: Gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{observed.url}/v1", api_key="x", max_retries=0) as client:
        yield client


def scrape_settled(http: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``scrape`` once no request is in flight: a stream's last event can reach the client
    before the gateway counts the request (``Metrics.finish`` runs once the response is done,
    and counts it all at once)."""
    deadline = time.monotonic() + 5
    while True:
        samples = scrape(http)
        if value(samples, "mlxd_requests_in_flight", model=MODEL) == 0:
            return samples
        assert time.monotonic() < deadline, "a request stayed in flight"
        time.sleep(0.01)


def scrape(http: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` as ``{(name, sorted labels): value}``."""
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_parse_and_name_the_model(http: httpx.Client) -> None:
    scrape(http)  # a request is counted once its response is done: this one shows next time
    samples = scrape(http)
    assert value(samples, "mlxd_requests_total", model="", endpoint="/metrics", status="200") >= 1
    assert value(samples, "mlxd_worker_restarts_total", model=MODEL) == 0
    assert ("mlxd_worker_restarts_total", (("model", MODEL),)) in samples


def test_counters_follow_requests(http: httpx.Client, oai: openai.OpenAI) -> None:
    before = scrape(http)
    oai.chat.completions.create(model=MODEL, messages=HELLO)  # type: ignore[arg-type]
    for _ in oai.chat.completions.create(model=MODEL, messages=HELLO, stream=True):  # type: ignore[arg-type]
        pass
    after = scrape_settled(http)
    ok = {"model": MODEL, "endpoint": CHAT, "status": "200"}
    assert (
        value(after, "mlxd_requests_total", **ok) - value(before, "mlxd_requests_total", **ok) == 2
    )
    for name, per_request in [
        ("mlxd_prompt_tokens_total", 1),
        ("mlxd_completion_tokens_total", REPLY_TOKENS),
        ("mlxd_cached_tokens_total", 0),
    ]:
        grown = value(after, name, model=MODEL) - value(before, name, model=MODEL)
        assert grown == 2 * per_request, name
    assert value(after, "mlxd_requests_in_flight", model=MODEL) == 0


def test_histograms_follow_requests(http: httpx.Client, oai: openai.OpenAI) -> None:
    before = scrape(http)
    for _ in oai.chat.completions.create(model=MODEL, messages=HELLO, stream=True):  # type: ignore[arg-type]
        pass
    after = scrape_settled(http)

    def grown(name: str) -> float:
        return value(after, name, model=MODEL) - value(before, name, model=MODEL)

    assert grown("mlxd_time_to_first_token_seconds_count") == 1
    assert grown("mlxd_e2e_request_latency_seconds_count") == 1
    # One observation per delta after the first; the last words may come with Finished.
    assert REPLY_TOKENS - 2 <= grown("mlxd_inter_token_latency_seconds_count") <= REPLY_TOKENS - 1
    assert grown("mlxd_e2e_request_latency_seconds_sum") >= grown(
        "mlxd_time_to_first_token_seconds_sum"
    )


def test_in_flight_counts_open_streams(observed: Gateway, http: httpx.Client) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "SLOW"}], "stream": True}
    with http.stream("POST", CHAT, json=body) as response:
        lines = response.iter_lines()  # kept: a dropped iterator closes the response
        next(lines)
        assert value(scrape(http), "mlxd_requests_in_flight", model=MODEL) == 1
    deadline = time.monotonic() + 5
    while (
        value(scrape(http), "mlxd_requests_in_flight", model=MODEL) and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    assert value(scrape(http), "mlxd_requests_in_flight", model=MODEL) == 0


def test_errors_are_counted_without_a_model_label(http: httpx.Client) -> None:
    before = scrape(http)
    http.post(CHAT, json={"model": "nope", "messages": HELLO})
    http.get("/v1/nothing-here")
    after = scrape(http)
    for endpoint, status in [(CHAT, "404"), ("other", "404")]:
        labels = {"model": "", "endpoint": endpoint, "status": status}
        grown = value(after, "mlxd_requests_total", **labels) - value(
            before, "mlxd_requests_total", **labels
        )
        assert grown == 1, labels


ADMIN_KEY = "adm-metrics-secret"
REMOTE = {"X-Forwarded-For": "10.1.2.3"}  # uvicorn trusts it from 127.0.0.1: a remote client


def test_admin_key_guards_metrics_from_remote_clients(make_gateway: Callable[..., Gateway]) -> None:
    guarded = make_gateway(admin_key=ADMIN_KEY)
    with httpx.Client(base_url=guarded.url, timeout=10) as session:
        assert session.get("/metrics").status_code == 200  # loopback
        refused = session.get("/metrics", headers=REMOTE)
        assert refused.status_code == 401 and ADMIN_KEY not in refused.text
        bearer = {**REMOTE, "Authorization": f"Bearer {ADMIN_KEY}"}
        assert session.get("/metrics", headers=bearer).status_code == 200


def test_without_an_admin_key_metrics_are_open(http: httpx.Client) -> None:
    assert http.get("/metrics", headers=REMOTE).status_code == 200


def test_n_choices_count_as_one_request_with_summed_tokens(
    http: httpx.Client, oai: openai.OpenAI
) -> None:
    before = scrape(http)
    oai.chat.completions.create(model=MODEL, messages=HELLO, n=3)  # type: ignore[arg-type]
    for _ in oai.chat.completions.create(model=MODEL, messages=HELLO, n=3, stream=True):  # type: ignore[arg-type]
        pass
    ok = {"model": MODEL, "endpoint": CHAT, "status": "200"}
    # A request is counted once its response has ended, which the client may see first.
    deadline = time.monotonic() + 5
    while True:
        after = scrape(http)
        grown = value(after, "mlxd_requests_total", **ok) - value(
            before, "mlxd_requests_total", **ok
        )
        if grown >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert grown == 2
    for name, per_request in [
        ("mlxd_prompt_tokens_total", 1),
        ("mlxd_completion_tokens_total", 3 * REPLY_TOKENS),
    ]:
        grown = value(after, name, model=MODEL) - value(before, name, model=MODEL)
        assert grown == 2 * per_request, name
