"""Stream integrity: a stream that breaks mid-way continues on another backend.

The simulator continues deterministically (a continuation of the first k
tokens produces exactly the rest), so a spliced stream must carry exactly the
text of an uninterrupted one, under one id, with one final [DONE].
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from gateway.sim import SimSettings, answer_text
from tests.gateway_harness import BackendSpec, config_text
from tests.resilience_helpers import CHAT, eventually, inference_requests, set_faults
from tests.sse_client import stream

STREAM = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}


def _config(*sims, streams: str = "", retry: str = "") -> str:
    # The first simulator gets the first attempt (weights decide among idle
    # backends): it is the one each test breaks.
    weights = [1000.0, 1.0, 0.001]
    specs = [BackendSpec(f"s{i}", sim.url, extra=f"weight = {weights[i]}")
             for i, sim in enumerate(sims)]
    return config_text(specs, timeouts="read = 5.0", retry=retry,
                       extra="[streams]\n" + streams)


def _assert_coherent(record, tokens: int, resumes: int) -> None:
    assert record.status == 200
    assert record.errors == []
    assert record.text() == answer_text(0, tokens)
    assert record.done_count == 1 and record.events[-1] == b"[DONE]"
    payloads = [p for p in record.payloads if "id" in p]
    assert len({p["id"] for p in payloads}) == 1
    assert {p["model"] for p in payloads} == {"sim-model"}
    roles = [c["delta"]["role"] for p in payloads for c in p["choices"]
             if "role" in c.get("delta", {})]
    assert roles == ["assistant"]
    assert record.comments == ([f"gateway-resumes={resumes}"] if resumes else [])


@pytest.mark.parametrize("k", [1, 10, 100])
async def test_a_backend_killed_after_k_tokens_is_continued(sims, gateways, http, k):
    a, b = await sims(SimSettings(tokens=150)), await sims(SimSettings(tokens=150))
    await set_faults(http, a, drop_after=k)
    gateway = await gateways(_config(a, b))
    record = await stream(http, f"{gateway.url}/v1/chat/completions", STREAM)
    _assert_coherent(record, 150, resumes=1)
    continuation = b.state.last_requests[-1]["body"]
    assert continuation["continue_final_message"] is True
    assert continuation["add_generation_prompt"] is False
    assert continuation["messages"][-1] == {"role": "assistant", "content": answer_text(0, k)}
    usage = record.payloads[-1]["usage"]
    assert usage["completion_tokens"] == 150


async def test_a_stall_is_continued_within_the_read_bound(sims, gateways, http):
    a, b = await sims(SimSettings(tokens=30)), await sims(SimSettings(tokens=30))
    await set_faults(http, a, stall_after=10)
    gateway = await gateways(_config(a, b, streams="read = 0.5\n"))
    start = time.monotonic()
    record = await stream(http, f"{gateway.url}/v1/chat/completions", STREAM)
    _assert_coherent(record, 30, resumes=1)
    gap = record.arrivals[10] - record.arrivals[9]
    assert 0.45 <= gap < 0.5 + 0.5
    assert time.monotonic() - start < 2.0


async def test_a_slow_drip_below_the_minimum_rate_is_continued(sims, gateways, http):
    a, b = await sims(SimSettings(tokens=40)), await sims(SimSettings(tokens=40))
    await set_faults(http, a, itl_ms=250)
    gateway = await gateways(_config(
        a, b, streams="min_tokens_per_second = 10\nmin_rate_after_tokens = 3\n"))
    start = time.monotonic()
    record = await stream(http, f"{gateway.url}/v1/chat/completions", STREAM)
    elapsed = time.monotonic() - start
    _assert_coherent(record, 40, resumes=1)
    # measured from the 3rd token (0.5 s) for at least 1 s: cut near 1.5 s, not after 10 s
    assert 1.2 <= elapsed < 2.5


async def test_two_breaks_in_one_request(sims, gateways, http):
    a, b, c = [await sims(SimSettings(tokens=30)) for _ in range(3)]
    await set_faults(http, a, drop_after=5)
    await set_faults(http, b, drop_after=5)
    gateway = await gateways(_config(a, b, c))
    record = await stream(http, f"{gateway.url}/v1/chat/completions", STREAM)
    _assert_coherent(record, 30, resumes=2)
    assert c.state.last_requests[-1]["body"]["messages"][-1]["content"] == answer_text(0, 10)


async def test_more_breaks_than_max_resumes_end_with_an_error(sims, gateways, http):
    a, b, c = [await sims(SimSettings(tokens=30)) for _ in range(3)]
    for sim in (a, b, c):
        await set_faults(http, sim, drop_after=5)
    gateway = await gateways(_config(a, b, c, streams="max_resumes = 1\n"))
    record = await stream(http, f"{gateway.url}/v1/chat/completions", STREAM)
    assert record.text() == answer_text(0, 10)
    assert record.done_count == 0
    assert [e["code"] for e in record.errors] == ["upstream_disconnected"]
    assert inference_requests(c) == 0


async def test_no_other_backend_ends_with_an_error_event(sims, gateways, http):
    a = await sims(SimSettings(tokens=30))
    await set_faults(http, a, drop_after=5)
    gateway = await gateways(_config(a))
    record = await stream(http, f"{gateway.url}/v1/chat/completions", STREAM)
    assert record.text() == answer_text(0, 5)
    assert record.done_count == 0
    assert [e["code"] for e in record.errors] == ["upstream_disconnected"]
    assert inference_requests(a) == 1


async def test_first_token_deadline_moves_to_another_backend(sims, gateways, http):
    a, b = await sims(SimSettings(tokens=12)), await sims(SimSettings(tokens=12))
    await set_faults(http, a, ttft_ms=3000)
    gateway = await gateways(_config(a, b, streams="ttft_timeout = 0.3\n"))
    start = time.monotonic()
    record = await stream(http, f"{gateway.url}/v1/chat/completions", STREAM)
    _assert_coherent(record, 12, resumes=1)
    assert 0.3 <= record.arrivals[0] < 0.3 + 0.5
    assert time.monotonic() - start < 1.5
    assert "continue_final_message" not in b.state.last_requests[-1]["body"]


async def test_max_tokens_is_reduced_by_what_was_sent(sims, gateways, http):
    a, b = await sims(SimSettings(tokens=50)), await sims(SimSettings(tokens=50))
    await set_faults(http, a, drop_after=8)
    gateway = await gateways(_config(a, b))
    record = await stream(http, f"{gateway.url}/v1/chat/completions",
                          {**STREAM, "max_tokens": 20})
    _assert_coherent(record, 20, resumes=1)
    assert b.state.last_requests[-1]["body"]["max_tokens"] == 12


async def test_the_openai_client_sees_one_coherent_completion(sims, gateways, http):
    a, b = await sims(SimSettings(tokens=40)), await sims(SimSettings(tokens=40))
    await set_faults(http, a, drop_after=17)
    gateway = await gateways(_config(a, b))
    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    async with client:
        chunks = [c async for c in await client.chat.completions.create(
            model="sim-model", messages=CHAT["messages"], stream=True)]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        answer_text(0, 40)
    assert len({c.id for c in chunks}) == 1
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_killing_a_backend_under_100_streams_leaves_every_answer_whole(sims, gateways,
                                                                            http):
    settings = SimSettings(tokens=40, itl_ms=20)
    a, b = await sims(settings), await sims(settings)
    gateway = await gateways(config_text(
        [BackendSpec("a", a.url), BackendSpec("b", b.url)], timeouts="read = 2.0"))
    streams = [asyncio.create_task(stream(http, f"{gateway.url}/v1/chat/completions", STREAM))
               for _ in range(100)]
    await eventually(lambda: inference_requests(a) >= 20, within=10,
                     what="streams under way on a")
    await a.stop()
    records = await asyncio.gather(*streams)
    for record in records:
        assert record.errors == [] and record.done_count == 1
        assert record.text() == answer_text(0, 40)
    assert sum(1 for r in records if r.comments) >= 1  # those cut on "a" were resumed
