"""Request ids: taken from the client when well-formed, generated otherwise."""

from __future__ import annotations

import itertools
import os

from aiohttp import web

HEADER = "X-Request-Id"
KEY = web.RequestKey("request_id", str)
"""Where the request's id is kept on the aiohttp request."""
_MAX_LENGTH = 128
_ALLOWED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:")

# A random per-process prefix plus a counter: unique across replicas and
# workers in practice, and far cheaper than uuid4 on the hot path.
_prefix = os.urandom(6).hex()
_counter = itertools.count(1)


def is_well_formed(value: str) -> bool:
    return 0 < len(value) <= _MAX_LENGTH and all(ch in _ALLOWED for ch in value)


def request_id_for(client_value: str | None) -> str:
    if client_value and is_well_formed(client_value):
        return client_value
    return f"{_prefix}{next(_counter):010x}"
