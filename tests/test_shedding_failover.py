"""Fallback models, all-open answers, and load shedding."""

from __future__ import annotations

import asyncio
import time

from gateway.sim import SimSettings
from tests.gateway_harness import BackendSpec, config_text
from tests.resilience_helpers import CHAT, breaker, eventually, inference_requests, post

BIG = {**CHAT, "model": "big"}


async def test_fallback_model_serves_when_the_model_has_no_admitting_backend(sims, gateways,
                                                                             http):
    big, small = await sims(), await sims()
    gateway = await gateways(config_text(
        [BackendSpec("big-1", big.url, ("big",)), BackendSpec("small-1", small.url, ("small",))],
        extra='[[models]]\nname = "big"\nfallbacks = ["small"]\n'))
    status, _, headers, _ = await post(http, gateway, BIG)
    assert (status, headers["X-Gateway-Model"], headers["X-Gateway-Backend"]) == (
        200, "big", "big-1")
    breaker(gateway, "big-1").force_open(30)
    status, _, headers, _ = await post(http, gateway, BIG)
    assert status == 200
    assert (headers["X-Gateway-Model"], headers["X-Gateway-Backend"]) == ("small", "small-1")
    assert small.state.last_requests[-1]["body"]["model"] == "small"
    assert inference_requests(big) == 1


async def test_all_open_is_503_with_retry_after_to_the_first_half_open(sims, gateways, http):
    a, b = await sims(), await sims()
    gateway = await gateways(config_text([BackendSpec("a", a.url), BackendSpec("b", b.url)]))
    breaker(gateway, "a").force_open(42)
    breaker(gateway, "b").force_open(7)
    status, body, headers, _ = await post(http, gateway)
    assert status == 503
    assert headers["Retry-After"] == "7"
    assert "circuit breakers are open" in body["error"]["message"]
    async with http.get(f"{gateway.url}/readyz") as response:
        assert response.status == 503


async def test_a_full_backend_sheds_within_the_queue_delay(sims, gateways, http):
    sim = await sims(SimSettings(ttft_ms=600))
    gateway = await gateways(config_text(
        [BackendSpec("a", sim.url, extra="max_concurrency = 1")],
        extra="[shedding]\nmax_queue = 8\nmax_queue_delay_ms = 50\n"))
    busy = asyncio.create_task(post(http, gateway))
    await eventually(lambda: inference_requests(sim) == 1, within=3.0, what="first request")
    start = time.monotonic()
    status, body, headers, _ = await post(http, gateway)
    elapsed = time.monotonic() - start
    assert status == 429 and headers["Retry-After"] == "1"
    assert body["error"]["code"] == "overloaded"
    assert 0.05 <= elapsed < 0.05 + 0.3
    assert (await busy)[0] == 200


async def test_a_short_wait_for_a_slot_succeeds(sims, gateways, http):
    sim = await sims(SimSettings(ttft_ms=150))
    gateway = await gateways(config_text(
        [BackendSpec("a", sim.url, extra="max_concurrency = 1")],
        extra="[shedding]\nmax_queue = 8\nmax_queue_delay_ms = 2000\n"))
    results = await asyncio.gather(*(post(http, gateway) for _ in range(3)))
    assert [r[0] for r in results] == [200, 200, 200]
    assert inference_requests(sim) == 3


async def test_the_queue_is_bounded(sims, gateways, http):
    sim = await sims(SimSettings(ttft_ms=400))
    gateway = await gateways(config_text(
        [BackendSpec("a", sim.url, extra="max_concurrency = 1")],
        extra="[shedding]\nmax_queue = 2\nmax_queue_delay_ms = 5000\n"))
    results = await asyncio.gather(*(post(http, gateway) for _ in range(6)))
    statuses = sorted(r[0] for r in results)
    # one in flight, two waiting (served one after the other), three shed at once
    assert statuses == [200, 200, 200, 429, 429, 429]

