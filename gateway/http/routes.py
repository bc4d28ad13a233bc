"""The public routes: inference endpoints, the model list, health and readiness."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from aiohttp import web

from gateway.http.body import CHAT, COMPLETIONS, EMBEDDINGS, Endpoint
from gateway.http.errors import JSON
from gateway.http.middleware import Handler
from gateway.http.proxy import Proxy
from gateway.upstream.pool import Pool


def add_routes(app: web.Application, proxy: Proxy, pools: Mapping[str, Pool]) -> None:
    def inference(endpoint: Endpoint) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await proxy.handle(request, endpoint)
        return handler

    models_body = _models_body(pools)

    async def list_models(_: web.Request) -> web.Response:
        return web.Response(body=models_body, content_type=JSON)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def readyz(_: web.Request) -> web.Response:
        ready = any(pool.any_admits() for pool in pools.values())
        if ready:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "not ready", "reason": "no backend admits a call"},
                                 status=503)

    app.router.add_post(CHAT.path, inference(CHAT))
    app.router.add_post(COMPLETIONS.path, inference(COMPLETIONS))
    app.router.add_post(EMBEDDINGS.path, inference(EMBEDDINGS))
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


def _models_body(pools: Mapping[str, Pool]) -> bytes:
    """The OpenAI model list; the set of models only changes with the config."""
    data = [{"id": model, "object": "model", "created": 0, "owned_by": "gateway"}
            for model in pools]
    return orjson.dumps({"object": "list", "data": data})
