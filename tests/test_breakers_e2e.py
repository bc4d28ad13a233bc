"""Circuit breakers through the gateway: trip, no traffic while open, probes, recovery."""

from __future__ import annotations

import asyncio

import pytest

from gateway.resilience.breaker import BreakerState
from gateway.sim import SimSettings
from tests.gateway_harness import BackendSpec, config_text
from tests.resilience_helpers import breaker, eventually, inference_requests, post, set_faults


def _breaker_config(consecutive: int, open_seconds: float = 0.6) -> str:
    return ("[breaker]\nwindow_seconds = 60\nmin_calls = 2\nhalf_open_max_calls = 1\n"
            "half_open_successes = 2\n"
            f"[[breaker.tiers]]\nconsecutive_failures = {consecutive}\nerror_rate = 0.5\n"
            f"open_seconds = {open_seconds}\n")


@pytest.mark.parametrize("consecutive", [2, 4])
async def test_the_tier_table_decides_when_it_trips(sims, gateways, http, consecutive):
    sim = await sims(SimSettings(ttft_ms=150))
    await set_faults(http, sim, status=500)
    gateway = await gateways(config_text([BackendSpec("a", sim.url)], retry="max_attempts = 1",
                                         extra=_breaker_config(consecutive)))
    for _ in range(consecutive - 1):
        assert (await post(http, gateway))[0] == 502
    assert breaker(gateway, "a").state is BreakerState.CLOSED  # not one call earlier
    assert (await post(http, gateway))[0] == 502
    assert breaker(gateway, "a").state is BreakerState.OPEN  # exactly at the threshold

    # Open: the backend gets nothing; clients get 503 with the time to half-open.
    status, body, headers, _ = await post(http, gateway)
    assert status == 503 and body["error"]["code"] == "no_backend_available"
    assert headers["Retry-After"] == "1"
    assert inference_requests(sim) == consecutive

    # Half-open: exactly one probe among concurrent requests; two successes close it.
    await set_faults(http, sim, status=None)
    await eventually(lambda: breaker(gateway, "a").state is BreakerState.HALF_OPEN,
                     within=2.0, what="breaker half-open")
    statuses = sorted(r[0] for r in await asyncio.gather(*(post(http, gateway)
                                                           for _ in range(5))))
    assert statuses == [200, 503, 503, 503, 503]
    assert inference_requests(sim) == consecutive + 1
    assert breaker(gateway, "a").state is BreakerState.HALF_OPEN
    assert (await post(http, gateway))[0] == 200
    assert breaker(gateway, "a").state is BreakerState.CLOSED
    statuses = [r[0] for r in await asyncio.gather(*(post(http, gateway) for _ in range(5)))]
    assert statuses == [200] * 5


async def test_an_open_backend_gets_no_traffic_and_the_other_takes_it(sims, gateways, http):
    bad, good = await sims(), await sims()
    await set_faults(http, bad, status=503)
    gateway = await gateways(config_text(
        [BackendSpec("bad", bad.url), BackendSpec("good", good.url)],
        retry="base = 0.01\nbudget_min_concurrency = 10",
        extra=_breaker_config(3, open_seconds=60)))
    # Concurrent batches, so that "bad" keeps being picked while "good" is busy
    # (the pool steers away from a failing backend) until its breaker opens.
    for _ in range(10):
        results = await asyncio.gather(*(post(http, gateway) for _ in range(8)))
        assert {(r[0], r[2]["X-Gateway-Backend"]) for r in results} == {(200, "good")}
    assert breaker(gateway, "bad").state is BreakerState.OPEN
    seen_by_bad = inference_requests(bad)
    assert 3 <= seen_by_bad <= 3 + 8  # the third failure trips it; a batch may be in flight
    for _ in range(20):
        assert (await post(http, gateway))[0] == 200
    assert inference_requests(bad) == seen_by_bad


async def test_client_errors_and_429_do_not_trip(sims, gateways, http):
    sim = await sims()
    gateway = await gateways(config_text([BackendSpec("a", sim.url)], retry="max_attempts = 1",
                                         extra=_breaker_config(2)))
    for status in ("400", "404", "429", "422"):
        for _ in range(3):
            await post(http, gateway, headers={"X-Sim-Status": status})
    assert breaker(gateway, "a").state is BreakerState.CLOSED
