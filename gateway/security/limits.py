"""Input limits: what a request may contain beyond the body-size cap.

Two layers:

- the HTTP parser (aiohttp's, in C) bounds the request line, the size of each
  header field and the number of header fields before any handler runs;
  :func:`server_limit_kwargs` turns ``[limits]`` into its settings.
- :func:`check_inference_limits` bounds the parsed JSON of an inference body:
  nesting depth, number of messages, size of one message's content. It walks
  the structure level by level with an explicit list, never recursively, so a
  deep body cannot exhaust the stack (orjson itself refuses more than 1024
  levels while parsing, so the walk is bounded twice).
"""

from __future__ import annotations

from typing import Any

from gateway.http.errors import GatewayError
from gateway.security.settings import LimitsConfig


def server_limit_kwargs(limits: LimitsConfig) -> dict[str, int]:
    """Settings of aiohttp's request handler for the header limits.

    Pass them as ``web.Application(handler_args=...)`` or as keyword arguments
    of ``web.AppRunner``. A request over them is refused by the parser with a
    plain-text 400 before it reaches the application.
    """
    return {"max_headers": limits.max_headers,
            "max_field_size": limits.max_header_bytes,
            "max_line_size": limits.max_request_line_bytes}


def check_inference_limits(data: dict[str, Any], limits: LimitsConfig) -> None:
    """Refuse a parsed inference body over ``[limits]``; the message names the field.

    400 for a body nested too deep or with too many messages, 413 for a
    message whose content is too large.
    """
    _check_depth(data, limits.max_json_depth)
    messages = data.get("messages")
    if type(messages) is not list:
        return
    if len(messages) > limits.max_messages:
        raise GatewayError(400, f"'messages' has {len(messages)} items, more than the limit "
                                f"of {limits.max_messages}", code="too_many_messages")
    limit = limits.max_message_bytes
    for index, message in enumerate(messages):
        if type(message) is dict:
            size = _content_bytes(message.get("content"), limit)
            if size > limit:
                raise GatewayError(413, f"'messages[{index}].content' is larger than the "
                                        f"limit of {limit} bytes", code="message_too_large")


def _check_depth(data: Any, max_depth: int) -> None:
    """Nesting depth of objects and arrays; the top-level object is depth 1."""
    level: list[Any] = [data]
    depth = 1
    while level:
        if depth > max_depth:
            raise GatewayError(400, f"request body is nested more than {max_depth} levels "
                                    "deep", code="json_too_deep")
        deeper: list[Any] = []
        for node in level:
            for child in node.values() if type(node) is dict else node:
                kind = type(child)
                if kind is dict or kind is list:
                    deeper.append(child)
        level = deeper
        depth += 1


def _content_bytes(content: Any, limit: int) -> int:
    """UTF-8 bytes of the strings in a message's content; stops counting past ``limit``.

    Content is a string, or a list of parts whose strings (text, image data
    URLs) all count.
    """
    if type(content) is str:
        return _utf8_size(content, limit)
    total = 0
    pending = [content]
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind is str:
            total += _utf8_size(node, limit)
            if total > limit:
                return total
        elif kind is dict:
            pending.extend(node.values())
        elif kind is list:
            pending.extend(node)
    return total


def _utf8_size(text: str, limit: int) -> int:
    """Exact UTF-8 size; ``isascii`` is O(1) in CPython, so ASCII text costs nothing."""
    chars = len(text)
    if chars > limit or text.isascii():
        return chars  # a string of n characters is at least n bytes
    return len(text.encode("utf-8", "surrogatepass"))
