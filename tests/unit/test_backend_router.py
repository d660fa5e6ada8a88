"""Router: model names and aliases -> the chain of targets a request goes down."""

from __future__ import annotations

from mlxd.config import BackendSpec, ModelSpec, RemoteModelSpec, ServeConfig
from mlxd.gateway.routing.router import Router, Target

UP = BackendSpec(name="up", kind="openai", base_url="http://h:1/v1")


def _router(*, local_fallbacks: tuple[str, ...] = ()) -> Router:
    return Router(
        ServeConfig(
            models=(ModelSpec(name="q", path="p", aliases=("qa",), fallbacks=local_fallbacks),),
            backends=(UP,),
            remote_models=(
                RemoteModelSpec(name="a", backend="up", upstream_model="gpt", fallbacks=("b", "q")),
                RemoteModelSpec(name="b", backend="up", fallbacks=("a",)),
            ),
        )
    )


def test_chain_is_the_model_then_its_fallbacks_once_each() -> None:
    chain = _router().chain("a")
    assert chain == [Target("a", "up", "gpt"), Target("b", "up", "b"), Target("q")]


def test_an_alias_resolves_to_its_model() -> None:
    assert _router(local_fallbacks=("a",)).chain("qa")[:2] == [
        Target("q"),
        Target("a", "up", "gpt"),
    ]


def test_unknown_names_have_no_chain() -> None:
    assert _router().chain("nope") == []


def test_routing_is_off_without_remote_models_or_fallbacks() -> None:
    assert not Router(ServeConfig(models=(ModelSpec(name="q", path="p"),))).is_active
    assert _router().is_active and [t.name for t in _router().remote] == ["a", "b"]
