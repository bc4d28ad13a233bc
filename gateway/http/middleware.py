"""The outermost layer of every request: its id, and errors in the OpenAI shape."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.http import request_id
from gateway.http.errors import GatewayError, error_response

log = logging.getLogger("gateway.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]



@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give the request an id, and turn every failure into an OpenAI-shaped error.

    Unexpected exceptions are logged with their trace and answered with a
    generic 500: no stack trace ever reaches a client.
    """
    rid = request_id.request_id_for(request.headers.get(request_id.HEADER))
    request[request_id.KEY] = rid
    try:
        response = await handler(request)
    except GatewayError as exc:
        response = exc.to_response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = error_response(exc.status, _http_message(exc, request),
                                  code=exc.reason.lower().replace(" ", "_"))
    except Exception:
        log.exception("unhandled error", extra={"request_id": rid})
        response = error_response(500, "internal error in the gateway", type="server_error",
                                  code="internal_error")
    if not response.prepared:
        response.headers[request_id.HEADER] = rid
    return response


def _http_message(exc: web.HTTPException, request: web.Request) -> str:
    if exc.status == 404:
        return f"no route for {request.method} {request.path}"
    if exc.status == 405:
        return f"method {request.method} is not allowed on {request.path}"
    return exc.reason
