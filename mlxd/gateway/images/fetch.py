"""Image URLs fetched by the gateway: an ``http(s)`` image part becomes bytes before the
request is served, held to the request's ``ImageLimits``.

A surface's parser cannot wait on the network, so it leaves a ``PendingImage`` (the URL, where
the client put it) in the prompt's images; ``ImageFetcher.fill`` fetches every pending one, in
turn, once the request is parsed and before a backend serves it (``ApiRequest.ready``).
Each fetch is bounded: a total timeout, at most ``max_redirects`` redirects, the size cap
enforced while streaming (a huge body is cut at the cap, never read whole), and the body must
start like an image. Unless ``allow_private`` is set, the host of the URL and of every redirect
is resolved and refused if any of its addresses is private, loopback, link-local or otherwise
not global, so a request cannot make the gateway reach the host's own network.

A URL may carry secrets: ``user:password@`` before its host, keys in its query string (a
signed URL's signature, ``?key=``). No error, log or message about an image URL shows them:
each names the URL as ``redact`` gives it (scheme, host, port and path), and so does the text
of an HTTP library's error, which may quote the URL, and httpx's own log line of each request
(its "HTTP Request: GET <url>" at info level: ``RedactUrls`` on the ``httpx`` logger).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import httpx

from mlxd.errors import InvalidRequest
from mlxd.gateway.images.formats import checked_image
from mlxd.gateway.images.limits import ImageLimits
from mlxd.protocol.messages import ChatPrompt, ImageData

# Any URL in a text: a scheme, "://", then everything up to a space or a quote.
_URL = re.compile(r"""[A-Za-z][A-Za-z0-9+.-]*://[^\s'"<>]+""")
_QUERY = re.compile(r"""\?(?!\[redacted\])[^\s'"<>]+""")


@dataclass(frozen=True, kw_only=True)
class PendingImage(ImageData):
    """An image URL not fetched yet: its place among the prompt's images, until ``fill``."""

    url: str = field(repr=False)  # may hold credentials: never in a repr (``redact``)
    where: str  # the field the client put it in, for errors


def pending_image(url: str, where: str) -> PendingImage:
    return PendingImage(data=b"", digest="", url=url, where=where)


class RedactUrls(logging.Filter):
    """Log records with every URL in them as ``redact`` gives it, and every other query string
    cut too (httpcore's debug trace shows a redirect's relative ``Location``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except (TypeError, ValueError):  # a malformed record: logging reports it, not this
            return True
        record.msg, record.args = _QUERY.sub("?[redacted]", redact(text)), ()
        return True


_REDACT_URLS = RedactUrls()
# httpx's request lines and httpcore's debug trace (a filter acts on its own logger's records
# only, not on its children's: each logger by name).
_HTTP_LOGGERS = (
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
)


class ImageFetcher:
    """Fetches the image URLs of requests, within ``limits``, on one connection pool."""

    def __init__(self, limits: ImageLimits) -> None:
        self.limits = limits
        for name in _HTTP_LOGGERS:
            logging.getLogger(name).addFilter(_REDACT_URLS)  # a filter is added once
        self.client = httpx.AsyncClient(
            follow_redirects=False, timeout=limits.fetch_timeout_s, trust_env=False
        )

    async def fill(self, parsed: Any) -> Any:
        """``parsed`` with each pending image of its chat fetched (itself when none is)."""
        prompt = getattr(parsed, "prompt", None)
        if not isinstance(prompt, ChatPrompt) or not _pending(prompt):
            return parsed
        images = [await self._fetched(i) for i in prompt.images or ()]
        return replace(parsed, prompt=replace(prompt, images=images))

    async def fetch(self, url: str, where: str) -> bytes:
        """The body at ``url`` (redirects followed), or ``InvalidRequest`` saying why not."""
        timeout_s = self.limits.fetch_timeout_s
        try:
            with anyio.fail_after(timeout_s):
                return await self._follow(url, where)
        except TimeoutError:
            raise InvalidRequest(
                f"'{where}': fetching {redact(url)} took over {timeout_s:g} s", param=where
            ) from None
        except httpx.HTTPError as exc:
            message = redact(f"'{where}': cannot fetch {url}: {exc}")
            raise InvalidRequest(message, param=where) from None

    async def close(self) -> None:
        await self.client.aclose()

    # Internal helpers

    async def _fetched(self, image: ImageData) -> ImageData:
        if not isinstance(image, PendingImage):
            return image
        data = await self.fetch(image.url, image.where)
        return checked_image(data, image.where, self.limits.max_bytes)

    async def _follow(self, url: str, where: str) -> bytes:
        for _ in range(self.limits.max_redirects + 1):
            await self._check_host(httpx.URL(url), where)
            async with self.client.stream("GET", url) as response:
                if response.is_redirect:
                    url = str(response.url.join(response.headers["location"]))
                    continue
                if response.status_code != 200:
                    raise InvalidRequest(
                        f"'{where}': {redact(url)} answered {response.status_code}", param=where
                    )
                return await self._body(response, where)
        raise InvalidRequest(
            f"'{where}': {redact(url)} redirects more than {self.limits.max_redirects} times",
            param=where,
        )

    async def _body(self, response: httpx.Response, where: str) -> bytes:
        """The body, cut at the size cap: a larger one is refused without reading it all."""
        cap = self.limits.max_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise _too_large(where, cap)
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > cap:
                raise _too_large(where, cap)
        return bytes(body)

    async def _check_host(self, url: httpx.URL, where: str) -> None:
        if url.scheme not in ("http", "https") or not url.host:
            raise InvalidRequest(
                f"'{where}': {redact(str(url))} is not an http(s) URL", param=where
            )
        if self.limits.allow_private:
            return
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            infos = await anyio.getaddrinfo(url.host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise InvalidRequest(
                redact(f"'{where}': cannot resolve {url.host}: {exc}"), param=where
            ) from None
        for info in infos:
            if not _is_public(str(info[4][0])):
                raise InvalidRequest(
                    f"'{where}': {url.host} is a private, loopback or link-local address; "
                    "image URLs must be public (--allow-private-image-urls allows them)",
                    param=where,
                )


def redact(text: str) -> str:
    """``text`` with every URL in it cut to its scheme, host, port and path: no
    ``user:password@``, no query string, no fragment (they may carry keys)."""
    return _URL.sub(lambda m: _redacted(m.group(0)), text)


def _redacted(url: str) -> str:
    scheme, _, rest = url.partition("://")
    before_query = re.split(r"[?#]", rest, maxsplit=1)[0]
    # userinfo ends at the last '@' (a password may hold an unescaped '/' or '@'): a path
    # with an '@' of its own loses its host too, never a secret
    at = before_query.rfind("@")
    userinfo = "[redacted]@" if at >= 0 else ""
    query = "?[redacted]" if len(before_query) < len(rest) else ""
    return f"{scheme}://{userinfo}{before_query[at + 1 :]}{query}"


def _pending(prompt: ChatPrompt) -> bool:
    return any(isinstance(i, PendingImage) for i in prompt.images or ())


def _is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])  # an IPv6 scope (fe80::1%en0) aside
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _too_large(where: str, cap: int) -> InvalidRequest:
    return InvalidRequest(f"'{where}' is over {cap} bytes per image", param=where)
