"""The OpenAI JSON shapes the simulator answers with.

Kept apart from the handlers so the wire format can be read (and compared
with OpenAI's or vLLM's) in one place, without timing and fault logic around it.
"""

from __future__ import annotations

import base64
import os
import struct
import time
from typing import Any

import orjson

from gateway.sim.text import count_words, embedding_vector
from gateway.sim.validation import CHAT, Generation

SSE_DONE = b"data: [DONE]\n\n"


def _new_id(kind: str) -> str:
    """A random id with OpenAI's prefix for the kind of answer."""
    prefix = "chatcmpl-" if kind == CHAT else "cmpl-"
    return prefix + os.urandom(12).hex()


def _usage(generation: Generation, completion_tokens: int) -> dict[str, int]:
    """OpenAI's usage object; the same in whole answers and in the stream's usage chunk."""
    prompt = generation.prompt_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }


def completion_body(generation: Generation) -> bytes:
    """The whole (non-streaming) answer of a chat or completions request."""
    text = "".join(generation.tokens)
    if generation.kind == CHAT:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": generation.finish_reason,
        }
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": generation.finish_reason}
        kind = "text_completion"
    return orjson.dumps(
        {
            "id": _new_id(generation.kind),
            "object": kind,
            "created": int(time.time()),
            "model": generation.model,
            "choices": [choice],
            "usage": _usage(generation, len(generation.tokens)),
        }
    )


class ChunkEncoder:
    """Encodes the events of one stream; every chunk carries the same id and timestamp."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        self.is_chat = generation.kind == CHAT
        self.header = {
            "id": _new_id(generation.kind),
            "object": "chat.completion.chunk" if self.is_chat else "text_completion",
            "created": int(time.time()),
            "model": generation.model,
        }

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        """One SSE event: ``data: <json>`` and the blank line that ends it."""
        return b"data: " + orjson.dumps({**self.header, "choices": choices, **extra}) + b"\n\n"

    def token(self, index: int, token: str) -> bytes:
        """The event of one token; a chat stream's first one also names the role."""
        if not self.is_chat:
            return self._event([{"index": 0, "text": token, "finish_reason": None}])
        delta = {"role": "assistant", "content": token} if index == 0 else {"content": token}
        return self._event([{"index": 0, "delta": delta, "finish_reason": None}])

    def finish(self) -> bytes:
        """The event after the last token: empty delta (or text) and the finish reason."""
        reason = self.generation.finish_reason
        if self.is_chat:
            return self._event([{"index": 0, "delta": {}, "finish_reason": reason}])
        return self._event([{"index": 0, "text": "", "finish_reason": reason}])

    def usage(self) -> bytes:
        """The ``include_usage`` event: no choices, only the token counts."""
        generation = self.generation
        return self._event([], usage=_usage(generation, len(generation.tokens)))


def models_body(models: tuple[str, ...], created: int) -> bytes:
    """``GET /v1/models`` in the OpenAI list shape."""
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "sim"} for name in models
    ]
    return orjson.dumps({"object": "list", "data": data})


def embeddings_body(model: str, inputs: list[str], encoding_format: str) -> bytes:
    """``POST /v1/embeddings``: one deterministic vector per input, as floats or base64."""
    data = []
    for index, text in enumerate(inputs):
        vector: list[float] | str = embedding_vector(text)
        if encoding_format == "base64":
            vector = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    words = sum(count_words(text) for text in inputs)
    usage = {"prompt_tokens": words, "total_tokens": words}
    return orjson.dumps({"object": "list", "data": data, "model": model, "usage": usage})
