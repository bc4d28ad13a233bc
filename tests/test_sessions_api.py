"""GET and DELETE /v1/sessions/{id} over real HTTP, per tenant, and with Redis down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from gateway.http.middleware import edge_middleware
from gateway.http.sessions_api import add_session_routes
from gateway.sessions.binding import TENANT_KEY
from gateway.sessions.service import SessionService
from gateway.sessions.settings import SessionsConfig
from tests.fixtures_sessions import chat_turn, redis_config, running
from tests.services import RedisServer, redis_command

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def tenant_from_header(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Stands in for authentication (issue 7): the test names the tenant."""
    if tenant := request.headers.get("X-Test-Tenant"):
        request[TENANT_KEY] = tenant
    return await handler(request)


async def serve(service: SessionService) -> tuple[web.AppRunner, str]:
    app = web.Application(middlewares=[edge_middleware, tenant_from_header])
    add_session_routes(app, service)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@pytest.fixture
async def api() -> AsyncIterator[tuple[SessionService, str]]:
    async with running(SessionsConfig()) as service:
        runner, url = await serve(service)
        yield service, url
        await runner.cleanup()


async def test_get_returns_the_stored_session(api: tuple[SessionService, str],
                                              http: aiohttp.ClientSession) -> None:
    service, url = api
    for n in range(2):
        await chat_turn(service, "abc", n)
    async with http.get(f"{url}/v1/sessions/abc") as response:
        assert response.status == 200 and "X-Request-Id" in response.headers
        assert "X-Gateway-Session" not in response.headers
        body = await response.json()
    assert body["id"] == "abc" and body["turns"] == 2 and body["last_active_ts"] > 0
    assert body["messages"] == [
        {"role": "user", "content": "q0"}, {"role": "assistant", "content": "a0"},
        {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]


async def test_unknown_session_is_404_in_openai_shape(api: tuple[SessionService, str],
                                                      http: aiohttp.ClientSession) -> None:
    _, url = api
    for method in ("GET", "DELETE"):
        async with http.request(method, f"{url}/v1/sessions/nope") as response:
            assert response.status == 404
            error = (await response.json())["error"]
        assert error["code"] == "session_not_found" and "nope" in error["message"]
        assert error["type"] == "invalid_request_error"


async def test_delete_is_204_then_404(api: tuple[SessionService, str],
                                      http: aiohttp.ClientSession) -> None:
    service, url = api
    await chat_turn(service, "bye", 0)
    async with http.delete(f"{url}/v1/sessions/bye") as response:
        assert response.status == 204
    async with http.get(f"{url}/v1/sessions/bye") as response:
        assert response.status == 404
    async with http.delete(f"{url}/v1/sessions/bye") as response:
        assert response.status == 404


async def test_a_bad_id_is_400(api: tuple[SessionService, str],
                               http: aiohttp.ClientSession) -> None:
    _, url = api
    async with http.get(f"{url}/v1/sessions/a%20b") as response:
        assert response.status == 400
        assert (await response.json())["error"]["code"] == "invalid_session_id"


async def test_another_tenant_sees_nothing_and_deletes_nothing(
        api: tuple[SessionService, str], http: aiohttp.ClientSession) -> None:
    service, url = api
    await chat_turn(service, "mine", 0, tenant="acme")
    globex = {"X-Test-Tenant": "globex"}
    async with http.get(f"{url}/v1/sessions/mine", headers=globex) as response:
        assert response.status == 404
    async with http.delete(f"{url}/v1/sessions/mine", headers=globex) as response:
        assert response.status == 404
    async with http.get(f"{url}/v1/sessions/mine", headers={"X-Test-Tenant": "acme"}) as ok:
        assert ok.status == 200


async def test_with_redis_down_known_sessions_are_degraded_and_others_503(
        redis_server: RedisServer, redis_url: str, http: aiohttp.ClientSession) -> None:
    async with running(redis_config(redis_url)) as service:
        runner, url = await serve(service)
        try:
            await chat_turn(service, "known", 0)
            redis_command(redis_server.port, "SAVE")
            redis_server.kill()
            async with http.get(f"{url}/v1/sessions/known") as response:
                assert response.status == 200
                assert response.headers["X-Gateway-Session"] == "degraded"
                assert (await response.json())["turns"] == 1
            async with http.get(f"{url}/v1/sessions/unknown") as response:
                assert response.status == 503 and response.headers["Retry-After"] == "1"
                assert (await response.json())["error"]["code"] == "session_store_unavailable"
        finally:
            await runner.cleanup()
            await asyncio.to_thread(redis_server.restart)
