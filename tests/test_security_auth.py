"""API keys, tenants and the admin key, through a real gateway in front of a real simulator."""

from __future__ import annotations

import hmac
import logging

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from gateway.configreader import ConfigError
from gateway.http import context
from gateway.security import keys as keys_module
from gateway.security import reload_security, require_admin
from gateway.sessions import binding
from tests.gateway_harness import BackendSpec, config_text
from tests.test_security_support import (  # noqa: F401 - fixture
    ADMIN_KEY,
    ALPHA,
    ALPHA_KEY,
    BETA_KEY,
    CHAT,
    KeySpec,
    auth_toml,
    bearer,
    raw_exchange,
    secure_gateways,
    security_from_text,
    status_of,
)


def _test_routes(app: web.Application) -> None:
    """Routes only these tests have: the tenant seen by handlers, an admin route."""

    async def whoami(request: web.Request) -> web.Response:
        return web.json_response({"tenant": context.tenant_of(request)})

    async def admin_ping(_: web.Request) -> web.Response:
        return web.json_response({"admin": True})

    async def internal(request: web.Request) -> web.Response:
        require_admin(request)
        return web.json_response({"admin": True})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="# metrics\n")

    sub = web.Application()
    sub.router.add_get("/stats", admin_ping)
    app.router.add_get("/v1/whoami", whoami)
    app.router.add_get("/admin/ping", admin_ping)
    app.router.add_get("/internal/admin-thing", internal)
    if not any(r.canonical == "/metrics" for r in app.router.resources()):
        app.router.add_get("/metrics", metrics)
    app.add_subapp("/admin/sub/", sub)


@pytest.fixture
async def gateway(sim, secure_gateways):  # noqa: F811
    return await secure_gateways(config_text([BackendSpec("sim-a", sim.url)]), auth_toml(),
                                 _test_routes)


async def _status_and_body(http: aiohttp.ClientSession, method: str, url: str | URL,
                           headers: dict[str, str] | None = None,
                           json: object = None) -> tuple[int, dict, aiohttp.typedefs.LooseHeaders]:
    async with http.request(method, url, headers=headers, json=json) as response:
        return response.status, await response.json(), response.headers


async def test_missing_key_is_a_401_in_the_openai_shape(sim, gateway, http) -> None:
    status, body, headers = await _status_and_body(http, "POST",
                                                   f"{gateway.url}/v1/chat/completions",
                                                   json=CHAT)
    assert status == 401
    assert body["error"]["code"] == "missing_api_key" and body["error"]["type"]
    assert "Bearer" in body["error"]["message"]
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert headers["X-Request-Id"]
    assert sim.state.requests_total == 0


@pytest.mark.parametrize("headers", [
    {"Authorization": "Bearer sk-not-a-key-of-this-gateway"},
    {"Authorization": f"Bearer {ALPHA_KEY}x"},
    {"Authorization": f"Basic {ALPHA_KEY}"},
    {"Authorization": ALPHA_KEY},
    {"Authorization": "Bearer "},
    {"api-key": "sk-not-a-key-of-this-gateway"},
    {"api-key": ADMIN_KEY},  # the admin key is not a client key
    {"Authorization": "Bearer sk-wrong", "api-key": ALPHA_KEY},  # Authorization decides
])
async def test_unknown_or_malformed_keys_are_refused(sim, gateway, http, headers) -> None:
    status, body, _ = await _status_and_body(http, "POST", f"{gateway.url}/v1/chat/completions",
                                             headers, CHAT)
    assert status == 401 and body["error"]["code"] in ("invalid_api_key", "missing_api_key")
    assert ALPHA_KEY not in str(body) and ADMIN_KEY not in str(body)
    assert sim.state.requests_total == 0


@pytest.mark.parametrize("headers", [
    {"Authorization": f"Bearer {ALPHA_KEY}"},
    {"Authorization": f"bearer   {ALPHA_KEY}  "},
    {"api-key": ALPHA_KEY},
])
async def test_bearer_and_api_key_headers_authenticate(sim, gateway, http, headers) -> None:
    status, body, _ = await _status_and_body(http, "POST", f"{gateway.url}/v1/chat/completions",
                                             headers, CHAT)
    assert status == 200 and body["choices"]
    forwarded = sim.state.last_requests[-1]["headers"]
    assert "api-key" not in forwarded
    assert ALPHA_KEY not in str(forwarded), "the client's key never reaches a backend"


