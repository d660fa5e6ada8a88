"""ZeroMQ CURVE for ``tcp://`` links between the gateway and workers on other hosts.

Each side has its own keypair, made on its own host by `mlxd keys new gateway|worker`, and a
list of the peers it accepts (public keys only cross hosts):

- a worker binds as CURVE server with ``worker.key`` and its ZAP handler admits only clients
  whose public key is in ``authorized_gateways``; the handshake makes them prove they hold the
  secret, so anyone else is refused before a frame reaches the worker;
- the gateway connects with ``gateway.key`` and pins the worker's public key from
  ``authorized_workers`` (a line ``KEY NAME`` for the model ``NAME``, else the one line without a
  name): a worker that does not hold that key's secret cannot complete the handshake.

Leaking one side's secret no longer lets its holder pose as the other side, and one key is
revoked by deleting its line. ``ipc://`` links stay in a 0700 runtime directory and need no keys;
a ``tcp://`` link without keys is refused. Secrets never leave the ``*.key`` files (mode 0600):
``repr`` and every message show public keys only.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.utils.z85

from mlxd.errors import ConfigError

ROLES = ("gateway", "worker")
LEGACY_FILE = "curve.key"  # before each side had its own keys: one pair for both


@dataclass(frozen=True)
class CurveKeys:
    """One side's z85 CURVE keypair and the peers it accepts; ``repr`` leaves the secret out.

    ``peers`` holds ``(public key, name)`` pairs; ``name`` is ``""`` for a key not tied to one
    worker (the gateway pins named keys per model, see the module docstring).
    """

    public: bytes
    secret: bytes
    peers: tuple[tuple[bytes, str], ...] = ()

    def __repr__(self) -> str:
        return f"CurveKeys(public={self.public.decode()!r}, peers={len(self.peers)})"

    def server_key(self, name: str) -> bytes:
        """The worker key the gateway pins for model ``name``."""
        named = [k for k, n in self.peers if n == name]
        unnamed = [k for k, n in self.peers if not n]
        if named or len(unnamed) == 1:
            return (named or unnamed)[0]
        raise ConfigError(
            f"no worker key for {name!r} in authorized_workers: add one with "
            f"`mlxd keys trust worker KEY --name {name}`"
        )

    def admits(self, public: bytes) -> bool:
        """Whether ``public`` is an authorized peer (compared in constant time, each one)."""
        found = False
        for key, _ in self.peers:
            found |= hmac.compare_digest(key, public)
        return found


def keys_dir(data_dir: Path) -> Path:
    return data_dir / "keys"


def peer_file(directory: Path, role: str) -> Path:
    """The list of ``role``'s peers: ``authorized_workers`` for the gateway and so on."""
    return directory / f"authorized_{ROLES[1 - ROLES.index(role)]}s"


def generate(directory: Path, role: str, overwrite: bool = False) -> CurveKeys:
    """Make ``role``'s keypair in ``directory`` (0700; ``ROLE.key`` 0600, ``ROLE.pub``)."""
    secret_path = directory / f"{role}.key"
    if secret_path.exists() and not overwrite:
        raise ConfigError(
            f"{secret_path} exists; pass --force to replace it (its peers then "
            "need the new public key)"
        )
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    public, secret = zmq.curve_keypair()
    secret_path.unlink(missing_ok=True)
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(public + b"\n" + secret + b"\n")
    (directory / f"{role}.pub").write_bytes(public + b"\n")
    return CurveKeys(public, secret)


def load(directory: Path, role: str) -> CurveKeys | None:
    """``role``'s keypair and authorized peers, or None if it has no keypair. A secret file
    readable by others is refused: anyone who can read it can pose as this side."""
    path = directory / f"{role}.key"
    try:
        mode = path.stat().st_mode
        lines = path.read_bytes().split()
    except FileNotFoundError:
        if (directory / LEGACY_FILE).exists():
            raise ConfigError(
                f"{directory / LEGACY_FILE} (one keypair for both sides) is no "
                f"longer used: make this side's with `mlxd keys new {role}` and "
                "trust each other's public key (README)"
            ) from None
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise ConfigError(f"{path} is readable by other users; chmod 600 it")
    if len(lines) != 2 or any(len(k) != 40 for k in lines):
        raise ConfigError(f"{path} is not an mlxd CURVE keypair; make one with `mlxd keys new`")
    return CurveKeys(public=lines[0], secret=lines[1], peers=read_peers(peer_file(directory, role)))


