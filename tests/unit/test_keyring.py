"""KeyRing matching, where a client's key comes from, and what counts as loopback."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from mlxd.config import ApiKey
from mlxd.gateway.http.auth import KeyRing, is_loopback, presented_key

ALICE = ApiKey(name="alice", key="sk-alice", tier="high")
BOB = ApiKey(name="bob", key="sk-bob")


def test_keyring_matches_exactly_one_key() -> None:
    ring = KeyRing([ALICE, BOB])
    assert ring.match("sk-alice") is ALICE
    assert ring.match("sk-bob") is BOB
    for wrong in ("", "sk-alic", "sk-alice ", "SK-ALICE", "sk-alicesk-bob"):
        assert ring.match(wrong) is None


def test_empty_keyring_is_off() -> None:
    assert not KeyRing([])
    assert KeyRing([ALICE])


@pytest.mark.parametrize(
    "headers, key",
    [
        ({"authorization": "Bearer sk-1"}, "sk-1"),
        ({"authorization": "bearer  sk-1 "}, "sk-1"),
        ({"x-api-key": "sk-2"}, "sk-2"),
        ({"authorization": "Basic abc", "x-api-key": "sk-2"}, "sk-2"),
        ({"authorization": "Bearer "}, None),
        ({}, None),
    ],
)
def test_presented_key(headers: dict[str, str], key: str | None) -> None:
    assert presented_key(Headers(headers)) == key


@pytest.mark.parametrize(
    "client, loopback",
    [
        (("127.0.0.1", 1), True),
        (("127.8.0.3", 1), True),
        (("::1", 1), True),
        (None, True),
        (("10.0.0.1", 1), False),
        (("::ffff:10.0.0.1", 1), False),
        (("testclient", 1), False),
    ],
)
def test_is_loopback(client: tuple[str, int] | None, loopback: bool) -> None:
    assert is_loopback(client) is loopback
