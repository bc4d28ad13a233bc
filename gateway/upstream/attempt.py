"""One attempt: send the request to one backend and wait for its response to start.

An attempt ends in one of two ways. Either the backend answered 2xx and the
open response is handed back for relaying, or :class:`AttemptFailed` says what
went wrong in terms the retry policy can act on (:class:`Failure`). Nothing has
been written to the client at this point, so every failure here is still
retryable in principle.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy

from gateway.resilience.deadline import Deadline
from gateway.upstream.backend import Backend

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
                        deadline: Deadline, read: float = 0.0) -> aiohttp.ClientResponse:
    """POST ``body`` to ``backend`` and return its 2xx response, headers read, body not.

    The wait is bounded by the connect and read timeouts (on the backend's
    session, or ``read`` when given), by the request's deadline, and by the
    backend's own ``total``.
    The caller must ``release()`` the returned response.
    """
    budget = min(deadline.remaining(), backend.timeouts.total)
    if budget <= 0:
        raise AttemptFailed(backend, Failure.DEADLINE, "the request's deadline has passed")
    try:
        async with asyncio.timeout(budget):
            # A per-request timeout replaces the session's whole ClientTimeout,
            # and timeout=None would mean "no timeouts at all": pass one only
            # when it differs (see NOTES.md).
            timeout = backend.read_timeout(read)
            if timeout is None:
                response = await backend.session.post(backend.url(path), data=body,
                                                      headers=headers)
            else:
                response = await backend.session.post(backend.url(path), data=body,
                                                      headers=headers, timeout=timeout)
            if response.status < 300:
                return response
            error_body = await _read_error_body(response)
    except aiohttp.ConnectionTimeoutError:
        raise AttemptFailed(backend, Failure.CONNECT_TIMEOUT,
                            f"backend {backend.name}: no connection within "
                            f"{backend.timeouts.connect:g} s") from None
    except aiohttp.SocketTimeoutError:
        raise AttemptFailed(backend, Failure.READ_TIMEOUT,
                            f"backend {backend.name}: no response within "
                            f"{read or backend.timeouts.read:g} s (read timeout)") from None
    except TimeoutError:
        raise AttemptFailed(backend, Failure.DEADLINE,
                            f"backend {backend.name}: no response before the deadline") from None
    except aiohttp.ClientConnectorError as exc:
        raise AttemptFailed(backend, Failure.CONNECT_ERROR,
                            f"backend {backend.name}: cannot connect: {exc.os_error}") from None
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        raise AttemptFailed(backend, Failure.DISCONNECTED,
                            f"backend {backend.name}: connection lost: "
                            f"{exc or type(exc).__name__}") from None
    raise AttemptFailed(backend, Failure.HTTP_STATUS,
                        f"backend {backend.name} answered {response.status}",
                        status=response.status, body=error_body, headers=response.headers)


async def _read_error_body(response: aiohttp.ClientResponse) -> bytes:
    """Read a bounded error body, then return the connection to the pool."""
    chunks: list[bytes] = []
    size = 0
    try:
        while size < _MAX_ERROR_BODY and (chunk := await response.content.read(_MAX_ERROR_BODY)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        response.release()
    return b"".join(chunks)[:_MAX_ERROR_BODY]


async def read_whole_body(backend: Backend, response: aiohttp.ClientResponse,
                          stream_max: float) -> bytes:
    """Read a non-streaming response in full.

    Nothing has reached the client until this returns, so a failure here is
    still an attempt failure (retryable), not a broken response. Silence is
    bounded by ``read`` (the session's socket timeout); the whole read by
    ``stream_max`` when set.
    """
    try:
        async with asyncio.timeout(stream_max or None):
            return await response.read()
    except aiohttp.SocketTimeoutError:
        raise AttemptFailed(backend, Failure.READ_TIMEOUT,
                            f"backend {backend.name}: body stalled for more than "
                            f"{backend.timeouts.read:g} s (read timeout)") from None
    except TimeoutError:
        raise AttemptFailed(backend, Failure.READ_TIMEOUT,
                            f"backend {backend.name}: body took longer than "
                            f"stream_max = {stream_max:g} s") from None
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        raise AttemptFailed(backend, Failure.DISCONNECTED,
                            f"backend {backend.name}: connection lost while reading the body: "
                            f"{exc or type(exc).__name__}") from None
    finally:
        response.release()
