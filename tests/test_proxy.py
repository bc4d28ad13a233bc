"""Proxying through a real gateway to a real simulator, compared with the direct path."""

from __future__ import annotations

import time

import orjson
import pytest

from gateway.app import RUNTIME
from gateway.sim import SimSettings, answer_text
from tests.gateway_harness import BackendSpec, config_text
from tests.sse_client import stream

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture
async def gateway(sim, gateways):
    return await gateways(config_text([BackendSpec("sim-a", sim.url)]))


async def test_non_streaming_answer_equals_direct(sim, gateway, http):
    async with http.post(f"{sim.url}/v1/chat/completions", json=CHAT) as direct:
        expected = await direct.json()
    async with http.post(f"{gateway.url}/v1/chat/completions", json=CHAT) as proxied:
        assert proxied.status == 200
        assert proxied.headers["X-Gateway-Backend"] == "sim-a"
        got = await proxied.json()
    assert got["choices"] == expected["choices"]
    assert got["usage"] == expected["usage"]
    assert got["choices"][0]["message"]["content"] == answer_text(0, 8)


@pytest.mark.parametrize("path,body,field", [
    ("/v1/completions", {"model": "sim-model", "prompt": "once upon"}, "choices"),
    ("/v1/embeddings", {"model": "sim-model", "input": ["a", "b"]}, "data"),
])
async def test_other_endpoints_equal_direct(sim, gateway, http, path, body, field):
    async with http.post(sim.url + path, json=body) as direct:
        expected = await direct.json()
    async with http.post(gateway.url + path, json=body) as proxied:
        assert proxied.status == 200
        got = await proxied.json()
    assert got[field] == expected[field]


async def test_streaming_text_equals_direct_and_ends_with_one_done(sim, gateway, http):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    direct = await stream(http, f"{sim.url}/v1/chat/completions", body)
    proxied = await stream(http, f"{gateway.url}/v1/chat/completions", body)
    assert proxied.status == 200
    assert proxied.headers["Content-Type"].startswith("text/event-stream")
    assert proxied.text() == direct.text() == answer_text(0, 8)
    assert proxied.done_count == 1 and proxied.events[-1] == b"[DONE]"
    assert proxied.errors == []
    assert proxied.payloads[-1]["usage"] == direct.payloads[-1]["usage"]


async def test_first_token_is_not_held_back(sims, gateways, http):
    sim = await sims(SimSettings(ttft_ms=300, itl_ms=400, tokens=3))
    gateway = await gateways(config_text([BackendSpec("slow", sim.url)]))
    record = await stream(http, f"{gateway.url}/v1/chat/completions", {**CHAT, "stream": True})
    assert record.text() == answer_text(0, 3)
    first, second = record.arrivals[0], record.arrivals[1]
    # The first token leaves the simulator at 0.3 s and the second at 0.7 s:
    # the client must see the first well before the second was even produced.
    assert 0.28 <= first < 0.6
    assert second - first >= 0.3


async def test_unknown_model_is_404_in_openai_shape(gateway, http):
    async with http.post(f"{gateway.url}/v1/chat/completions",
                         json={**CHAT, "model": "nope"}) as response:
        assert response.status == 404
        error = (await response.json())["error"]
    assert "nope" in error["message"] and error["code"] == "model_not_found"


@pytest.mark.parametrize("raw,needle", [
    (b"{not json", "not valid JSON"),
    (b"", "empty"),
    (b"[1, 2]", "JSON object"),
    (b'{"messages": [{"role": "user", "content": "x"}]}', "'model'"),
    (b'{"model": 7, "messages": []}', "'model'"),
    (b'{"model": "sim-model", "messages": []}', "'messages'"),
    (b'{"model": "sim-model", "messages": ["hi"]}', "'messages[0]'"),
    (b'{"model": "sim-model", "messages": [{"role": "user"}], "stream": "yes"}', "'stream'"),
])
async def test_bad_bodies_are_400_naming_the_field(gateway, http, raw, needle):
    async with http.post(f"{gateway.url}/v1/chat/completions", data=raw,
                         headers={"Content-Type": "application/json"}) as response:
        assert response.status == 400
        body = await response.json()
    assert needle in body["error"]["message"]
    assert "Traceback" not in body["error"]["message"]


