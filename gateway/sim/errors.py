"""Errors answered in the OpenAI shape ``{"error": {"message", "type", "code"}}``.

Handlers raise ``ApiError`` wherever they find a problem and turn it into a
response in one place, so every error body looks the same. Like vLLM, the
``code`` is the HTTP status.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from aiohttp import web

BAD_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SIM_FAULT = "sim_fault"


class ApiError(Exception):
    """An error answer: HTTP status, message, OpenAI error type, extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        error_type: str = BAD_REQUEST,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.headers = dict(headers or {})

    def response(self) -> web.Response:
        """The HTTP response that carries this error."""
        body = {"error": {"message": self.message, "type": self.error_type, "code": self.status}}
        return web.Response(
            status=self.status,
            body=orjson.dumps(body),
            content_type="application/json",
            headers=self.headers,
        )


def bad_request(message: str) -> ApiError:
    """A 400: the request itself is wrong and retrying it elsewhere will not help."""
    return ApiError(400, message, BAD_REQUEST)
