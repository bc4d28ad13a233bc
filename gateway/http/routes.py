"""The public routes: inference endpoints, the model list, health and readiness."""

from __future__ import annotations

from collections.abc import Callable

import orjson
from aiohttp import web

from gateway.http.body import CHAT, COMPLETIONS, EMBEDDINGS, Endpoint
from gateway.http.errors import JSON
from gateway.http.middleware import Handler
from gateway.http.proxy import Proxy
from gateway.runtime import Runtime, RuntimeHolder


def add_routes(app: web.Application, proxy: Proxy, holder: RuntimeHolder, *,
               degraded: Callable[[], str | None] | None = None) -> None:
    """``degraded`` names a part that is behind (the archive) for ``/readyz`` to
    report without failing: requests are not affected."""
    def inference(endpoint: Endpoint) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await proxy.handle(request, endpoint)
        return handler

    models = _ModelList(holder)

    async def list_models(_: web.Request) -> web.Response:
        return web.Response(body=models.body(), content_type=JSON)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def readyz(_: web.Request) -> web.Response:
        if holder.draining:
            return _not_ready("shutting down")
        if not any(pool.any_admits() for pool in holder.current.pools.values()):
            return _not_ready("no backend admits a call")
        reason = degraded() if degraded is not None else None
        if reason is not None:
            return web.json_response({"status": "ready", "degraded": reason})
        return web.json_response({"status": "ready"})

    app.router.add_post(CHAT.path, inference(CHAT))
    app.router.add_post(COMPLETIONS.path, inference(COMPLETIONS))
    app.router.add_post(EMBEDDINGS.path, inference(EMBEDDINGS))
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


def _not_ready(reason: str) -> web.Response:
    return web.json_response({"status": "not ready", "reason": reason}, status=503)


class _ModelList:
    """The OpenAI model list, rebuilt only when a reload changed the runtime."""

    def __init__(self, holder: RuntimeHolder) -> None:
        self._holder = holder
        self._for: Runtime | None = None
        self._body = b""

    def body(self) -> bytes:
        runtime = self._holder.current
        if runtime is not self._for:
            data = [{"id": model, "object": "model", "created": 0, "owned_by": "gateway"}
                    for model in runtime.config.models]
            self._body = orjson.dumps({"object": "list", "data": data})
            self._for = runtime
        return self._body
