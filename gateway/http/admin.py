"""The admin API: breakers, effective configuration, reload.

``GET /admin/breakers`` shows every backend's breaker (state, tier, time to
half-open, window statistics); ``POST /admin/breakers/{backend}/open|close|reset``
acts on one; ``GET /admin/config`` shows the effective configuration (secrets
are never in it: a backend names the environment variable of its key);
``POST /admin/reload`` re-reads the configuration file and applies it without
dropping requests in flight (an invalid file is refused with its error, and
the running configuration stays).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.http.errors import GatewayError
from gateway.runtime import ReloadReport, RuntimeHolder

log = logging.getLogger("gateway.admin")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Authorize = Callable[[web.Request], None]
"""Raises GatewayError(401/403) when the request may not use the admin API."""


def _allow_all(_: web.Request) -> None:
    return None


async def reload_from_file(holder: RuntimeHolder) -> ReloadReport:
    """Re-read the running configuration's file and apply it; raises ConfigError.

    The ``[server]`` section (listen address, workers) cannot change in a
    running process and is kept as it is.
    """
    running = holder.current.config
    fresh = load_config(running.source)
    return await holder.reload(dataclasses.replace(fresh, server=running.server))


def add_admin_routes(app: web.Application, holder: RuntimeHolder,
                     authorize: Authorize = _allow_all) -> None:
    def guarded(handler: Handler) -> Handler:
        async def wrapper(request: web.Request) -> web.StreamResponse:
            authorize(request)
            return await handler(request)
        return wrapper

    async def breakers(_: web.Request) -> web.Response:
        backends = holder.current.backends.values()
        return web.json_response({"breakers": [b.breaker.snapshot() for b in backends]})

    async def breaker_action(request: web.Request) -> web.Response:
        name, action = request.match_info["backend"], request.match_info["action"]
        backend = holder.current.backends.get(name)
        if backend is None:
            raise GatewayError(404, f"no backend named '{name}'", code="backend_not_found")
        if action == "open":
            backend.breaker.force_open()
        elif action == "close":
            backend.breaker.force_close()
        elif action == "reset":
            backend.breaker.reset()
        else:
            raise GatewayError(404, f"unknown breaker action '{action}': use open, close "
                                    "or reset", code="unknown_action")
        log.warning("admin: breaker of %s: %s", name, action)
        return web.json_response(backend.breaker.snapshot())

    async def config(_: web.Request) -> web.Response:
        return web.json_response(effective_config(holder.current.config))

    async def reload(_: web.Request) -> web.Response:
        try:
            report = await reload_from_file(holder)
        except ConfigError as exc:
            raise GatewayError(400, f"reload refused, the running configuration stays: {exc}",
                               code="invalid_config") from None
        log.warning("admin: configuration reloaded: %s", report)
        return web.json_response({"status": "reloaded", **dataclasses.asdict(report)})

    app.router.add_get("/admin/breakers", guarded(breakers))
    app.router.add_post("/admin/breakers/{backend}/{action}", guarded(breaker_action))
    app.router.add_get("/admin/config", guarded(config))
    app.router.add_post("/admin/reload", guarded(reload))


def effective_config(config: GatewayConfig) -> dict:
    """The configuration as JSON. It holds no secret: keys are named, never stored."""
    return dataclasses.asdict(config)
