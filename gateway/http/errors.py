"""Error bodies in the OpenAI shape, and the one exception type handlers raise.

Every error a client sees is ``{"error": {"message", "type", "code"}}`` with
the status from DESIGN.md's contract. Handlers raise :class:`GatewayError`;
the middleware in :mod:`gateway.http.middleware` turns it (and anything
unexpected) into a response, so no stack trace ever reaches a client.
"""

from __future__ import annotations

import math

import orjson
from aiohttp import web

JSON = "application/json"


class GatewayError(Exception):
    """A failure with a status and a message meant for the client."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 code: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.retry_after = retry_after

    def to_response(self) -> web.Response:
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        return error_response(self.status, self.message, type=self.type, code=self.code,
                              headers=headers)


def error_body(message: str, *, type: str, code: str | None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "code": code}})


def error_response(status: int, message: str, *, type: str = "invalid_request_error",
                   code: str | None = None, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=error_body(message, type=type, code=code),
                        content_type=JSON, headers=headers)


def bad_request(message: str, code: str = "invalid_request") -> GatewayError:
    return GatewayError(400, message, code=code)
