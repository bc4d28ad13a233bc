"""Per-key rate limits: GCRA locally and in real Redis, 429s, sharing, and Redis outages."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from gateway.security import StreamUsage, charge_tokens, total_tokens
from gateway.security.gcra import REQUESTS, TOKENS, LocalLimiter, Rates
from gateway.security.keys import Principal
from gateway.security.ratelimit import RateLimiter
from gateway.security.settings import RateLimitConfig
from tests.gateway_harness import BackendSpec, Blackhole, closed_port, config_text
from tests.test_security_support import (  # noqa: F401 - fixture
    ALPHA_KEY,
    BETA,
    BETA_KEY,
    CHAT,
    KeySpec,
    auth_toml,
    bearer,
    secure_gateways,
)


class FakeClock:
    def __init__(self) -> None:
        self.ns = 1_000_000_000_000

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


def principal(name: str = "alpha", rpm: int | None = None, tpm: int | None = None) -> Principal:
    return Principal(name, "tenant", b"\0" * 32, Rates.per_minute(rpm, tpm))


# --- the algorithm, in this process -------------------------------------------------------

def test_local_requests_per_minute_burst_then_steady() -> None:
    clock = FakeClock()
    limiter, who = LocalLimiter(clock), principal(rpm=3)
    assert all(limiter.admit(who.name, who.rates).allowed for _ in range(3))
    refused = limiter.admit(who.name, who.rates)
    assert not refused.allowed and refused.limit == REQUESTS
    assert refused.retry_after_s == pytest.approx(20.0)
    clock.advance(19.9)
    assert not limiter.admit(who.name, who.rates).allowed
    clock.advance(0.1)
    assert limiter.admit(who.name, who.rates).allowed
    assert not limiter.admit(who.name, who.rates).allowed


def test_local_refusals_consume_nothing() -> None:
    clock = FakeClock()
    limiter, who = LocalLimiter(clock), principal(rpm=2)
    limiter.admit(who.name, who.rates)
    limiter.admit(who.name, who.rates)
    waits = [limiter.admit(who.name, who.rates).retry_after_s for _ in range(50)]
    assert waits == [30.0] * 50, "a refused request must not push the allowance further"


def test_local_tokens_are_checked_on_admission_and_charged_after() -> None:
    clock = FakeClock()
    limiter, who = LocalLimiter(clock), principal(rpm=2, tpm=600)  # 0.1 s per token
    assert limiter.admit(who.name, who.rates).allowed
    limiter.charge(who.name, who.rates, 700)  # 100 tokens of debt past the minute
    refused = limiter.admit(who.name, who.rates)
    assert not refused.allowed and refused.limit == TOKENS
    assert refused.retry_after_s == pytest.approx(10.1)
    for _ in range(20):
        assert not limiter.admit(who.name, who.rates).allowed  # consumes no request
    clock.advance(10.1)
    assert limiter.admit(who.name, who.rates).allowed, "the second request of the minute"
    third = limiter.admit(who.name, who.rates)
    assert not third.allowed and third.limit == REQUESTS


# --- the same algorithm in Redis, one atomic script --------------------------------------

@pytest.fixture
async def redis_limiter(redis_url):
    limiter = RateLimiter(RateLimitConfig(redis_url=redis_url, op_timeout_ms=200))
    await limiter.start()
    yield limiter
    await limiter.close()


async def test_redis_requests_tokens_and_refusals_that_consume_nothing(redis_limiter,
                                                                      redis_url) -> None:
    who = principal(rpm=3, tpm=600)
    assert [(await redis_limiter.admit(who)).allowed for _ in range(4)] == [True] * 3 + [False]
    refused = await redis_limiter.admit(who)
    assert refused.limit == REQUESTS and 19.0 < refused.retry_after_s <= 20.0
    client = aioredis.from_url(redis_url)
    try:
        key = "gateway:ratelimit:{alpha}:requests"
        before = await client.get(key)
        for _ in range(20):
            assert not (await redis_limiter.admit(who)).allowed
        assert await client.get(key) == before, "refusals leave the state untouched"
        assert 0 < await client.pttl(key) <= 61_000
        assert redis_limiter.redis_failures == 0 and redis_limiter.local_decisions == 0
    finally:
        await client.aclose()


async def test_redis_token_debt_refuses_until_paid(redis_limiter) -> None:
    who = principal(tpm=600)
    assert (await redis_limiter.admit(who)).allowed
    await redis_limiter.charge(who, 700)
    refused = await redis_limiter.admit(who)
    assert not refused.allowed and refused.limit == TOKENS
    assert 9.5 < refused.retry_after_s <= 10.1
    assert (await redis_limiter.admit(principal("beta", tpm=600))).allowed, "per key"


async def test_absurd_usage_is_capped(redis_limiter) -> None:
    who = principal(tpm=600)
    await redis_limiter.charge(who, 10**15)
    refused = await redis_limiter.admit(who)
    assert refused.retry_after_s <= 10 * 60, "at most ten minutes of allowance per answer"


# --- Redis unavailable: local decisions, never a stall -----------------------------------

@pytest.mark.parametrize("where", ["refused", "blackhole"])
async def test_unreachable_redis_falls_back_within_the_budget(where) -> None:
    hole = Blackhole() if where == "blackhole" else None
    port = hole.port if hole else closed_port()
    limiter = RateLimiter(RateLimitConfig(redis_url=f"redis://127.0.0.1:{port}",
                                          op_timeout_ms=50, recheck_ms=60_000))
    try:
        began = time.monotonic()
        await limiter.start()
        assert time.monotonic() - began < 1.2
        who = principal(rpm=2)
        timings, results = [], []
        for _ in range(3):
            began = time.monotonic()
            results.append((await limiter.admit(who)).allowed)
            timings.append(time.monotonic() - began)
        assert results == [True, True, False], "the local limiter enforces the same limit"
        assert max(timings) < 0.1, "no request waits for Redis while it is known down"
        assert limiter.redis_failures >= 1 and not limiter.shared
    finally:
        await limiter.close()
        if hole:
            hole.close()


async def test_redis_outage_and_recovery(redis_server, redis_url) -> None:
    limiter = RateLimiter(RateLimitConfig(redis_url=redis_url, op_timeout_ms=100,
                                          recheck_ms=200))
    await limiter.start()
    try:
        who = principal(rpm=1000)
        assert (await limiter.admit(who)).allowed and limiter.local_decisions == 0
        redis_server.kill()
        began = time.monotonic()
        for _ in range(20):
            assert (await limiter.admit(who)).allowed
        assert time.monotonic() - began < 0.5
        assert limiter.redis_failures >= 1 and limiter.local_decisions >= 20
        redis_server.start()
        await asyncio.sleep(0.3)  # past recheck_ms: the next call probes Redis
        await limiter.admit(who)
        local = limiter.local_decisions
        for _ in range(5):
            assert (await limiter.admit(who)).allowed
        assert limiter.shared and limiter.local_decisions == local, "shared again"
        client = aioredis.from_url(redis_url)
        try:
            assert await client.exists("gateway:ratelimit:{alpha}:requests")
        finally:
            await client.aclose()
    finally:
        await limiter.close()


# --- through real gateways ---------------------------------------------------------------

async def test_a_refused_request_is_a_429_with_retry_after(sim, secure_gateways, http,  # noqa: F811
                                                           redis_url) -> None:
    text = auth_toml([KeySpec("alpha", "tenant-a", ALPHA_KEY, rpm=2), BETA],
                     ratelimit=f'redis_url = "{redis_url}"')
    gateway = await secure_gateways(config_text([BackendSpec("sim-a", sim.url)]), text)
    url = f"{gateway.url}/v1/chat/completions"
    statuses = []
    for _ in range(3):
        async with http.post(url, json=CHAT, headers=bearer(ALPHA_KEY)) as response:
            statuses.append(response.status)
            last, headers = await response.json(), response.headers
    assert statuses == [200, 200, 429]
    assert last["error"]["code"] == "requests_per_minute"
    assert last["error"]["type"] == "rate_limit_error" and "alpha" in last["error"]["message"]
    assert 25 <= int(headers["Retry-After"]) <= 30 and headers["X-Request-Id"]
    assert sim.state.requests_total == 2, "a refused request never reaches a backend"
    async with http.post(url, json=CHAT, headers=bearer(BETA_KEY)) as response:
        assert response.status == 200, "limits are per key"


async def test_token_debt_through_the_gateway(sim, secure_gateways, http, redis_url) -> None:  # noqa: F811
    text = auth_toml([KeySpec("alpha", "tenant-a", ALPHA_KEY, tpm=600)],
                     ratelimit=f'redis_url = "{redis_url}"')
    gateway = await secure_gateways(config_text([BackendSpec("sim-a", sim.url)]), text)
    url = f"{gateway.url}/v1/chat/completions"
    async with http.post(url, json=CHAT, headers=bearer(ALPHA_KEY)) as response:
        assert response.status == 200
    state = gateway.state
    await state.limiter.charge(state.ring.authenticate(bearer(ALPHA_KEY)), 700)
    async with http.post(url, json=CHAT, headers=bearer(ALPHA_KEY)) as response:
        assert response.status == 429
        assert (await response.json())["error"]["code"] == "tokens_per_minute"
        assert 9 <= int(response.headers["Retry-After"]) <= 11


async def test_two_gateways_share_one_allowance(sim, secure_gateways, http, redis_url) -> None:  # noqa: F811
    text = auth_toml([KeySpec("alpha", "tenant-a", ALPHA_KEY, rpm=10),
                      KeySpec("beta", "tenant-b", BETA_KEY, tpm=600)],
                     ratelimit=f'redis_url = "{redis_url}"')
    backends = config_text([BackendSpec("sim-a", sim.url)])
    first, second = await secure_gateways(backends, text), await secure_gateways(backends, text)

    async def call(gateway) -> int:
        async with http.post(f"{gateway.url}/v1/chat/completions", json=CHAT,
                             headers=bearer(ALPHA_KEY)) as response:
            await response.read()
            return response.status

    statuses = await asyncio.gather(*(call(first if i % 2 else second) for i in range(24)))
    assert statuses.count(200) == 10 and statuses.count(429) == 14
    assert sim.state.requests_total == 10
    assert first.state.limiter.local_decisions == second.state.limiter.local_decisions == 0
    # tokens charged on one replica are owed on the other
    beta = first.state.ring.authenticate(bearer(BETA_KEY))
    assert (await second.state.limiter.admit(beta)).allowed
    await first.state.limiter.charge(beta, 700)
    other = await second.state.limiter.admit(beta)
    assert not other.allowed and other.limit == TOKENS


async def test_gateway_keeps_limiting_while_redis_is_down(sim, secure_gateways, http,  # noqa: F811
                                                          redis_server, redis_url) -> None:
    text = auth_toml([KeySpec("alpha", "tenant-a", ALPHA_KEY, rpm=3), BETA],
                     ratelimit=f'redis_url = "{redis_url}"\nop_timeout_ms = 50\n'
                               "recheck_ms = 60000")
    gateway = await secure_gateways(config_text([BackendSpec("sim-a", sim.url)]), text)
    url = f"{gateway.url}/v1/chat/completions"
    async with http.post(url, json=CHAT, headers=bearer(ALPHA_KEY)) as response:
        assert response.status == 200
    redis_server.kill()
    statuses, slowest = [], 0.0
    for _ in range(4):
        began = time.monotonic()
        async with http.post(url, json=CHAT, headers=bearer(ALPHA_KEY)) as response:
            statuses.append(response.status)
        slowest = max(slowest, time.monotonic() - began)
    assert statuses == [200, 200, 200, 429], "the local limiter holds the same per-key limit"
    assert slowest < 0.5
    async with http.get(f"{gateway.url}/healthz") as response:
        assert response.status == 200


def _charging_route(app: web.Application) -> None:
    """What the proxy does after an answer: read its usage, charge it to the key."""

    async def answer(request: web.Request) -> web.Response:
        body = orjson.dumps({"usage": {"prompt_tokens": 500, "completion_tokens": 200,
                                       "total_tokens": 700}})
        charge_tokens(request, total_tokens(body))
        return web.Response(body=body, content_type="application/json")

    app.router.add_post("/v1/test-usage", answer)


async def test_charge_tokens_after_an_answer(sim, secure_gateways, http, redis_url) -> None:  # noqa: F811
    text = auth_toml([KeySpec("alpha", "tenant-a", ALPHA_KEY, tpm=600), BETA],
                     ratelimit=f'redis_url = "{redis_url}"')
    gateway = await secure_gateways(config_text([BackendSpec("sim-a", sim.url)]), text,
                                    _charging_route)
    async with http.post(f"{gateway.url}/v1/test-usage", headers=bearer(ALPHA_KEY)) as response:
        assert response.status == 200
    async with http.post(f"{gateway.url}/v1/test-usage", headers=bearer(BETA_KEY)) as response:
        assert response.status == 200, "a key without a token limit is never charged"
    await asyncio.sleep(0.05)  # the charge runs in the background
    async with http.post(f"{gateway.url}/v1/test-usage", headers=bearer(ALPHA_KEY)) as response:
        assert response.status == 429
        assert (await response.json())["error"]["code"] == "tokens_per_minute"


def test_usage_is_read_from_json_and_from_stream_events() -> None:
    assert total_tokens(b'{"usage": {"total_tokens": 12}}') == 12
    for body in (b"{}", b'{"usage": null}', b'{"usage": {"total_tokens": -1}}',
                 b'{"usage": {"total_tokens": "9"}}', b'not json "total_tokens"', b"[1]"):
        assert total_tokens(body) is None
    usage = StreamUsage()
    usage.feed(b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n')
    assert usage.total is None
    usage.feed(b'data: {"choices": [], "usage": {"total_tokens": 31}}\n\ndata: [DONE]\n\n')
    usage.feed(b'data: {"broken "total_tokens"\n\n')
    assert usage.total == 31


async def test_concurrent_calls_share_one_pipelined_connection(redis_limiter) -> None:
    who = principal(rpm=50)
    decisions = await asyncio.gather(*(redis_limiter.admit(who) for _ in range(300)))
    assert sum(d.allowed for d in decisions) == 50
    assert redis_limiter.redis_failures == 0


async def test_flushed_scripts_are_reloaded(redis_limiter, redis_url) -> None:
    who = principal(rpm=5)
    assert (await redis_limiter.admit(who)).allowed
    client = aioredis.from_url(redis_url)
    try:
        await client.script_flush()
    finally:
        await client.aclose()
    assert [(await redis_limiter.admit(who)).allowed for _ in range(5)] == [True] * 4 + [False]
    assert redis_limiter.redis_failures == 0 and redis_limiter.local_decisions == 0


def test_the_pipelined_client_runs_on_uvloop(redis_url) -> None:
    """Production runs on uvloop, whose transports are not asyncio's classes."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> tuple[list[bool], int]:
        limiter = RateLimiter(RateLimitConfig(redis_url=redis_url, op_timeout_ms=200))
        await limiter.start()
        try:
            who = principal("uv", rpm=3)
            decisions = await asyncio.gather(*(limiter.admit(who) for _ in range(5)))
            return [d.allowed for d in decisions], limiter.redis_failures
        finally:
            await limiter.close()

    allowed, failures = uvloop.run(scenario())
    assert sorted(allowed) == [False, False, True, True, True] and failures == 0
