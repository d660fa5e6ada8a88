"""The status page at ``/``: plain HTML, CSS and JavaScript shipped in the package.

No build step and nothing from a CDN: the three files in ``static/`` are read once, when the app
is built, and served as they are. The page itself holds no data; its script polls
``GET /admin/overview`` (see ``overview.py``) with the key the user typed, kept in
``sessionStorage`` only, and sends the admin actions to ``/admin/models/{name}/{action}``.
"""

from __future__ import annotations

from importlib import resources

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_TYPES = {"status.html": "text/html", "status.css": "text/css", "status.js": "text/javascript"}
# The page's own files only: no inline script, no other origin, no framing.
_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
}


def status_page_routes() -> list[Route]:
    """``GET /`` (the page) and ``GET /static/{file}`` (its stylesheet and script)."""
    files = {
        name: (resources.files("mlxd.gateway.ops") / "static" / name).read_bytes()
        for name in _TYPES
    }

    async def page(request: Request) -> Response:
        return _serve(files, "status.html")

    async def asset(request: Request) -> Response:
        name = request.path_params["file"]
        if name not in files or name == "status.html":
            raise HTTPException(404, "Not Found")
        return _serve(files, name)

    return [Route("/", page, methods=["GET"]), Route("/static/{file}", asset, methods=["GET"])]


def _serve(files: dict[str, bytes], name: str) -> Response:
    media_type = f"{_TYPES[name]}; charset=utf-8"
    return Response(files[name], media_type=media_type, headers=_HEADERS)
