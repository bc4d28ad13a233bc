"""Builds the gateway's aiohttp application and owns the lifecycles of its parts.

This is the only module that wires the folders together: configuration in,
backends with their breakers, pools, the retry policy, the proxy, the routes.
Everything with a connection or a task is started in ``on_startup`` and
closed in ``on_cleanup``.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from gateway.config import GatewayConfig
from gateway.http.middleware import edge_middleware
from gateway.http.proxy import Proxy
from gateway.http.routes import add_routes
from gateway.resilience.breaker import BreakerState, CircuitBreaker
from gateway.resilience.retry import RetryPolicy
from gateway.resilience.shared_breakers import SharedTrips
from gateway.upstream.backend import Backend
from gateway.upstream.dispatch import Dispatcher
from gateway.upstream.pool import build_pools

BACKENDS = web.AppKey("backends", list[Backend])
DISPATCHER = web.AppKey("dispatcher", Dispatcher)
SHARED_TRIPS = web.AppKey("shared_trips", SharedTrips)
TransitionHook = Callable[[str, BreakerState, BreakerState], None]


def build_app(config: GatewayConfig) -> web.Application:
    # The proxy reads bodies itself with its own limit (and a clear 413), so
    # aiohttp's own limit only has to stay out of the way.
    app = web.Application(middlewares=[edge_middleware],
                          client_max_size=config.server.max_body_bytes + 1)
    transition_hooks: list[TransitionHook] = []

    def on_transition(name: str, old: BreakerState, new: BreakerState) -> None:
        for hook in transition_hooks:
            hook(name, old, new)

    backends = [Backend(backend_config, CircuitBreaker(backend_config.name, config.breaker,
                                                       on_transition=on_transition))
                for backend_config in config.backends]
    pools = build_pools(backends, config.shedding)
    if config.breaker.shared:
        shared = SharedTrips(config.breaker.redis_url, {b.name: b.breaker for b in backends})
        transition_hooks.append(shared.on_transition)
        app[SHARED_TRIPS] = shared
        app.on_startup.append(_start_shared_trips)
        app.on_cleanup.append(_close_shared_trips)
    dispatcher = Dispatcher(RetryPolicy(config.retry))
    app[BACKENDS] = backends
    app[DISPATCHER] = dispatcher
    add_routes(app, Proxy(config, pools, dispatcher), pools)
    app.on_startup.append(_start_backends)
    app.on_cleanup.append(_close_backends)
    return app


async def _start_backends(app: web.Application) -> None:
    for backend in app[BACKENDS]:
        await backend.start()


async def _close_backends(app: web.Application) -> None:
    for backend in app[BACKENDS]:
        await backend.close()


async def _start_shared_trips(app: web.Application) -> None:
    await app[SHARED_TRIPS].start()


async def _close_shared_trips(app: web.Application) -> None:
    await app[SHARED_TRIPS].close()
