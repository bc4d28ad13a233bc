"""Retries against real simulators: which failures, how long, how many."""

from __future__ import annotations

import asyncio

from gateway.sim import SimSettings, answer_text
from tests.gateway_harness import BackendSpec, closed_port, config_text
from tests.resilience_helpers import CHAT, inference_requests, post, set_faults
from tests.sse_client import stream

SLACK = 0.4
# Breakers stay out of the way in these tests: they test retries alone.
NO_TRIP = "[breaker]\nmin_calls = 1000\n"


async def test_a_dead_backend_is_retried_on_another(sims, gateways, http):
    good = await sims()
    gateway = await gateways(config_text(
        [BackendSpec("dead", f"http://127.0.0.1:{closed_port()}"),
         BackendSpec("good", good.url)], retry="base = 0.01", extra=NO_TRIP))
    for _ in range(10):
        status, body, headers, _ = await post(http, gateway)
        assert status == 200
        assert headers["X-Gateway-Backend"] == "good"
        assert headers["X-Gateway-Attempts"] in ("1", "2")
        assert body["choices"][0]["message"]["content"] == answer_text(0, 8)


async def test_503_is_retried_with_the_backoff_formula(sims, gateways, http):
    sim = await sims()
    await set_faults(http, sim, status=503)
    gateway = await gateways(config_text(
        [BackendSpec("a", sim.url)],
        retry='max_attempts = 3\nbase = 0.2\njitter = "equal"', extra=NO_TRIP))
    status, body, headers, elapsed = await post(http, gateway)
    assert status == 502
    assert body["error"]["code"] == "upstream_503"
    assert "simulated failure" in body["error"]["message"]
    assert headers["X-Gateway-Attempts"] == "3"
    assert inference_requests(sim) == 3
    # equal jitter: waits in [0.1, 0.2] then [0.2, 0.4]
    assert 0.3 <= elapsed < 0.6 + SLACK


async def test_retry_after_replaces_the_backoff_and_is_capped(sims, gateways, http):
    sim = await sims()
    await set_faults(http, sim, status=429, retry_after=0.6)
    gateway = await gateways(config_text([BackendSpec("a", sim.url)],
                                         retry="max_attempts = 2\nbase = 0.01", extra=NO_TRIP))
    status, _, headers, elapsed = await post(http, gateway)
    assert status == 429  # still back-pressure after the retries: passed through
    assert headers["Retry-After"] == "0.6"
    assert 0.6 <= elapsed < 0.6 + SLACK

    capped = await gateways(config_text(
        [BackendSpec("a", sim.url)],
        retry="max_attempts = 2\nbase = 0.01\nretry_after_cap = 0.2", extra=NO_TRIP))
    await set_faults(http, sim, status=503, retry_after=30)
    status, _, _, elapsed = await post(http, capped)
    assert status == 502
    assert 0.2 <= elapsed < 0.2 + SLACK


async def test_client_errors_are_not_retried(sims, gateways, http):
    sim = await sims()
    gateway = await gateways(config_text([BackendSpec("a", sim.url)], extra=NO_TRIP))
    status, _, headers, _ = await post(http, gateway, headers={"X-Sim-Status": "400"})
    assert status == 400
    assert headers["X-Gateway-Attempts"] == "1"
    assert inference_requests(sim) == 1


async def test_500_is_retried_only_when_listed(sims, gateways, http):
    sim = await sims()
    await set_faults(http, sim, status=500)
    default = await gateways(config_text([BackendSpec("a", sim.url)], extra=NO_TRIP))
    status, _, headers, _ = await post(http, default)
    assert (status, headers["X-Gateway-Attempts"]) == (502, "1")
    listed = await gateways(config_text(
        [BackendSpec("a", sim.url)],
        retry="base = 0.01\nmax_attempts = 2\nretry_on = [500, 502, 503, 504]", extra=NO_TRIP))
    status, _, headers, _ = await post(http, listed)
    assert (status, headers["X-Gateway-Attempts"]) == (502, "2")


async def test_no_retry_after_the_first_byte(sims, gateways, http):
    first, second = await sims(), await sims()
    # Resuming a broken stream (max_resumes) is another feature: off here.
    gateway = await gateways(config_text(
        [BackendSpec("a", first.url), BackendSpec("b", second.url)],
        retry="base = 0.01", extra=NO_TRIP + "[streams]\nmax_resumes = 0\n"))
    record = await stream(http, f"{gateway.url}/v1/chat/completions", {**CHAT, "stream": True},
                          headers={"X-Sim-Drop-After": "2"})
    assert record.text() == answer_text(0, 2)
    assert [e["code"] for e in record.errors] == ["upstream_disconnected"]
    assert inference_requests(first) + inference_requests(second) == 1


async def test_the_deadline_holds_across_retries(sims, gateways, http):
    first, second = await sims(), await sims()
    for sim in (first, second):
        await set_faults(http, sim, hang_headers=True)
    gateway = await gateways(config_text(
        [BackendSpec("a", first.url), BackendSpec("b", second.url)],
        timeouts="read = 0.3\ntotal = 1.0", retry="max_attempts = 10\nbase = 0.05",
        extra=NO_TRIP))
    status, body, headers, elapsed = await post(http, gateway)
    assert status == 504
    assert 0.9 <= elapsed < 1.0 + SLACK
    assert int(headers["X-Gateway-Attempts"]) >= 2
    assert body["error"]["type"] == "timeout_error"


async def test_a_wait_past_the_deadline_is_not_taken(sims, gateways, http):
    sim = await sims()
    await set_faults(http, sim, status=503, retry_after=5)
    gateway = await gateways(config_text([BackendSpec("a", sim.url)],
                                         timeouts="total = 1.0", extra=NO_TRIP))
    status, body, _, elapsed = await post(http, gateway)
    assert status == 504 and body["error"]["code"] == "deadline"
    assert elapsed < 0.3  # answered at once: waiting 5 s could not fit in 1 s
    assert inference_requests(sim) == 1


async def test_retry_budget_bounds_upstream_load_under_total_failure(sims, gateways, http):
    sims_ = [await sims(SimSettings(ttft_ms=20)) for _ in range(2)]
    for sim in sims_:
        await set_faults(http, sim, status=503)
    gateway = await gateways(config_text(
        [BackendSpec("a", sims_[0].url), BackendSpec("b", sims_[1].url)],
        retry="max_attempts = 4\nbase = 0.02\ncap = 0.05\n"
              "budget_ratio = 0.2\nbudget_min_concurrency = 3", extra=NO_TRIP))
    clients, per_client = 50, 6

    async def client() -> None:
        for _ in range(per_client):
            status, _, _, _ = await post(http, gateway)
            assert status == 502

    await asyncio.gather(*(client() for _ in range(clients)))
    requests = clients * per_client
    attempts = sum(inference_requests(sim) for sim in sims_)
    # Without a budget this would be 4 x 300 = 1200 attempts. With retries in
    # flight at most a share r = 0.2 of the requests in flight, retries make at
    # most r / (1 - r) of the first attempts when attempts take equal time:
    # attempts <= requests / (1 - r), "about (1 + r)", plus the floor's slack.
    assert requests <= attempts <= requests / (1 - 0.2) + 3 * 4
