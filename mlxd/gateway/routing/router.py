"""Model name -> the targets that may serve it: the model itself, then its fallbacks in turn.

A target is a local model (served by the worker pool, as without backends) or a remote one (a
backend and the model name it knows). Built once from the config; pure lookups after that.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxd.config import RemoteModelSpec, ServeConfig

LOCAL = "local"  # the backend name of models served by the worker pool


@dataclass(frozen=True, slots=True)
class Target:
    """One place a request can go.

    ``name`` is the model name clients see (and the ``model`` field of the answer); a remote
    target also has its ``backend`` and the ``upstream`` model name sent there.
    """

    name: str
    backend: str = LOCAL
    upstream: str = ""

    @property
    def is_local(self) -> bool:
        """True for a model of the local worker pool."""
        return self.backend == LOCAL


class Router:
    """Resolves model names (and aliases) to chains of ``Target``.

    Args:
        config: the local models, the remote models and their fallbacks.
    """

    def __init__(self, config: ServeConfig) -> None:
        self._targets: dict[str, Target] = {}
        self._fallbacks: dict[str, tuple[str, ...]] = {}
        self._on_busy = {s.name for s in config.models if s.fallback_on_busy}
        self._on_busy |= {s.name for s in config.remote_models if s.fallback_on_busy}
        for spec in config.models:
            self._add(Target(spec.name), spec.aliases, spec.fallbacks)
        for remote in config.remote_models:
            self._add(_remote_target(remote), remote.aliases, remote.fallbacks)
        self.remote = [t for t in self._targets.values() if not t.is_local]
        self.remote = list(dict.fromkeys(self.remote))  # aliases map to the same target
        self.is_active = bool(self.remote) or any(self._fallbacks.values())

    def chain(self, name: str) -> list[Target]:
        """``name``'s target and then each fallback's, once each; ``[]`` for an unknown name."""
        out: list[Target] = []
        pending = [name]
        while pending:
            target = self._targets.get(pending.pop(0))
            if target is None or target in out:
                continue
            out.append(target)
            pending.extend(self._fallbacks.get(target.name, ()))
        return out

    def fails_over_when_busy(self, target: Target) -> bool:
        """Whether ``target``'s 429 (a full queue here, a busy upstream) goes to its fallbacks
        (``fallback_on_busy``) rather than to the client."""
        return target.name in self._on_busy

    def target(self, name: str) -> Target | None:
        """The target of ``name`` (or alias), without its fallbacks."""
        return self._targets.get(name)

    # Internal helpers

    def _add(self, target: Target, aliases: tuple[str, ...], fallbacks: tuple[str, ...]) -> None:
        for name in (target.name, *aliases):
            self._targets[name] = target
        self._fallbacks[target.name] = fallbacks


def _remote_target(spec: RemoteModelSpec) -> Target:
    return Target(spec.name, backend=spec.backend, upstream=spec.upstream)
