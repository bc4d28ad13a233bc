"""The session API: read and delete a server-side chat session.

``GET /v1/sessions/{id}`` returns the stored conversation, ``DELETE`` removes
it. Sessions belong to a tenant: until authentication (issue 7) sets one on
the request, every caller is the tenant ``default``. Another tenant's session
is simply not found (404), never "forbidden": its existence is not revealed.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.http.context import tenant_of
from gateway.http.errors import JSON, GatewayError
from gateway.sessions.binding import DEGRADED_HEADER
from gateway.sessions.service import SessionService

SESSION_PATH = "/v1/sessions/{id}"


def add_session_routes(app: web.Application, service: SessionService) -> None:
    """Add ``GET`` and ``DELETE /v1/sessions/{id}`` served by ``service``."""

    async def get_session(request: web.Request) -> web.Response:
        session_id = request.match_info["id"]
        view = await service.describe(tenant_of(request), session_id)
        if view is None:
            raise _not_found(session_id)
        body = {"id": view.session_id, "object": "session", "messages": view.messages,
                "turns": view.turns, "last_active_ts": view.last_active_ts}
        headers = {DEGRADED_HEADER: "degraded"} if view.degraded else None
        return web.Response(body=orjson.dumps(body), content_type=JSON, headers=headers)

    async def delete_session(request: web.Request) -> web.Response:
        session_id = request.match_info["id"]
        if not await service.delete(tenant_of(request), session_id):
            raise _not_found(session_id)
        return web.Response(status=204)

    app.router.add_get(SESSION_PATH, get_session)
    app.router.add_delete(SESSION_PATH, delete_session)


def _not_found(session_id: str) -> GatewayError:
    return GatewayError(404, f"session '{session_id}' does not exist",
                        code="session_not_found")