async def test_body_over_the_limit_is_413(sim, gateways, http):
    gateway = await gateways(config_text([BackendSpec("a", sim.url)],
                                         server="max_body_bytes = 1000"))
    big = orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]})
    async with http.post(f"{gateway.url}/v1/chat/completions", data=big) as response:
        assert response.status == 413
        assert "1000" in (await response.json())["error"]["message"]

    async def chunks():
        yield big[:500]
        yield big[500:]

    # Without Content-Length (chunked), the limit holds while reading.
    async with http.post(f"{gateway.url}/v1/chat/completions", data=chunks()) as response:
        assert response.status == 413
    assert sim.state.requests_total == 0


async def test_unknown_route_and_method_are_openai_errors(gateway, http):
    async with http.get(f"{gateway.url}/v1/nothing") as response:
        assert response.status == 404
        assert "error" in await response.json()
        assert response.headers["X-Request-Id"]
    async with http.get(f"{gateway.url}/v1/chat/completions") as response:
        assert response.status == 405
        assert "error" in await response.json()


async def test_models_health_and_readiness(sim, gateways, http):
    gateway = await gateways(config_text([BackendSpec("a", sim.url, ("m1", "m2")),
                                          BackendSpec("b", sim.url, ("m2", "m3"))]))
    async with http.get(f"{gateway.url}/v1/models") as response:
        listing = await response.json()
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == ["m1", "m2", "m3"]
    async with http.get(f"{gateway.url}/healthz") as response:
        assert response.status == 200
    async with http.get(f"{gateway.url}/readyz") as response:
        assert response.status == 200


async def test_headers_hygiene(sim, gateways, http, monkeypatch):
    monkeypatch.setenv("TEST_BACKEND_KEY", "backend-secret")
    gateway = await gateways(config_text(
        [BackendSpec("a", sim.url, extra='api_key_env = "TEST_BACKEND_KEY"')]))
    client_headers = {
        "Authorization": "Bearer client-key", "X-Request-Id": "req-123",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "X-Forwarded-For": "6.6.6.6", "Connection": "keep-alive, X-Secret-Hop",
        "X-Secret-Hop": "hop", "Cookie": "session=1", "X-Custom": "kept",
    }
    async with http.post(f"{gateway.url}/v1/chat/completions", json=CHAT,
                         headers=client_headers) as response:
        assert response.status == 200
        assert response.headers["X-Request-Id"] == "req-123"
        assert "Set-Cookie" not in response.headers
    seen = sim.state.last_requests[-1]["headers"]
    assert seen["authorization"] == "Bearer backend-secret"
    assert seen["x-request-id"] == "req-123"
    assert seen["traceparent"] == client_headers["traceparent"]
    assert seen["x-custom"] == "kept"
    for name in ("x-forwarded-for", "x-secret-hop", "cookie"):
        assert name not in seen


async def test_malformed_request_id_is_replaced(gateway, http):
    async with http.post(f"{gateway.url}/v1/chat/completions", json=CHAT,
                         headers={"X-Request-Id": "bad id with spaces"}) as response:
        rid = response.headers["X-Request-Id"]
    assert rid != "bad id with spaces" and " " not in rid and rid


async def test_backend_error_status_is_passed_through(sim, gateway, http):
    async with http.post(f"{gateway.url}/v1/chat/completions", json=CHAT,
                         headers={"X-Sim-Status": "400"}) as response:
        assert response.status == 400
        body = await response.json()
    assert body["error"]["type"] == "sim_fault"


async def test_a_whole_answer_counts_once_in_the_backends_routing_health(sim, gateways, http):
    gateway = await gateways(config_text([BackendSpec("a", sim.url)]))
    backend = gateway.app[RUNTIME].current.pools["sim-model"].backends[0]
    backend.record_outcome(failed=True)  # recent failure ratio 0.2
    async with http.post(f"{gateway.url}/v1/chat/completions", json=CHAT) as response:
        assert response.status == 200
    # One success moves the ratio to 0.2 * 0.8 = 0.16 (it also fades with a 5 s
    # half-life, a little over the milliseconds this takes); two would give 0.128.
    assert 0.15 < backend.failure_ratio(time.monotonic()) <= 0.16
