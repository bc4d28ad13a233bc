"""Request bodies, validated like vLLM does, and turned into a plan of what to answer.

The plan (``Generation``) holds the exact tokens to emit, so the handlers
only have to pace and encode them. All the rules about ``max_tokens``,
continuation of a final assistant message and echo live here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.sim.errors import NOT_FOUND, ApiError, bad_request
from gateway.sim.overrides import RequestOptions
from gateway.sim.text import answer_token_tuple, count_words

CHAT = "chat"
COMPLETION = "completion"


@dataclass(frozen=True)
class Generation:
    """What one chat or completions request will be answered with."""

    kind: str
    """``CHAT`` or ``COMPLETION``: decides the JSON shapes."""
    model: str
    """Echoed back as the request named it."""
    stream: bool
    include_usage: bool
    """Streaming only: send a usage chunk before ``[DONE]``."""
    tokens: tuple[str, ...]
    """The tokens to emit, in order."""
    finish_reason: str
    """``"stop"`` when the answer's last token is emitted, else ``"length"``."""
    prompt_tokens: int
    """Words in the prompt: the simulator's token count."""


def request_object(body: object) -> dict[str, Any]:
    """The body as a JSON object (anything else is a 400)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def requested_model(body: dict[str, Any], models: Sequence[str]) -> str:
    """The ``model`` field, which must be a string and, if ``models`` is set, one of them."""
    model = body.get("model")
    if not isinstance(model, str):
        raise bad_request("'model' must be a string")
    if models and model not in models:
        raise ApiError(404, f"the model {model!r} does not exist", NOT_FOUND)
    return model


def plan_chat(body: object, options: RequestOptions, models: Sequence[str]) -> Generation:
    """Validate a ``/v1/chat/completions`` body and decide its answer."""
    body = request_object(body)
    model = requested_model(body, models)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list")
    texts = [_message_text(index, message) for index, message in enumerate(messages)]
    start = _continuation_start(body, messages, texts)
    return _plan(CHAT, body, model, options, texts, start)


def plan_completion(body: object, options: RequestOptions, models: Sequence[str]) -> Generation:
    """Validate a ``/v1/completions`` body and decide its answer (one choice for all prompts)."""
    body = request_object(body)
    model = requested_model(body, models)
    texts = string_or_strings(body, "prompt")
    return _plan(COMPLETION, body, model, options, texts, 0)


def string_or_strings(body: dict[str, Any], name: str) -> list[str]:
    """A field that holds a string or a non-empty list of strings, as a list."""
    value = body.get(name)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return value
    raise bad_request(f"{name!r} must be a string or a non-empty list of strings")


def _message_text(index: int, message: object) -> str:
    """The text of one chat message: its string content, or its text parts joined by spaces."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise bad_request(f"messages[{index}] must be an object with a string 'role'")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    raise bad_request(f"messages[{index}].content must be a string, a list of parts or null")


def _continuation_start(body: dict[str, Any], messages: list[Any], texts: list[str]) -> int:
    """Index of the first token to emit: past the final assistant message when continuing it.

    Because token i depends only on (seed, i), continuing a message of k words
    yields exactly the rest of the uninterrupted answer.
    """
    flag = body.get("continue_final_message", False)
    if not isinstance(flag, bool):
        raise bad_request("'continue_final_message' must be a boolean")
    if not flag:
        return 0
    if messages[-1].get("role") != "assistant":
        raise bad_request("'continue_final_message' needs a final message with role 'assistant'")
    return count_words(texts[-1])


def _plan(
    kind: str,
    body: dict[str, Any],
    model: str,
    options: RequestOptions,
    texts: list[str],
    start: int,
) -> Generation:
    """The common part of chat and completions: limits, streaming flags, tokens."""
    stream, include_usage = _stream_flags(body)
    limit = _max_tokens(body)
    if options.echo:
        tokens: tuple[str, ...] = (orjson.dumps(texts).decode(),)
        finish_reason = "stop"
    else:
        total = options.tokens
        end = total if limit is None else min(total, start + limit)
        tokens = answer_token_tuple(options.seed, total)[start:end]
        finish_reason = "stop" if end >= total else "length"
    return Generation(
        kind=kind,
        model=model,
        stream=stream,
        include_usage=include_usage,
        tokens=tokens,
        finish_reason=finish_reason,
        prompt_tokens=sum(count_words(text) for text in texts),
    )


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    """``stream`` and ``stream_options.include_usage``, both checked to be booleans."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise bad_request("'stream_options' must be an object")
    include_usage = stream_options.get("include_usage") or False
    if not isinstance(include_usage, bool):
        raise bad_request("'stream_options.include_usage' must be a boolean")
    return stream, include_usage


def _max_tokens(body: dict[str, Any]) -> int | None:
    """The cap on emitted tokens; ``max_completion_tokens`` wins (as in vLLM)."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise bad_request(f"{name!r} must be an integer >= 1")
        return value
    return None
