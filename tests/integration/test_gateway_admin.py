"""Admin endpoint guards (the admin socket / the admin key over TCP) and ControlClient over a real
ZMQ ROUTER."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import pytest
import zmq
import zmq.asyncio
from starlette.testclient import TestClient

from mlxd.config import ModelSpec, ServeConfig
from mlxd.errors import InvalidRequest, WorkerUnavailable
from mlxd.gateway.app import build_app
from mlxd.gateway.backends.local.control import ControlClient
from mlxd.gateway.backends.local.pool import StaticPool
from mlxd.gateway.ops.admin import AdminSocketApp
from mlxd.protocol import codec
from mlxd.protocol.messages import Ack, Error, Pause, SetConfig


def _client(
    admin_key: str | None = None, peer: str = "testclient", on_socket: bool = False
) -> TestClient:
    """The app without its lifespan: no worker is connected. ``on_socket``: as served on the
    admin Unix socket (``AdminSocketApp``)."""
    config = ServeConfig(models=(ModelSpec(name="m", path="/m"),), admin_key=admin_key)
    pool = StaticPool({"m": f"ipc:///tmp/mlxd-test-{uuid.uuid4().hex}.sock"})
    app = build_app(config, pool)
    return TestClient(AdminSocketApp(app) if on_socket else app, client=(peer, 50000))


CONTROL = [
    ("post", "/admin/models/m/drain"),
    ("post", "/admin/models/m/shutdown"),
    ("post", "/admin/models/m/unload"),
    ("post", "/admin/models/m/set"),
    ("get", "/admin/status"),
]


@pytest.mark.parametrize("peer", ["127.0.0.1", "::1"])
@pytest.mark.parametrize(("method", "path"), CONTROL)
def test_loopback_over_tcp_is_refused_without_an_admin_key(
    peer: str, method: str, path: str
) -> None:
    # A same-host proxy or tunnel that adds no X-Forwarded-For makes every client loopback.
    r = _client(peer=peer).request(method, path, json={"max_num_seqs": 2})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert "Unix socket" in r.json()["error"]["message"]


def test_loopback_over_tcp_needs_the_admin_key_when_set() -> None:
    r = _client("secret", peer="127.0.0.1").post("/admin/models/m/drain")
    assert r.status_code == 401


@pytest.mark.parametrize("admin_key", [None, "secret"])
def test_the_admin_socket_needs_no_key(admin_key: str | None) -> None:
    r = _client(admin_key, on_socket=True).get("/admin/status")
    assert r.status_code == 200 and r.json()["models"][0]["name"] == "m"


def test_the_admin_socket_marker_cannot_come_from_a_header() -> None:
    r = _client(peer="127.0.0.1").get("/admin/status", headers={"mlxd.admin_socket": "1"})
    assert r.status_code == 403


def test_non_loopback_clients_are_refused_without_an_admin_key() -> None:
    r = _client().get("/admin/status")
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic c2VjcmV0", "Bearer "])
def test_admin_key_is_required_when_configured(header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    r = _client("secret").post("/admin/models/m/drain", headers=headers)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_the_admin_key_opens_the_admin_endpoints() -> None:
    client = _client("secret")
    r = client.get("/admin/status", headers={"Authorization": "Bearer secret"})
    assert r.status_code == 200
    [model] = r.json()["models"]
    assert model["name"] == "m" and model["state"] == "stopped" and model["pid"] is None
    assert model["restarts"] == 0 and model["last_error"] == "" and model["in_flight"] == 0
    r = client.get("/admin/models/m/status", headers={"Authorization": "Bearer secret"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "worker_unavailable"
    r = client.get("/admin/models/nope/stats", headers={"Authorization": "Bearer secret"})
    assert r.status_code == 404


def _with_router(body: Callable[[zmq.asyncio.Socket, ControlClient], Awaitable[None]]) -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        endpoint = f"inproc://ctl-{uuid.uuid4().hex}"
        router = ctx.socket(zmq.ROUTER)
        router.bind(endpoint)
        client = ControlClient("m", endpoint, ctx)
        try:
            await body(router, client)
        finally:
            await client.close()
            router.close(linger=0)
            ctx.term()

    asyncio.run(main())


def test_control_client_times_out_as_worker_unavailable() -> None:
    async def body(router: zmq.asyncio.Socket, client: ControlClient) -> None:
        with pytest.raises(WorkerUnavailable, match="did not answer 'pause'"):
            await client.request(Pause(request_id=client.next_id()), timeout_s=0.1)

    _with_router(body)


def test_control_client_drops_stale_replies_and_raises_typed_errors() -> None:
    async def body(router: zmq.asyncio.Socket, client: ControlClient) -> None:
        async def answer() -> None:
            ident, *frames = await router.recv_multipart()
            msg = codec.decode(frames)
            stale = Ack(request_id="old", state="running")
            error = Error(
                request_id=msg.request_id,
                code="invalid_request",
                message="bad",  # type: ignore[union-attr]
                param="max_num_seqs",
            )
            for reply in (stale, error):
                await router.send_multipart([ident, *codec.encode(reply)])

        task = asyncio.create_task(answer())
        with pytest.raises(InvalidRequest) as info:
            await client.request(SetConfig(request_id=client.next_id(), max_num_seqs=0))
        assert info.value.param == "max_num_seqs"
        await task

    _with_router(body)