async def test_the_decision_rests_on_a_constant_time_comparison(gateway, http,
                                                                monkeypatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr(keys_module.hmac, "compare_digest", spy)
    async with http.get(f"{gateway.url}/v1/models", headers=bearer(ALPHA_KEY)) as response:
        assert response.status == 200
    assert calls and all(len(a) == len(b) == 32 for a, b in calls)


async def test_each_key_maps_to_its_tenant(gateway, http) -> None:
    for key, tenant in ((ALPHA_KEY, "tenant-a"), (BETA_KEY, "tenant-b")):
        status, body, _ = await _status_and_body(http, "GET", f"{gateway.url}/v1/whoami",
                                                 bearer(key))
        assert (status, body) == (200, {"tenant": tenant})


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
async def test_probe_paths_need_no_key(gateway, http, path) -> None:
    async with http.get(gateway.url + path) as response:
        assert response.status == 200


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/models"),
    ("GET", "/v1/whoami"),
    ("GET", "/no/such/path"),  # 401 before 404: an unauthenticated caller learns nothing
    ("GET", "/v1/chat/completions"),  # 401 before 405
    ("GET", "/v1/sessions/abc"),
    ("POST", "/healthz"),  # only the probe route itself is public
])
async def test_everything_else_needs_a_key(gateway, http, method, path) -> None:
    status, body, _ = await _status_and_body(http, method, gateway.url + path)
    assert status == 401 and body["error"]["code"] == "missing_api_key"


@pytest.mark.parametrize("path", ["/admin/ping", "/admin/sub/stats"])
async def test_admin_routes_need_the_admin_key(gateway, http, path) -> None:
    url = gateway.url + path
    for headers in (None, bearer(ALPHA_KEY), bearer("adm-wrong"), {"api-key": BETA_KEY}):
        status, body, _ = await _status_and_body(http, "GET", url, headers)
        assert status == 401, (headers, body)
    for headers in (bearer(ADMIN_KEY), {"api-key": ADMIN_KEY}):
        status, body, _ = await _status_and_body(http, "GET", url, headers)
        assert (status, body) == (200, {"admin": True})


async def test_require_admin_refuses_client_keys_outside_admin_paths(gateway, http) -> None:
    """An admin handler mounted outside /admin: the client key passes the middleware,
    require_admin() refuses it (and the admin key is no client key): mount admin under /admin."""
    url = f"{gateway.url}/internal/admin-thing"
    for headers in (bearer(ALPHA_KEY), bearer(ADMIN_KEY)):
        status, _, _ = await _status_and_body(http, "GET", url, headers)
        assert status == 401


@pytest.mark.parametrize("target", [
    b"//admin/ping", b"/v1/../admin/ping", b"/admin%2Fping", b"/%61dmin/ping",
    b"/admin/./ping", b"/ADMIN/ping", b"http://127.0.0.1/admin/ping",
])
async def test_path_tricks_never_reach_an_admin_handler_with_a_client_key(gateway,
                                                                          target) -> None:
    request = (b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
               b"Authorization: Bearer " + ALPHA_KEY.encode() + b"\r\n\r\n")
    raw = await raw_exchange(gateway.port, request)
    assert status_of(raw) in (401, 404), raw[:200]
    assert b'"admin": true' not in raw and b'"admin":true' not in raw


async def test_admin_api_is_closed_without_an_admin_key(sim, secure_gateways, http) -> None:  # noqa: F811
    gateway = await secure_gateways(config_text([BackendSpec("sim-a", sim.url)]),
                                    auth_toml(admin=None), _test_routes)
    for headers in (None, bearer(ALPHA_KEY), bearer(ADMIN_KEY)):
        status, body, _ = await _status_and_body(http, "GET", f"{gateway.url}/admin/ping",
                                                 headers)
        assert status == 403 and body["error"]["code"] == "admin_disabled"


