"""Each timeout layer ends a request within its bound, with the right answer."""

from __future__ import annotations

import time

from gateway.sim import SimSettings, answer_text
from tests.gateway_harness import BackendSpec, Blackhole, closed_port, config_text
from tests.sse_client import stream

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}
SLACK = 0.5


def one_attempt(*args, **kwargs) -> str:
    """These tests look at one timeout layer at a time: no retries."""
    return config_text(*args, retry="max_attempts = 1", **kwargs)


async def _post(http, url, body=CHAT, headers=None):
    start = time.monotonic()
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as response:
        payload = await response.json()
        return response.status, payload, time.monotonic() - start


async def test_connection_refused_is_502_at_once(gateways, http):
    gateway = await gateways(one_attempt(
        [BackendSpec("dead", f"http://127.0.0.1:{closed_port()}")]))
    status, body, elapsed = await _post(http, gateway.url)
    assert status == 502
    assert body["error"]["code"] == "connect_error"
    assert elapsed < 1.0


async def test_connect_timeout_is_504_within_connect(gateways, http):
    blackhole = Blackhole()
    try:
        gateway = await gateways(one_attempt(
            [BackendSpec("hole", f"http://127.0.0.1:{blackhole.port}")],
            timeouts="connect = 0.5\ntotal = 10.0"))
        status, body, elapsed = await _post(http, gateway.url)
    finally:
        blackhole.close()
    assert status == 504
    assert body["error"]["code"] == "connect_timeout"
    assert 0.45 <= elapsed < 0.5 + SLACK


async def test_hang_before_headers_is_504_within_read(sim, gateways, http):
    gateway = await gateways(one_attempt([BackendSpec("a", sim.url)],
                                         timeouts="read = 0.5\ntotal = 10.0"))
    status, body, elapsed = await _post(http, gateway.url, headers={"X-Sim-Hang": "headers"})
    assert status == 504
    assert body["error"]["code"] == "read_timeout"
    assert 0.45 <= elapsed < 0.5 + SLACK


async def test_total_deadline_bounds_the_wait_for_headers(sim, gateways, http):
    gateway = await gateways(one_attempt([BackendSpec("a", sim.url)],
                                         timeouts="read = 10.0\ntotal = 0.6"))
    status, body, elapsed = await _post(http, gateway.url, headers={"X-Sim-Hang": "headers"})
    assert status == 504
    assert body["error"]["code"] == "deadline"
    assert 0.55 <= elapsed < 0.6 + SLACK


async def test_backend_total_override_caps_its_attempt(sim, gateways, http):
    gateway = await gateways(one_attempt(
        [BackendSpec("a", sim.url, extra="[backends.timeouts]\ntotal = 0.4")],
        timeouts="read = 10.0\ntotal = 5.0"))
    status, _, elapsed = await _post(http, gateway.url, headers={"X-Sim-Hang": "headers"})
    assert status == 504
    assert 0.35 <= elapsed < 0.4 + SLACK


async def test_stall_mid_stream_ends_with_an_error_event(sim, gateways, http):
    gateway = await gateways(one_attempt([BackendSpec("a", sim.url)],
                                         timeouts="read = 0.5\ntotal = 10.0"))
    record = await stream(http, f"{gateway.url}/v1/chat/completions",
                          {**CHAT, "stream": True}, headers={"X-Sim-Stall-After": "3"})
    assert record.status == 200
    assert record.text() == answer_text(0, 3)
    assert record.done_count == 0
    assert [e["code"] for e in record.errors] == ["stream_read_timeout"]
    assert record.ended_by == "eof"
    stall = record.arrivals[-1] - record.arrivals[-2]
    assert 0.45 <= stall < 0.5 + SLACK


async def test_dropped_stream_ends_with_an_error_event(sim, gateways, http):
    gateway = await gateways(one_attempt([BackendSpec("a", sim.url)]))
    record = await stream(http, f"{gateway.url}/v1/chat/completions",
                          {**CHAT, "stream": True}, headers={"X-Sim-Drop-After": "2"})
    assert record.text() == answer_text(0, 2)
    assert record.done_count == 0
    assert [e["code"] for e in record.errors] == ["upstream_disconnected"]


async def test_stream_max_ends_a_long_stream(sims, gateways, http):
    sim = await sims(SimSettings(itl_ms=100, tokens=50))
    gateway = await gateways(one_attempt([BackendSpec("a", sim.url)],
                                         timeouts="stream_max = 0.5"))
    record = await stream(http, f"{gateway.url}/v1/chat/completions", {**CHAT, "stream": True})
    assert record.done_count == 0
    assert [e["code"] for e in record.errors] == ["stream_max_exceeded"]
    assert 0.45 <= record.arrivals[-1] < 0.5 + SLACK


async def test_total_does_not_cut_a_started_stream(sims, gateways, http):
    sim = await sims(SimSettings(itl_ms=100, tokens=10))
    gateway = await gateways(one_attempt([BackendSpec("a", sim.url)],
                                         timeouts="total = 0.4\nread = 2.0"))
    record = await stream(http, f"{gateway.url}/v1/chat/completions", {**CHAT, "stream": True})
    assert record.errors == []
    assert record.done_count == 1
    assert record.text() == answer_text(0, 10)
    assert record.arrivals[-1] > 0.8
