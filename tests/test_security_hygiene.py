"""Proxy hygiene: no upstream choice by the client (SSRF), header filtering both ways,
request smuggling, backend cookies, and keys kept out of logs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from gateway.security import install_log_redaction, redact
from tests.gateway_harness import BackendSpec, config_text
from tests.test_security_support import (  # noqa: F401 - fixture
    ADMIN_KEY,
    ALPHA_KEY,
    CHAT,
    auth_toml,
    bearer,
    raw_exchange,
    secure_gateways,
    status_of,
)


class Trap:
    """A listener no request should ever reach: counts connections, answers nothing."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> Trap:
        async def accepted(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        self._server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


@pytest.fixture
async def trap() -> AsyncIterator[Trap]:
    listener = await Trap().start()
    yield listener
    await listener.stop()


@pytest.fixture
async def gateway(sim, secure_gateways):  # noqa: F811
    return await secure_gateways(config_text([BackendSpec("sim-a", sim.url)]), auth_toml())


# --- the client cannot choose where the gateway connects ---------------------------------

async def test_no_body_field_or_header_selects_the_upstream(sim, gateway, trap, http) -> None:
    there = f"127.0.0.1:{trap.port}"
    body = {**CHAT, "url": f"http://{there}/v1/chat/completions", "api_base": f"http://{there}",
            "base_url": f"http://{there}/v1", "endpoint": f"http://{there}", "host": there}
    headers = {**bearer(ALPHA_KEY), "Host": there, "X-Forwarded-Host": there,
               "X-Forwarded-Proto": "http", "X-Forwarded-Port": str(trap.port),
               "Forwarded": f"host={there};proto=http", "X-Original-URL": f"http://{there}/",
               "X-Rewrite-URL": f"http://{there}/", "X-Host": there,
               "X-Backend-Url": f"http://{there}"}
    async with http.post(f"{gateway.url}/v1/chat/completions", json=body,
                         headers=headers) as response:
        assert response.status == 200
    seen = sim.state.last_requests[-1]
    assert seen["headers"]["host"] == f"127.0.0.1:{sim.port}"
    assert seen["body"]["url"] == body["url"], "the body passes unchanged, only as data"
    assert trap.connections == 0


@pytest.mark.parametrize("start_line", [
    "POST http://127.0.0.1:{trap}/v1/chat/completions HTTP/1.1",  # absolute-form target
    "POST http://127.0.0.1:{trap}/v1/chat/completions HTTP/1.0",
])
async def test_absolute_form_targets_still_go_to_the_configured_backend(sim, gateway, trap,
                                                                        start_line) -> None:
    body = orjson.dumps(CHAT)
    request = (start_line.format(trap=trap.port).encode() + b"\r\n"
               b"Host: 127.0.0.1:%d\r\n" % trap.port +
               b"Authorization: Bearer " + ALPHA_KEY.encode() + b"\r\n"
               b"Content-Type: application/json\r\nConnection: close\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body) + body)
    raw = await raw_exchange(gateway.port, request)
    assert status_of(raw) == 200
    assert sim.state.requests_total == 1 and trap.connections == 0


async def test_connect_and_model_urls_reach_nothing(sim, gateway, trap, http) -> None:
    request = (b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % (trap.port, trap.port)
               + b"Authorization: Bearer " + ALPHA_KEY.encode() + b"\r\nConnection: close\r\n\r\n")
    raw = await raw_exchange(gateway.port, request, wait_s=1.0)
    assert status_of(raw) in (400, 404, 405), raw[:300]
    body = {**CHAT, "model": f"http://127.0.0.1:{trap.port}/v1"}
    async with http.post(f"{gateway.url}/v1/chat/completions", json=body,
                         headers=bearer(ALPHA_KEY)) as response:
        assert response.status == 404
    assert sim.state.requests_total == 0 and trap.connections == 0


# --- headers from the client ---------------------------------------------------------------

async def test_hop_by_hop_proxy_and_forwarded_headers_are_not_forwarded(sim, gateway,
                                                                        http) -> None:
    dropped = {"Keep-Alive": "timeout=5", "TE": "trailers", "Trailer": "X-T",
               "Upgrade": "foo/1", "Proxy-Authorization": "Basic cHJveHk6cHc=",
               "Proxy-Connection": "keep-alive", "Proxy-Anything": "1",
               "X-Forwarded-For": "10.0.0.1", "X-Forwarded-Host": "evil",
               "X-Forwarded-Proto": "https", "Forwarded": "for=10.0.0.1", "X-Real-IP": "10.0.0.1",
               "Cookie": "session=abc", "api-key": ALPHA_KEY, "X-Drop-Me": "named in Connection"}
    kept = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "X-Custom": "kept"}
    headers = {**dropped, **kept, **bearer(ALPHA_KEY), "Connection": "keep-alive, X-Drop-Me"}
    async with http.post(f"{gateway.url}/v1/chat/completions", json=CHAT,
                         headers=headers) as response:
        assert response.status == 200
    seen = sim.state.last_requests[-1]["headers"]
    for name in dropped:
        assert name.lower() not in seen, name
    assert "authorization" not in seen, "the client's key is for the gateway only"
    assert {name.lower(): value for name, value in kept.items()}.items() <= seen.items()


# --- request smuggling: the parser refuses ambiguous framing -------------------------------

SMUGGLED = b"0\r\n\r\nPOST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


@pytest.mark.parametrize("framing", [
    b"Content-Length: %d\r\nTransfer-Encoding: chunked" % len(SMUGGLED),
    b"Transfer-Encoding: chunked\r\nContent-Length: %d" % len(SMUGGLED),
    b"Content-Length: 5\r\nContent-Length: %d" % len(SMUGGLED),
    b"Transfer-Encoding: xchunked",
    b"Transfer-Encoding : chunked",
    b"Transfer-Encoding: chunked, identity",
    b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity",
    b"Content-Length: +%d" % len(SMUGGLED),
])
async def test_ambiguous_framing_is_refused(sim, gateway, framing) -> None:
    """aiohttp's parser (llhttp, strict) refuses these before the application runs;
    the test documents that and that nothing reaches a backend."""
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
               b"Authorization: Bearer " + ALPHA_KEY.encode() + b"\r\n" + framing +
               b"\r\n\r\n" + SMUGGLED)
    raw = await raw_exchange(gateway.port, request)
    assert status_of(raw) == 400, raw[:300]
    assert raw.count(b"HTTP/1.") == 1, "no second (smuggled) response"
    assert b"Traceback" not in raw
    await asyncio.sleep(0.05)
    assert sim.state.requests_total == 0


