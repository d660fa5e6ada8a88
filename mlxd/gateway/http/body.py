"""Reading request bodies under the ``--max-body-bytes`` limit, for every API endpoint."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away first"


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or a 413 as soon as it is known to exceed ``limit`` bytes."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise HTTPException(413, f"The request body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPException(413, f"The request body exceeds {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        # Nobody will read the answer; an HTTP error keeps uvicorn from logging a traceback.
        raise HTTPException(CLIENT_CLOSED_REQUEST, "The client closed the request") from None
    return b"".join(chunks)
