"""One attempt: send the request to one backend and wait for its response to start.

An attempt ends in one of two ways. Either the backend answered 2xx and the
open response is handed back for relaying, or :class:`AttemptFailed` says what
went wrong in terms the retry policy can act on (:class:`Failure`). Nothing has
been written to the client at this point, so every failure here is still
retryable in principle.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from multidict import CIMultiDictProxy

from gateway.resilience.deadline import Deadline
from gateway.upstream.backend import Backend
from gateway.upstream.http1 import (
    ConnectFailed,
    ConnectionBroken,
    ConnectTimedOut,
    DeadlinePassed,
    ReadTimedOut,
    UpstreamResponse,
)

_MAX_ERROR_BODY = 64 * 1024


class Failure(StrEnum):
    """Why an attempt failed; also the label used in metrics and logs."""

    CONNECT_ERROR = "connect_error"        # refused, unreachable, DNS
    CONNECT_TIMEOUT = "connect_timeout"    # no TCP connection within `connect`
    READ_TIMEOUT = "read_timeout"          # no byte within `read` before the response started
    DEADLINE = "deadline"                  # the request's `total` ran out
    DISCONNECTED = "disconnected"          # the backend closed or reset the connection
    HTTP_STATUS = "http_status"            # the backend answered with a non-2xx status

    @property
    def is_timeout(self) -> bool:
        return self in (Failure.CONNECT_TIMEOUT, Failure.READ_TIMEOUT, Failure.DEADLINE)


class AttemptFailed(Exception):
    """An attempt that produced no usable response."""

    def __init__(self, backend: Backend, failure: Failure, message: str, *,
                 status: int | None = None, body: bytes = b"",
                 headers: CIMultiDictProxy[str] | None = None) -> None:
        super().__init__(message)
        self.backend = backend
        self.failure = failure
        self.message = message
        self.status = status
        self.body = body
        self.headers = headers
        self.attempts = 1
        """Attempts the request made in all (set by the dispatcher)."""
        self.retry_record: Any = None
        """The request's :class:`~gateway.resilience.retry.RetryRecord` (set by the dispatcher)."""
        self.final = False
        """Set when no further attempt may be made, whatever the failure."""


async def open_response(backend: Backend, path: str, body: bytes, headers: dict[str, str],
                        deadline: Deadline, read: float = 0.0) -> UpstreamResponse:
    """POST ``body`` to ``backend`` and return its 2xx response, head read, body not.

    The wait is bounded by the connect and read timeouts (the backend's, or
    ``read`` when given), by the request's deadline, and by the backend's own
    ``total``. The caller must ``release()`` the returned response.
    """
    budget = min(deadline.remaining(), backend.timeouts.total)
    if budget <= 0:
        raise AttemptFailed(backend, Failure.DEADLINE, "the request's deadline has passed")
    read = read or backend.timeouts.read
    connections = backend.connections
    try:
        response = await connections.post(path, body, headers, read=read,
                                          deadline=connections.loop.time() + budget)
        if response.status < 300:
            return response
        error_body = await _read_error_body(response)
    except ConnectTimedOut:
        raise AttemptFailed(backend, Failure.CONNECT_TIMEOUT,
                            f"backend {backend.name}: no connection within "
                            f"{backend.timeouts.connect:g} s") from None
    except ReadTimedOut:
        raise AttemptFailed(backend, Failure.READ_TIMEOUT,
                            f"backend {backend.name}: no response within "
                            f"{read:g} s (read timeout)") from None
    except DeadlinePassed:
        raise AttemptFailed(backend, Failure.DEADLINE,
                            f"backend {backend.name}: no response before the deadline") from None
    except ConnectFailed as exc:
        raise AttemptFailed(backend, Failure.CONNECT_ERROR,
                            f"backend {backend.name}: cannot connect: {exc.os_error}") from None
    except ConnectionBroken as exc:
        raise AttemptFailed(backend, Failure.DISCONNECTED,
                            f"backend {backend.name}: connection lost: {exc}") from None
    raise AttemptFailed(backend, Failure.HTTP_STATUS,
                        f"backend {backend.name} answered {response.status}",
                        status=response.status, body=error_body, headers=response.headers)


async def _read_error_body(response: UpstreamResponse) -> bytes:
    """Read a bounded error body, then let the connection go (reused when complete)."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response:
            chunks.append(chunk)
            size += len(chunk)
            if size >= _MAX_ERROR_BODY:
                break
    finally:
        response.release()
    return b"".join(chunks)[:_MAX_ERROR_BODY]


async def read_whole_body(backend: Backend, response: UpstreamResponse,
                          stream_max: float) -> bytes:
    """Read a non-streaming response in full.

    Nothing has reached the client until this returns, so a failure here is
    still an attempt failure (retryable), not a broken response. Silence is
    bounded by the attempt's ``read``; the whole read by ``stream_max`` when set.
    """
    try:
        return await response.read(within=stream_max)
    except ReadTimedOut as exc:
        raise AttemptFailed(backend, Failure.READ_TIMEOUT,
                            f"backend {backend.name}: body stalled: {exc} (read timeout)") from None
    except DeadlinePassed:
        raise AttemptFailed(backend, Failure.READ_TIMEOUT,
                            f"backend {backend.name}: body took longer than "
                            f"stream_max = {stream_max:g} s") from None
    except ConnectionBroken as exc:
        raise AttemptFailed(backend, Failure.DISCONNECTED,
                            f"backend {backend.name}: connection lost while reading the body: "
                            f"{exc}") from None
    finally:
        response.release()
