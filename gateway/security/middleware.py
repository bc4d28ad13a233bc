"""The door: every request is authenticated and rate-limited before its handler runs.

:func:`install_security` adds one middleware to the application, after the
edge middleware (so refusals get the OpenAI error shape and an
``X-Request-Id``). What a request needs is decided by the route it matched,
not by its raw path: aiohttp resolves the route before middlewares run, so
``//admin/x``, ``/v1/../admin/x`` or ``/admin%2Fx`` cannot reach an admin
handler without the admin check, because the check follows the handler.

- ``/healthz``, ``/readyz``, ``/metrics``: public (probes and scrapers).
- ``/admin`` and below: the admin key, whatever ``[auth] enabled`` says.
- everything else, unknown paths included: a client key when auth is on;
  the key's tenant goes to ``request[TENANT_KEY]``, then its rate limits.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
from collections.abc import Mapping

from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.configreader import ConfigError
from gateway.http.context import TENANT_KEY
from gateway.http.errors import GatewayError
from gateway.http.middleware import Handler
from gateway.security.gcra import Decision
from gateway.security.keys import KeyRing, Principal
from gateway.security.ratelimit import RateLimiter
from gateway.security.settings import AuthConfig, SecurityConfig

log = logging.getLogger("gateway.security")

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
ADMIN_PREFIX = "/admin"
PRINCIPAL_KEY = web.RequestKey("principal", Principal)
"""The authenticated key of the request (absent when auth is off)."""
ADMIN_KEY = web.RequestKey("admin", bool)
"""True once the request presented the admin key."""
_LIMITER_KEY = web.RequestKey("rate_limiter", RateLimiter)


class RouteKind(enum.Enum):
    PUBLIC = "public"
    ADMIN = "admin"
    API = "api"


def route_kind(request: web.Request) -> RouteKind:
    """What the matched route requires; an unmatched path needs a client key (the admin
    key under ``/admin``)."""
    resource = request.match_info.route.resource
    if resource is None:  # 404/405: nothing runs, but /admin paths still need the admin key
        return RouteKind.ADMIN if _is_admin(request.path) else RouteKind.API
    canonical = resource.canonical
    if canonical in PUBLIC_PATHS:
        return RouteKind.PUBLIC
    return RouteKind.ADMIN if _is_admin(canonical) else RouteKind.API


def _is_admin(path: str) -> bool:
    return path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/")


class SecurityState:
    """The resolved keys and the rate limiter of one application."""

    __slots__ = ("auth_enabled", "config", "host", "limiter", "ring")

    def __init__(self, config: SecurityConfig, ring: KeyRing, host: str | None,
                 limiter: RateLimiter | None = None) -> None:
        self.config = config
        self.auth_enabled = config.auth.enabled
        self.ring = ring
        self.limiter = limiter or RateLimiter(config.ratelimit)
        self.host = host

    async def guard(self, request: web.Request, kind: RouteKind) -> web.Response | None:
        """None to let the request through, else the refusal to send."""
        try:
            if kind is RouteKind.ADMIN:
                self.ring.check_admin(request.headers)
                request[ADMIN_KEY] = True
                return None
            if not self.auth_enabled:
                return None
            principal = self.ring.authenticate(request.headers)
        except GatewayError as error:
            return _refusal(error)
        request[TENANT_KEY] = principal.tenant
        request[PRINCIPAL_KEY] = principal
        if principal.limited:
            request[_LIMITER_KEY] = self.limiter
            decision = await self.limiter.admit(principal)
            if not decision.allowed:
                return _rate_limited(principal, decision).to_response()
        return None


class _Holder:
    """Lets a second :func:`install_security` (a test's) replace the first one's state."""

    __slots__ = ("state",)

    def __init__(self, state: SecurityState) -> None:
        self.state = state

    async def start(self, _: web.Application) -> None:
        log_auth_status(self.state.config.auth, self.state.host)
        await self.state.limiter.start()

    async def close(self, _: web.Application) -> None:
        await self.state.limiter.close()


SECURITY = web.AppKey("security", _Holder)


def install_security(app: web.Application, config: SecurityConfig, *, source: str = "config",
                     host: str | None = None,
                     environ: Mapping[str, str] | None = None) -> None:
    """Add authentication and rate limits to ``app`` (before it starts).

    Reads the keys named by ``key_env`` now: a missing one is a ConfigError
    naming ``source`` and the key. ``host`` is the listen address, for the
    warning logged at start when auth is off. Calling it again on the same
    app replaces the configuration (tests use this over ``build_app``'s).
    """
    state = SecurityState(config, KeyRing.from_config(config.auth, source, environ), host)
    holder = app.get(SECURITY)
    if holder is not None:
        holder.state = state
        return
    holder = _Holder(state)
    app[SECURITY] = holder
    app.middlewares.append(_middleware(holder))
    app.on_startup.append(holder.start)
    app.on_cleanup.append(holder.close)


async def reload_security(app: web.Application, config: SecurityConfig, *,
                          source: str = "config") -> None:
    """Apply a new configuration to a running app (e.g. rotated keys), atomically.

    Keys are resolved first: a ConfigError leaves the running state as it is.
    The rate limiter (and its allowances) is kept when ``[ratelimit]`` did not
    change; otherwise the new one starts before the old one closes.
    """
    holder = app[SECURITY]
    old = holder.state
    ring = KeyRing.from_config(config.auth, source)
    state = SecurityState(config, ring, old.host,
                          old.limiter if config.ratelimit == old.config.ratelimit else None)
    if state.limiter is not old.limiter:
        await state.limiter.start()
    holder.state = state
    log_auth_status(config.auth, old.host)
    if state.limiter is not old.limiter:
        await old.limiter.close()


def _middleware(holder: _Holder) -> Middleware:
    @web.middleware
    async def security_middleware(request: web.Request,
                                  handler: Handler) -> web.StreamResponse:
        kind = route_kind(request)
        if kind is not RouteKind.PUBLIC:
            refused = await holder.state.guard(request, kind)
            if refused is not None:
                return refused
        return await handler(request)

    return security_middleware


def require_admin(request: web.Request) -> None:
    """Raise a 401/403 GatewayError unless the request carries the admin key.

    The middleware already checks every ``/admin`` route; call this in an
    admin handler as a second lock, or for an admin handler mounted elsewhere.
    """
    if request.get(ADMIN_KEY):
        return
    holder = request.config_dict.get(SECURITY)
    if holder is None:
        raise GatewayError(403, "the admin API is disabled: no admin key is configured",
                           code="admin_disabled")
    holder.state.ring.check_admin(request.headers)
    request[ADMIN_KEY] = True


def charge_tokens(request: web.Request, tokens: int | None) -> None:
    """Charge an answer's ``usage.total_tokens`` to the request's key, in the background.

    Call it once the answer is complete; it returns at once (the Redis call
    runs as a task, bounded by ``op_timeout_ms``) and does nothing when the
    key has no token limit, auth is off, or ``tokens`` is None.
    """
    limiter = request.get(_LIMITER_KEY)
    principal = request.get(PRINCIPAL_KEY)
    if limiter is None or principal is None or tokens is None:
        return
    limiter.charge_soon(principal, tokens)


def log_auth_status(auth: AuthConfig, host: str | None = None) -> None:
    """Say at start whether the door is locked; a warning when it is not."""
    if auth.enabled:
        log.info("authentication is on: %d API key(s), admin API %s", len(auth.keys),
                 "enabled" if auth.admin_configured else "disabled (no admin key)")
        return
    exposed = host is not None and not is_loopback(host)
    log.warning("authentication is disabled ([auth] enabled = false): every request is "
                "accepted as tenant \"default\"%s",
                f", and the gateway listens on {host}, beyond this machine" if exposed else "")


def check_auth_exposure(auth: AuthConfig, host: str, source: str = "config") -> None:
    """ConfigError when auth is off on a non-loopback address (the issue allows an open
    door only for the embedded local default). Optional: call it from parse_config."""
    if not auth.enabled and not is_loopback(host):
        raise ConfigError(f"{source}: auth.enabled: expected true when server.host is not a "
                          f"loopback address, got false (host {host})")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _refusal(error: GatewayError) -> web.Response:
    response = error.to_response()
    if error.status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="gateway"'
    return response


def _rate_limited(principal: Principal, decision: Decision) -> GatewayError:
    rates = principal.rates
    if decision.limit == "requests":
        what = f"{rates.requests_per_minute} requests per minute"
        code = "requests_per_minute"
    else:
        what = f"{rates.tokens_per_minute} tokens per minute"
        code = "tokens_per_minute"
    return GatewayError(429, f"rate limit of {what} reached for API key '{principal.name}'",
                        type="rate_limit_error", code=code, retry_after=decision.retry_after_s)
