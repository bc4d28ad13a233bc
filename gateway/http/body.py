"""Reading and validating the JSON body of an inference request.

The gateway needs only a few fields (``model``, ``stream`` and, per endpoint,
the field that carries the input) and forwards the body's bytes unchanged, so
it parses once with orjson and never re-serializes a body it did not change.
Anything malformed is a 400 that names the field; anything too big a 413.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from gateway.http.errors import GatewayError, bad_request

_READ_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An OpenAI-compatible inference endpoint and the input field it requires."""

    path: str
    input_field: str
    input_kind: str  # "messages": a non-empty list of objects; "any": present and not null
    streams: bool


CHAT = Endpoint("/v1/chat/completions", "messages", "messages", streams=True)
COMPLETIONS = Endpoint("/v1/completions", "prompt", "any", streams=True)
EMBEDDINGS = Endpoint("/v1/embeddings", "input", "any", streams=False)


@dataclass(frozen=True, slots=True)
class InferenceBody:
    raw: bytes
    data: dict[str, Any]
    model: str
    stream: bool


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The request body, refusing more than ``max_bytes`` before reading it all."""
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(_READ_CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(max_bytes: int) -> GatewayError:
    return GatewayError(413, f"request body is larger than the limit of {max_bytes} bytes",
                        code="body_too_large")


def parse_inference_body(raw: bytes, endpoint: Endpoint) -> InferenceBody:
    if not raw:
        raise bad_request("request body is empty: expected a JSON object", "invalid_json")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object", "invalid_json")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request(_field_message("model", "a non-empty string", model), "invalid_field")
    stream = data.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request(_field_message("stream", "true or false", stream), "invalid_field")
    if stream and not endpoint.streams:
        raise bad_request(f"'stream' is not supported on {endpoint.path}", "invalid_field")
    _check_input(data, endpoint)
    return InferenceBody(raw=raw, data=data, model=model, stream=stream)


def _check_input(data: dict[str, Any], endpoint: Endpoint) -> None:
    name = endpoint.input_field
    value = data.get(name)
    if endpoint.input_kind == "messages":
        if not isinstance(value, list) or not value:
            raise bad_request(_field_message(name, "a non-empty array of messages", value),
                              "invalid_field")
        for index, message in enumerate(value):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise bad_request(
                    f"'{name}[{index}]' must be an object with a string 'role'", "invalid_field")
    elif value is None:
        raise bad_request(f"'{name}' is required on {endpoint.path}", "invalid_field")


def _field_message(name: str, expected: str, got: Any) -> str:
    if got is None:
        return f"'{name}' is required and must be {expected}"
    return f"'{name}' must be {expected}, got {type(got).__name__}"
