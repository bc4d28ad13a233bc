"""What the backend sees: the stored history, trimmed, in front of the new messages.

The window keeps the newest history messages that fit both bounds (a number
of messages and an approximate number of tokens) together with the request's
own messages, which are never cut: the client sent them for this answer. The
system message is always kept. If the request carries a system message, it
replaces the stored one, here and in the stored session (an application that
changes its system prompt means the new one from now on). History never starts
with an assistant reply or a tool result whose user message was cut away.

Tokens are estimated (about four characters per token, plus a few per
message): the gateway has no tokenizer for every model, and the window only
has to keep prompts in the right range, not exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from gateway.sessions.state import SYSTEM, Message, drop_orphan_replies, split_system

_CHARS_PER_TOKEN = 4
_TOKENS_PER_MESSAGE = 4


@dataclass(frozen=True, slots=True)
class Window:
    max_messages: int = 64
    max_tokens: int = 8_000


def estimate_tokens(message: Message) -> int:
    """Approximate prompt tokens of one message."""
    content = message.get("content")
    if isinstance(content, str):
        size = len(content)
    elif content is None:
        size = 0
    else:  # a list of parts (text, images) or tool calls: count their JSON
        size = len(orjson.dumps(content))
    if "tool_calls" in message:
        size += len(orjson.dumps(message["tool_calls"]))
    return _TOKENS_PER_MESSAGE + -(-size // _CHARS_PER_TOKEN)


def split_request(messages: Sequence[Message]) -> tuple[Message | None, list[Message]]:
    """The request's system message (the first, if any) and its other messages."""
    system: Message | None = None
    rest: list[Message] = []
    for message in messages:
        if message.get("role") == SYSTEM:
            system = system or message
        else:
            rest.append(message)
    return system, rest


def build_prompt(history: Sequence[Message], request: Sequence[Message],
                 window: Window) -> list[Message]:
    """System message, then the history that fits, then the request's messages."""
    stored_system, past = split_system(history)
    request_system, new = split_request(request)
    system = request_system or stored_system
    fixed = ([system] if system is not None else []) + new
    messages_left = window.max_messages - len(fixed)
    tokens_left = window.max_tokens - sum(estimate_tokens(m) for m in fixed)
    start = len(past)
    while start > 0 and messages_left > 0:
        cost = estimate_tokens(past[start - 1])
        if cost > tokens_left:
            break
        tokens_left -= cost
        messages_left -= 1
        start -= 1
    kept = drop_orphan_replies(past[start:])
    head = [system] if system is not None else []
    return head + kept + new
