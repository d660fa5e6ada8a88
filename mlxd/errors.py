"""The one error tree shared by every mlxd process.

Each error carries an HTTP status and an OpenAI-style ``type``/``code`` so the gateway can render
it without a lookup table, and the worker can send it over the wire as an ``Error`` message.
"""

from __future__ import annotations


class MlxdError(Exception):
    """Base of every error mlxd raises on purpose."""

    status_code: int = 500
    type: str = "server_error"
    code: str = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_dict(self) -> dict[str, object]:
        """The OpenAI error object: ``{"message", "type", "param", "code"}``."""
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}


class InvalidRequest(MlxdError):
    status_code = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(MlxdError):
    status_code = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(MlxdError):
    """The caller may not use this endpoint (admin endpoints from a non-loopback address)."""

    status_code = 403
    type = "permission_error"
    code = "forbidden"


class ModelNotFound(MlxdError):
    status_code = 404
    type = "invalid_request_error"
    code = "model_not_found"


class RequestTimeout(MlxdError):
    status_code = 408
    type = "timeout_error"
    code = "timeout"


class Overloaded(MlxdError):
    """The queue is full: the client should retry after ``retry_after`` seconds."""

    status_code = 429
    type = "rate_limit_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after: float = 1.0, param: str | None = None):
        super().__init__(message, param=param)
        self.retry_after = retry_after


class RateLimited(Overloaded):
    """This API key used up its requests or tokens per minute; retry after ``retry_after`` s."""

    code = "rate_limit_exceeded"


class WorkerUnavailable(MlxdError):
    status_code = 503
    type = "server_error"
    code = "worker_unavailable"


class MemoryBudgetExceeded(WorkerUnavailable):
    """A model's worker does not fit in ``--max-memory`` and nothing can be unloaded for it."""

    code = "memory_budget_exceeded"


class OutOfMemory(WorkerUnavailable):
    """The device ran out of memory for a request, and again when it was computed once more
    with a smaller batch."""

    code = "out_of_memory"


class ShuttingDown(WorkerUnavailable):
    """The daemon is stopping and the request ran past ``--drain-timeout``: cut, with this
    error as its end."""

    code = "shutting_down"


class UpstreamError(MlxdError):
    """A remote backend failed us: connection refused, a 5xx, a broken stream, our credentials
    refused. The message names the backend, never its key."""

    status_code = 502
    type = "server_error"
    code = "upstream_error"


class UpstreamTimeout(MlxdError):
    """A remote backend sent nothing within its ``timeout``."""

    status_code = 504
    type = "timeout_error"
    code = "upstream_timeout"


class ProtocolError(MlxdError):
    status_code = 500
    type = "server_error"
    code = "protocol_error"


class InternalError(MlxdError):
    status_code = 500
    type = "server_error"
    code = "internal_error"


class ConfigError(MlxdError):
    """Bad configuration: the CLI prints it on one line and exits 2."""

    status_code = 500
    type = "server_error"
    code = "config_error"


_BY_CODE: dict[str, type[MlxdError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        Unauthorized,
        Forbidden,
        ModelNotFound,
        RequestTimeout,
        Overloaded,
        RateLimited,
        WorkerUnavailable,
        MemoryBudgetExceeded,
        OutOfMemory,
        ShuttingDown,
        UpstreamError,
        UpstreamTimeout,
        ProtocolError,
        InternalError,
        ConfigError,
    )
}


def error_from_code(
    code: str, message: str, param: str | None = None, retry_after: float | None = None
) -> MlxdError:
    """Rebuild an error received over the wire; unknown codes become ``InternalError``.
    ``retry_after`` (seconds) is kept for ``Overloaded`` and its subclasses."""
    cls = _BY_CODE.get(code, InternalError)
    if retry_after is not None and issubclass(cls, Overloaded):
        return cls(message, param=param, retry_after=retry_after)
    return cls(message, param=param)