def read_peers(path: Path) -> tuple[tuple[bytes, str], ...]:
    """``KEY [NAME]`` lines (no comments: ``#`` is a z85 character); a malformed key is an error
    naming the line."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ()
    peers = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) > 2 or len(fields[0]) != 40:
            raise ConfigError(
                f"{path}:{number}: expected 'PUBLIC_KEY [NAME]' (a 40-character z85 key)"
            )
        peers.append((fields[0].encode(), fields[1] if len(fields) == 2 else ""))
    return tuple(peers)


def trust(directory: Path, role: str, public: str, name: str = "") -> Path:
    """Add ``public`` to the list of ``role`` peers (``authorized_workers`` for role worker)."""
    if not _is_z85_key(public):
        raise ConfigError("a public key is 40 z85 characters (the line `mlxd keys new` prints)")
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = peer_file(directory, ROLES[1 - ROLES.index(role)])
    with path.open("a") as f:
        f.write(f"{public} {name}".rstrip() + "\n")
    return path


def _is_z85_key(text: str) -> bool:
    try:
        return len(text) == 40 and len(zmq.utils.z85.decode(text.encode())) == 32
    except (ValueError, KeyError, IndexError):
        return False


def revoke(directory: Path, public: str) -> list[Path]:
    """Remove ``public`` from both peer lists; the files it was removed from."""
    changed = []
    for role in ROLES:
        path = peer_file(directory, role)
        if not path.exists():
            continue
        lines = path.read_text().splitlines(keepends=True)
        kept = [ln for ln in lines if ln.split()[:1] != [public]]
        if kept != lines:
            path.write_text("".join(kept))
            changed.append(path)
    return changed


def require(endpoint: str, keys: CurveKeys | None) -> CurveKeys | None:
    """The keys to use for ``endpoint``: None for ipc/inproc; for tcp, ``keys`` or an error."""
    if not endpoint.startswith("tcp://"):
        return None
    if keys is None:
        raise ConfigError(
            f"{endpoint}: tcp:// links need CURVE keys; make them with `mlxd "
            "keys new gateway|worker` and trust the peer's public key"
        )
    if not keys.peers:
        raise ConfigError(f"{endpoint}: no authorized peer keys; add one with `mlxd keys trust`")
    return keys


def make_server(sock: zmq.Socket[Any], keys: CurveKeys) -> None:
    """Set ``sock`` (before bind) to accept CURVE clients only; pair it with ``Authenticator``."""
    sock.curve_server = True
    sock.curve_publickey = keys.public
    sock.curve_secretkey = keys.secret
    sock.zap_domain = b"mlxd"


def make_client(sock: zmq.Socket[Any], keys: CurveKeys, name: str) -> None:
    """Set ``sock`` (before connect) to authenticate with the gateway's ``keys`` to the worker of
    model ``name``, whose public key it pins."""
    sock.curve_serverkey = keys.server_key(name)
    sock.curve_publickey = keys.public
    sock.curve_secretkey = keys.secret


class Authenticator:
    """The worker's ZAP handler (pyzmq's, on a thread): admits only authorized gateway keys."""

    def __init__(self, context: zmq.Context[Any], keys: CurveKeys) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        self._keys = keys
        self._auth = ThreadAuthenticator(context)
        self._auth.start()
        self._auth.configure_curve_callback(domain="mlxd", credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        # pyzmq passes the client's key z85-encoded when the provider's keys are z85.
        return self._keys.admits(key)

    def stop(self) -> None:
        self._auth.stop()