async def test_auth_off_accepts_everyone_as_default_and_warns(
        sim, secure_gateways, http, caplog) -> None:  # noqa: F811
    caplog.set_level(logging.INFO, logger="gateway.security")
    gateway = await secure_gateways(config_text([BackendSpec("sim-a", sim.url)]),
                                    auth_toml(enabled=False), _test_routes)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any('every request is accepted as tenant "default"' in r.getMessage()
               for r in warnings)
    status, body, _ = await _status_and_body(http, "GET", f"{gateway.url}/v1/whoami")
    assert (status, body) == (200, {"tenant": "default"})
    status, _, _ = await _status_and_body(http, "POST", f"{gateway.url}/v1/chat/completions",
                                          json=CHAT)
    assert status == 200
    status, _, _ = await _status_and_body(http, "GET", f"{gateway.url}/admin/ping")
    assert status == 401, "the admin API keeps its own key when client auth is off"


async def test_keys_from_the_environment(sim, secure_gateways, http,  # noqa: F811
                                         monkeypatch) -> None:
    monkeypatch.setenv("GW_TEST_CLIENT_KEY", "env-key-0123456789abcdef")
    spec = KeySpec("from-env", "tenant-env", "", env="GW_TEST_CLIENT_KEY")
    gateway = await secure_gateways(config_text([BackendSpec("sim-a", sim.url)]),
                                    auth_toml([spec, ALPHA]), _test_routes)
    status, body, _ = await _status_and_body(http, "GET", f"{gateway.url}/v1/whoami",
                                             bearer("env-key-0123456789abcdef"))
    assert (status, body) == (200, {"tenant": "tenant-env"})


def test_sessions_read_the_tenant_that_auth_sets() -> None:
    """A RequestKey compares by identity: the sessions code must use the very key auth sets."""
    assert binding.TENANT_KEY is context.TENANT_KEY


async def test_reload_rotates_keys_and_keeps_the_old_state_on_error(gateway, http,
                                                                    monkeypatch) -> None:
    url = f"{gateway.url}/v1/whoami"
    rotated = security_from_text(auth_toml([KeySpec("beta", "tenant-b", BETA_KEY)]))
    await reload_security(gateway.app, rotated, source="test.toml")
    async with http.get(url, headers=bearer(ALPHA_KEY)) as response:
        assert response.status == 401, "a key removed by a reload stops working at once"
    async with http.get(url, headers=bearer(BETA_KEY)) as response:
        assert response.status == 200
    monkeypatch.delenv("GW_TEST_MISSING_KEY", raising=False)
    broken = security_from_text(auth_toml([KeySpec("x", "t", "", env="GW_TEST_MISSING_KEY")]))
    with pytest.raises(ConfigError, match="GW_TEST_MISSING_KEY"):
        await reload_security(gateway.app, broken, source="test.toml")
    async with http.get(url, headers=bearer(BETA_KEY)) as response:
        assert response.status == 200, "a refused reload leaves the running keys"


@pytest.mark.parametrize("method,path", [
    ("GET", "/admin/breakers"), ("POST", "/admin/breakers/sim-a/open"),
    ("GET", "/admin/config"), ("POST", "/admin/reload"), ("GET", "/admin/nothing-here")])
async def test_the_admin_api_refuses_missing_wrong_and_client_keys(sim, gateway, http, method,
                                                                   path) -> None:
    for headers in (None, bearer("adm-wrong-key-0000000000"), bearer(ALPHA_KEY),
                    {"api-key": BETA_KEY}):
        status, body, _ = await _status_and_body(http, method, gateway.url + path, headers)
        assert status == 401, (headers, body)
    async with http.post(f"{gateway.url}/v1/chat/completions", json=CHAT,
                         headers=bearer(ALPHA_KEY)) as response:
        assert response.status == 200, "the breaker was not opened by a refused call"


async def test_the_admin_api_answers_the_admin_key(gateway, http) -> None:
    for path in ("/admin/breakers", "/admin/config"):
        async with http.get(gateway.url + path, headers=bearer(ADMIN_KEY)) as response:
            assert response.status == 200
            text = await response.text()
        for secret in (ALPHA_KEY, BETA_KEY, ADMIN_KEY):
            assert secret not in text