async def test_plain_chunked_bodies_still_work(sim, gateway) -> None:
    body = orjson.dumps(CHAT)
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
               b"Authorization: Bearer " + ALPHA_KEY.encode() + b"\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
    raw = await raw_exchange(gateway.port, request)
    assert status_of(raw) == 200 and sim.state.requests_total == 1


# --- headers from a backend ----------------------------------------------------------------

HOSTILE = {"Set-Cookie": "gw_session=stolen; Domain=gateway.example; Path=/",
           "Set-Cookie2": "x=1", "X-Powered-By": "evil", "Access-Control-Allow-Origin": "*",
           "Strict-Transport-Security": "max-age=0", "Location": "http://evil.example/",
           "Content-Security-Policy": "default-src *", "Refresh": "0; url=http://evil.example/"}


async def hostile_chat(request: web.Request) -> web.StreamResponse:
    """A backend that tries to set cookies and headers on the gateway's domain."""
    data = await request.json()
    status = int(request.headers.get("X-Hostile-Status", "200"))
    if status != 200:
        error = {"error": {"message": "no", "type": "x", "code": None}}
        return web.json_response(error, status=status, headers=HOSTILE)
    if data.get("stream"):
        response = web.StreamResponse(headers={**HOSTILE, "Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response
    answer = {"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    return web.json_response(answer, headers=HOSTILE)


@pytest.fixture
async def hostile_backend() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", hostile_chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


@pytest.mark.parametrize("stream,status,expected", [
    (False, 200, 200), (True, 200, 200), (False, 400, 400), (False, 503, 502)])
async def test_backends_cannot_set_cookies_or_headers(hostile_backend, secure_gateways,  # noqa: F811
                                                      http, stream, status, expected) -> None:
    gateway = await secure_gateways(
        config_text([BackendSpec("hostile", hostile_backend)], retry="max_attempts = 1"),
        auth_toml())
    headers = {**bearer(ALPHA_KEY), "X-Hostile-Status": str(status)}
    async with http.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "stream": stream},
                         headers=headers) as response:
        await response.read()
        assert response.status == expected
        for name in HOSTILE:
            assert name not in response.headers, name
        assert not response.cookies and not http.cookie_jar.filter_cookies(gateway.url)


# --- logs -----------------------------------------------------------------------------------

def test_redact_patterns() -> None:
    cases = {
        f"Authorization: Bearer {ALPHA_KEY}": "Authorization: Bearer [redacted]",
        f"b'Bearer {ALPHA_KEY}xyz...'": "b'Bearer [redacted]'",
        f"{{'api-key': '{ADMIN_KEY}'}}": "{'api-key': '[redacted]'}",
        f"api_key={ADMIN_KEY}&x=1": "api_key=[redacted]&x=1",
        "authorization: Basic dXNlcjpwdw==": "authorization: Basic [redacted]",
        f"key {ALPHA_KEY} leaked": "key sk-[redacted] leaked",
        "nothing secret here": "nothing secret here",
    }
    for text, expected in cases.items():
        assert redact(text) == expected


@pytest.fixture
def redacting() -> AsyncIterator[None]:
    undo = install_log_redaction()
    yield
    undo()


def _careless_routes(app: web.Application) -> None:
    """Code that logs what it should not: the redaction must catch it anyway."""
    log = logging.getLogger("gateway.careless")

    async def careless(request: web.Request) -> web.Response:
        log.warning("request headers: %s", dict(request.headers))
        raise RuntimeError(f"failed with {request.headers.get('Authorization')}")

    app.router.add_get("/v1/careless", careless)


async def test_logs_never_show_a_key(sim, secure_gateways, http, caplog,  # noqa: F811
                                     redacting) -> None:
    caplog.set_level(logging.DEBUG)
    gateway = await secure_gateways(config_text([BackendSpec("sim-a", sim.url)]), auth_toml(),
                                    _careless_routes)
    url = f"{gateway.url}/v1/chat/completions"
    for headers in (bearer(ALPHA_KEY), bearer(ALPHA_KEY + "-wrong"), {"api-key": ADMIN_KEY}):
        async with http.post(url, json=CHAT, headers=headers) as response:
            await response.read()
    async with http.get(f"{gateway.url}/admin/x", headers=bearer(ALPHA_KEY)) as response:
        assert response.status == 401
    async with http.get(f"{gateway.url}/v1/careless", headers=bearer(ALPHA_KEY)) as response:
        assert response.status == 500
        assert ALPHA_KEY not in await response.text()
    oversized = (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 + ALPHA_KEY.encode() + b"A" * 9000 + b"\r\n\r\n")
    assert status_of(await raw_exchange(gateway.port, oversized)) == 400
    text = caplog.text
    assert "request headers" in text and "RuntimeError" in text and "[redacted]" in text
    assert "Got more than" in text, "aiohttp logged the oversized header line (redacted)"
    for secret in (ALPHA_KEY, ADMIN_KEY, ALPHA_KEY[:20], ADMIN_KEY[:20]):
        assert secret not in text
