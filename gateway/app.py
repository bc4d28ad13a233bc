"""Builds the gateway's aiohttp application and owns the lifecycles of its parts.

This module and :mod:`gateway.runtime` (the routing state it owns, which a
reload replaces) are the only places that wire the folders together:
configuration in; backends with their breakers, pools and the retry policy
(the runtime); the proxy, the admin API and the routes. Everything with a
connection or a task is started in ``on_startup`` and closed in
``on_cleanup``.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from opentelemetry.sdk.trace import SpanProcessor

from gateway.archive.service import ArchiveService
from gateway.config import GatewayConfig
from gateway.http.admin import add_admin_routes
from gateway.http.metrics_route import add_metrics_route
from gateway.http.middleware import edge_middleware
from gateway.http.proxy import Proxy
from gateway.http.routes import add_routes
from gateway.http.sessions_api import add_session_routes
from gateway.resilience.breaker import CircuitBreaker
from gateway.resilience.shared_breakers import BreakerLookup, SharedTrips
from gateway.runtime import RuntimeHolder
from gateway.security import install_security, reload_security, require_admin
from gateway.security.limits import server_limit_kwargs
from gateway.sessions import SessionService
from gateway.telemetry.metrics import build_metrics
from gateway.telemetry.request import Telemetry
from gateway.telemetry.tracing import setup_tracing

RUNTIME = web.AppKey("runtime", RuntimeHolder)
SHARED_TRIPS = web.AppKey("shared_trips", SharedTrips)
SESSIONS = web.AppKey("sessions", SessionService)
TELEMETRY = web.AppKey("telemetry", Telemetry)
ARCHIVE = web.AppKey("archive", ArchiveService)


def build_app(config: GatewayConfig, *,
              span_processor: SpanProcessor | None = None) -> web.Application:
    """The gateway for ``config``; ``span_processor`` receives spans too (tests)."""
    # The proxy reads bodies itself with its own limit (and a clear 413), so
    # aiohttp's own limit only has to stay out of the way.
    app = web.Application(middlewares=[edge_middleware],
                          client_max_size=config.server.max_body_bytes + 1,
                          handler_args=server_limit_kwargs(config.security.limits))
    # Keys, tenants and rate limits: a middleware inside the edge one (errors
    # keep the OpenAI shape and the request id), before any handler.
    install_security(app, config.security, source=config.source, host=config.server.host)
    holder = RuntimeHolder(config)
    holder.reload_hooks.append(lambda fresh: reload_security(app, fresh.security,
                                                             source=fresh.source))
    app[RUNTIME] = holder
    app.on_startup.append(_start_runtime)
    app.on_cleanup.append(_close_runtime)
    if config.breaker.shared:
        shared = SharedTrips(config.breaker.redis_url, _breaker_lookup(holder))
        holder.transition_hooks.append(shared.on_transition)
        app[SHARED_TRIPS] = shared
        app.on_startup.append(_start_shared_trips)
        app.on_cleanup.append(_close_shared_trips)
    telemetry = _telemetry(config, span_processor)
    app[TELEMETRY] = telemetry
    holder.transition_hooks.append(telemetry.metrics.on_breaker_transition)
    app.on_cleanup.append(_close_telemetry)
    sessions = _sessions(app, config, telemetry)
    if sessions is not None:
        app[SESSIONS] = sessions
        add_session_routes(app, sessions)
        app.on_startup.append(_start_sessions)
        app.on_cleanup.append(_close_sessions)  # before the archive's: its replay feeds it
    if ARCHIVE in app:
        app.on_startup.append(_start_archive)
        app.on_cleanup.append(_close_archive)
    archive = app.get(ARCHIVE)
    add_routes(app, Proxy(holder, sessions, telemetry), holder,
               degraded=(lambda: archive.degraded_reason) if archive is not None else None)
    add_metrics_route(app, telemetry.metrics, holder, sessions)
    add_admin_routes(app, holder, authorize=require_admin)
    return app


def _sessions(app: web.Application, config: GatewayConfig,
              telemetry: Telemetry) -> SessionService | None:
    """The session service, with the archive's outbox when the archive is on."""
    if not config.sessions.enabled:
        return None
    if not config.archive.enabled:
        return SessionService(config.sessions)
    archive = ArchiveService(config.archive, config.sessions, metrics=telemetry.metrics)
    app[ARCHIVE] = archive
    return SessionService(config.sessions, outbox=archive.outbox_policy)


def _telemetry(config: GatewayConfig, span_processor: SpanProcessor | None) -> Telemetry:
    metrics = build_metrics(config.telemetry.metrics, models=config.models,
                            backends=[b.name for b in config.backends])
    tracing = setup_tracing(config.telemetry, span_processor=span_processor)
    return Telemetry(config.telemetry, tracing, metrics)


async def _close_telemetry(app: web.Application) -> None:
    # The exporter's flush blocks: not on the event loop.
    await asyncio.get_running_loop().run_in_executor(None, app[TELEMETRY].tracing.shutdown)


def _breaker_lookup(holder: RuntimeHolder) -> BreakerLookup:
    def lookup(name: str) -> CircuitBreaker | None:
        backend = holder.current.backends.get(name)
        return backend.breaker if backend is not None else None
    return lookup


async def _start_runtime(app: web.Application) -> None:
    await app[RUNTIME].start()


async def _close_runtime(app: web.Application) -> None:
    await app[RUNTIME].close()


async def _start_sessions(app: web.Application) -> None:
    await app[SESSIONS].start()


async def _close_sessions(app: web.Application) -> None:
    await app[SESSIONS].close()


async def _start_archive(app: web.Application) -> None:
    await app[ARCHIVE].start()


async def _close_archive(app: web.Application) -> None:
    await app[ARCHIVE].close()


async def _start_shared_trips(app: web.Application) -> None:
    await app[SHARED_TRIPS].start()


async def _close_shared_trips(app: web.Application) -> None:
    await app[SHARED_TRIPS].close()
