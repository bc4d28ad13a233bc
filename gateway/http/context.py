"""Per-request values that several layers read, kept on the aiohttp request."""

from __future__ import annotations

from aiohttp import web

TENANT_KEY = web.RequestKey("tenant", str)
"""The tenant the request's API key belongs to ("default" when auth is off)."""

DEFAULT_TENANT = "default"


def tenant_of(request: web.Request) -> str:
    return request.get(TENANT_KEY, DEFAULT_TENANT)
