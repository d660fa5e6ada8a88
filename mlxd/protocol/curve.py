"""ZeroMQ CURVE for ``tcp://`` links between the gateway and workers on other hosts.

One keypair, made by `mlxd keys` (``zmq.curve_keypair``) and copied to every host of a
deployment, is the worker's server key and the gateway's client key. The worker's ZAP handler
admits only clients that present that public key, which the CURVE handshake makes them prove by
holding its secret; anyone else is refused before a frame reaches the worker. ``ipc://`` links
stay in a 0700 runtime directory and need no keys; a ``tcp://`` link without keys is refused.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from mlxd.errors import ConfigError

SECRET_FILE = "curve.key"  # public and secret key, z85, mode 0600
PUBLIC_FILE = "curve.pub"  # the public key alone


@dataclass(frozen=True)
class CurveKeys:
    """A z85 CURVE keypair; ``repr`` leaves the secret out."""

    public: bytes
    secret: bytes

    def __repr__(self) -> str:
        return f"CurveKeys(public={self.public.decode()!r})"


def keys_dir(data_dir: Path) -> Path:
    return data_dir / "keys"


def generate(directory: Path, overwrite: bool = False) -> CurveKeys:
    """Make a keypair in ``directory`` (0700; the secret file 0600). Refuses to replace one."""
    secret_path = directory / SECRET_FILE
    if secret_path.exists() and not overwrite:
        raise ConfigError(f"{secret_path} exists; pass --force to replace it (every host "
                          "then needs the new keys)")  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    public, secret = zmq.curve_keypair()
    secret_path.unlink(missing_ok=True)
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(public + b"\n" + secret + b"\n")
    (directory / PUBLIC_FILE).write_bytes(public + b"\n")
    return CurveKeys(public, secret)


def load(directory: Path) -> CurveKeys | None:
    """The keypair in ``directory``, or None if there is none. A secret file readable by
    others is refused: anyone who can read it can pose as the gateway."""
    path = directory / SECRET_FILE
    try:
        mode = path.stat().st_mode
        lines = path.read_bytes().split()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise ConfigError(f"{path} is readable by other users; chmod 600 it")
    if len(lines) != 2 or any(len(k) != 40 for k in lines):
        raise ConfigError(f"{path} is not an mlxd CURVE keypair; make one with `mlxd keys`")
    return CurveKeys(public=lines[0], secret=lines[1])


def require(endpoint: str, keys: CurveKeys | None) -> CurveKeys | None:
    """The keys to use for ``endpoint``: None for ipc/inproc; for tcp, ``keys`` or an error."""
    if not endpoint.startswith("tcp://"):
        return None
    if keys is None:
        raise ConfigError(f"{endpoint}: tcp:// links need CURVE keys; make them with `mlxd keys` "
                          "and copy the keys directory to every host")  # fmt: skip
    return keys


def make_server(sock: zmq.Socket[Any], keys: CurveKeys) -> None:
    """Set ``sock`` (before bind) to accept CURVE clients only; pair it with ``Authenticator``."""
    sock.curve_server = True
    sock.curve_publickey = keys.public
    sock.curve_secretkey = keys.secret
    sock.zap_domain = b"mlxd"


def make_client(sock: zmq.Socket[Any], keys: CurveKeys) -> None:
    """Set ``sock`` (before connect) to authenticate with ``keys`` to a worker holding them."""
    sock.curve_serverkey = keys.public
    sock.curve_publickey = keys.public
    sock.curve_secretkey = keys.secret


class Authenticator:
    """The worker's ZAP handler (pyzmq's, on a thread): admits only our public key."""

    def __init__(self, context: zmq.Context[Any], keys: CurveKeys) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        self._keys = keys
        self._auth = ThreadAuthenticator(context)
        self._auth.start()
        self._auth.configure_curve_callback(domain="mlxd", credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        # pyzmq passes the client's key z85-encoded when the provider's keys are z85.
        return hmac.compare_digest(key, self._keys.public)

    def stop(self) -> None:
        self._auth.stop()
