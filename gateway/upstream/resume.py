"""Continuing a broken stream on another backend, and splicing it in.

When a stream breaks after the client got tokens, the gateway asks another
backend of the same model to continue the same answer: the original request
with the text already sent as a trailing assistant message that the engine
continues (vLLM's ``continue_final_message: true`` with
``add_generation_prompt: false``; for ``/v1/completions``, the prompt with the
text appended). The continuation's events are rewritten to carry the
original stream's ``id``, ``model`` and ``created``, without a second
``role``, so the client sees one coherent completion.

This module parses events only when a stream actually breaks: the normal
path forwards bytes untouched.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

_MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


@dataclass(frozen=True, slots=True)
class Emitted:
    """What the client has received so far, read back from the forwarded events."""

    text: str
    chunks: int
    """Events that carried text: one per token in the engines' streams."""
    identity: dict[str, Any] | None
    """``id``, ``model``, ``created`` of the first event (None before any)."""
    finished: bool
    """A ``finish_reason`` was already sent: only ``[DONE]`` is missing."""
    single_choice: bool


def read_emitted(events: Iterable[bytes | bytearray]) -> Emitted:
    """What the client got, from the runs of events forwarded to it."""
    texts: list[str] = []
    chunks, identity, finished, single = 0, None, False, True
    for payload in _payloads(events):
        if identity is None:
            identity = {k: payload[k] for k in ("id", "model", "created") if k in payload}
        for choice in payload.get("choices") or ():
            if choice.get("index", 0) != 0:
                single = False
            piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            if piece:
                texts.append(piece)
                chunks += 1
            finished = finished or bool(choice.get("finish_reason"))
    return Emitted("".join(texts), chunks, identity, finished, single)


def _payloads(events: Iterable[bytes | bytearray]) -> list[dict[str, Any]]:
    payloads = []
    for run in events:
        for line in run.splitlines():
            if line.startswith(b"data:") and not line.endswith(b"[DONE]"):
                try:
                    payload = orjson.loads(line[5:])
                except orjson.JSONDecodeError:
                    continue
                if isinstance(payload, dict):
                    payloads.append(payload)
    return payloads


def continuation_body(data: dict[str, Any], path: str, emitted: Emitted) -> bytes | None:
    """The request that continues ``emitted``; None when it cannot be continued."""
    if not emitted.single_choice or data.get("n", 1) != 1:
        return None
    body = dict(data)
    for field in _MAX_TOKEN_FIELDS:
        limit = body.get(field)
        if isinstance(limit, int) and not isinstance(limit, bool):
            if limit - emitted.chunks <= 0:
                return None
            body[field] = limit - emitted.chunks
    if not emitted.text:
        return orjson.dumps(body)  # nothing sent yet: the same request, elsewhere
    if path == CHAT_PATH:
        body["messages"] = [*data["messages"], {"role": "assistant", "content": emitted.text}]
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    elif path == COMPLETIONS_PATH and isinstance(data.get("prompt"), str):
        body["prompt"] = data["prompt"] + emitted.text
    else:
        return None
    return orjson.dumps(body)


class Splice:
    """Rewrites a continuation's events into the original stream's."""

    def __init__(self, emitted: Emitted) -> None:
        self._identity = emitted.identity or {}
        self._chunks_before = emitted.chunks

    def rewrite(self, events: bytes) -> bytes:
        out: list[bytes] = []
        for line in events.split(b"\n"):
            if line.startswith(b"data:") and not line.endswith(b"[DONE]"):
                line = b"data: " + self._rewrite_payload(line[5:])
            out.append(line)
        return b"\n".join(out)

    def _rewrite_payload(self, raw: bytes) -> bytes:
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw.strip()
        if not isinstance(payload, dict):
            return raw.strip()
        payload.update(self._identity)
        for choice in payload.get("choices") or ():
            delta = choice.get("delta")
            if isinstance(delta, dict):
                delta.pop("role", None)
        usage = payload.get("usage")
        if isinstance(usage, dict) and self._chunks_before:
            # The continuation counted the text already sent as prompt.
            for field, sign in (("completion_tokens", 1), ("prompt_tokens", -1)):
                if isinstance(usage.get(field), int):
                    usage[field] = max(0, usage[field] + sign * self._chunks_before)
        return orjson.dumps(payload)
