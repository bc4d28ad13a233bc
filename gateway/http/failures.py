"""What the client sees when no backend produced a response.

The contract of DESIGN.md: a backend's own 4xx passes through; 502 when the
backends failed (with the last one's status and message); 504 when time ran
out; 503 when every breaker is open; 429 when every backend is full.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.http.errors import GatewayError
from gateway.http.headers import client_headers
from gateway.http.request_id import HEADER as REQUEST_ID
from gateway.upstream.attempt import AttemptFailed, Failure
from gateway.upstream.dispatch import NoBackendAdmits

BACKEND_HEADER = "X-Gateway-Backend"
MODEL_HEADER = "X-Gateway-Model"
ATTEMPTS_HEADER = "X-Gateway-Attempts"


def failure_response(failed: AttemptFailed, rid: str) -> web.Response:
    """What the client sees when no attempt produced a response.

    A backend's 4xx (a bad prompt; a 429 still standing after retries) is its
    answer to the client and passes through. Otherwise: 504 when time ran out
    (a timeout, or a wait the deadline could not hold), 502 when the backends
    failed, with the last backend's status and message.
    """
    status = failed.status if failed.failure is Failure.HTTP_STATUS else None
    if status is not None and status < 500:
        return _passed_through(failed, rid)
    stop_reason = failed.retry_record.stop_reason if failed.retry_record else None
    tries = f"{failed.attempts} attempt(s)" + _STOP_REASONS.get(stop_reason or "", "")
    if failed.failure.is_timeout or stop_reason == "deadline":
        code = "deadline" if stop_reason == "deadline" else failed.failure.value
        error = GatewayError(504, f"{failed.message} ({tries}, deadline reached)"
                             if stop_reason == "deadline" else f"{failed.message} ({tries})",
                             type="timeout_error", code=code)
    elif status is not None:
        error = GatewayError(502, f"{failed.message} after {tries}: "
                                  f"{_upstream_message(failed.body)}",
                             type="upstream_error", code=f"upstream_{status}")
    else:
        error = GatewayError(502, f"{failed.message} ({tries})", type="upstream_error",
                             code=failed.failure.value)
    response = error.to_response()
    response.headers[BACKEND_HEADER] = failed.backend.name
    response.headers[ATTEMPTS_HEADER] = str(failed.attempts)
    return response


_STOP_REASONS = {
    "budget": ", retry budget exhausted",
    "no_backend": ", no other backend admits a retry",
}


def _passed_through(failed: AttemptFailed, rid: str) -> web.Response:
    """A backend's own error answer (a 400 for a bad prompt, a 429), passed through."""
    headers = client_headers(failed.headers) if failed.headers is not None else {}
    headers[BACKEND_HEADER] = failed.backend.name
    headers[ATTEMPTS_HEADER] = str(failed.attempts)
    headers[REQUEST_ID] = rid
    return web.Response(status=failed.status or 502, body=failed.body, headers=headers)


def _upstream_message(body: bytes) -> str:
    """The backend's error message, when its body has the OpenAI shape."""
    try:
        message = orjson.loads(body)["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace") or "(empty body)"
    return str(message)


def nothing_admits(model: str, refusals: list[NoBackendAdmits]) -> GatewayError:
    """503 when every breaker is open (Retry-After: the first half-open), else 429 (shed)."""
    if refusals and all(r.breakers_open for r in refusals):
        wait = min(r.retry_after for r in refusals)
        return GatewayError(503, f"no backend of model '{model}' (or its fallbacks) admits a "
                                 "call: circuit breakers are open",
                            type="server_error", code="no_backend_available", retry_after=wait)
    return GatewayError(429, f"every backend of model '{model}' (and its fallbacks) is at "
                             "capacity", type="rate_limit_error", code="overloaded",
                        retry_after=1)
