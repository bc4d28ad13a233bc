"""Tests of the simulated inference backend: the answers (text, OpenAI shapes, streams,
usage, max_tokens, continuations) and their timing, against real servers on loopback ports.

The gateway's own tests trust the simulator's timing, text and faults, so
each test here checks one of them from the outside, with a real HTTP client.
"""

from __future__ import annotations

import itertools
import time

import aiohttp
import pytest

from gateway.sim import SimServer, answer_text, answer_tokens
from tests import sim_support
from tests.sim_support import (
    CHAT,
    COMPLETIONS,
    FULL_TEXT,
    SEED,
    N,
    chat,
    chunks,
    post,
    stream,
    streamed_text,
)

pytestmark = pytest.mark.timeout(15)

# Fixtures of tests/sim_support.py, bound here so that pytest finds them.
sim = sim_support.sim
client = sim_support.client


# --- answers ---------------------------------------------------------------------------------


async def test_answer_text_is_deterministic_and_made_of_tokens() -> None:
    tokens = answer_tokens(SEED, N)
    assert "".join(tokens) == FULL_TEXT
    assert not tokens[0].startswith(" ")
    assert all(token.startswith(" ") and token.strip().isalpha() for token in tokens[1:])
    assert answer_text(SEED, N) == FULL_TEXT
    assert answer_text(SEED + 1, N) != FULL_TEXT
    assert answer_tokens(SEED, N + 5)[:N] == tokens


async def test_chat_answer_has_openai_shape_and_usage(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    parts = [{"type": "text", "text": "two words"}, {"type": "image_url", "image_url": {}}]
    body = {
        "model": "my-model",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": parts},
        ],
    }
    status, answer, _ = await post(client, sim.url + CHAT, body)
    assert status == 200
    assert answer["id"].startswith("chatcmpl-")
    assert answer["object"] == "chat.completion"
    assert isinstance(answer["created"], int)
    assert answer["model"] == "my-model"
    assert answer["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": FULL_TEXT},
            "finish_reason": "stop",
        }
    ]
    assert answer["usage"] == {"prompt_tokens": 4, "completion_tokens": N, "total_tokens": 4 + N}


async def test_completions_answer_has_openai_shape(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    status, answer, _ = await post(
        client, sim.url + COMPLETIONS, {"model": "m", "prompt": ["a b", "c"]}
    )
    assert status == 200
    assert answer["id"].startswith("cmpl-")
    assert answer["object"] == "text_completion"
    assert answer["choices"] == [{"index": 0, "text": FULL_TEXT, "finish_reason": "stop"}]
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": N, "total_tokens": 3 + N}


async def test_chat_stream_sends_one_event_per_token_then_done(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    events = chunks(await stream(client, sim.url + CHAT, chat()))
    assert len(events) == N + 1  # one per token, then the finish chunk; no usage chunk
    assert len({event["id"] for event in events}) == 1
    assert events[0]["id"].startswith("chatcmpl-")
    assert all(event["object"] == "chat.completion.chunk" for event in events)
    assert events[0]["choices"][0]["delta"] == {
        "role": "assistant",
        "content": answer_tokens(SEED, N)[0],
    }
    assert all("role" not in event["choices"][0]["delta"] for event in events[1:])
    assert all(event["choices"][0]["finish_reason"] is None for event in events[:-1])
    assert events[-1]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    assert streamed_text(events) == FULL_TEXT


async def test_stream_usage_chunk_comes_last_when_asked(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    body = chat("one two", stream_options={"include_usage": True})
    events = chunks(await stream(client, sim.url + CHAT, body))
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": N,
        "total_tokens": N + 2,
    }
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_completions_stream_carries_text(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    events = chunks(await stream(client, sim.url + COMPLETIONS, {"model": "m", "prompt": "hi"}))
    assert all(event["object"] == "text_completion" for event in events)
    assert events[0]["choices"] == [
        {"index": 0, "text": answer_tokens(SEED, N)[0], "finish_reason": None}
    ]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert streamed_text(events) == FULL_TEXT


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_caps_the_answer(
    sim: SimServer, client: aiohttp.ClientSession, field: str
) -> None:
    status, answer, _ = await post(client, sim.url + CHAT, chat(**{field: 5}))
    assert status == 200
    assert answer["choices"][0]["message"]["content"] == answer_text(SEED, 5)
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 5

    events = chunks(await stream(client, sim.url + CHAT, chat(**{field: 5})))
    assert streamed_text(events) == answer_text(SEED, 5)
    assert events[-1]["choices"][0]["finish_reason"] == "length"

    _, answer, _ = await post(client, sim.url + CHAT, chat(**{field: N}))
    assert answer["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("k", [1, 5, N - 1])
async def test_continuation_completes_the_interrupted_text(
    sim: SimServer, client: aiohttp.ClientSession, k: int
) -> None:
    prefix = answer_text(SEED, k)
    messages = [
        {"role": "user", "content": "tell me"},
        {"role": "assistant", "content": prefix},
    ]
    body = {"model": "m", "messages": messages, "continue_final_message": True}
    _, answer, _ = await post(client, sim.url + CHAT, body)
    assert prefix + answer["choices"][0]["message"]["content"] == FULL_TEXT
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == N - k

    events = chunks(await stream(client, sim.url + CHAT, body))
    assert prefix + streamed_text(events) == FULL_TEXT

    _, capped, _ = await post(client, sim.url + CHAT, {**body, "max_tokens": 1})
    assert capped["choices"][0]["message"]["content"] == answer_tokens(SEED, N)[k]


# --- timing ----------------------------------------------------------------------------------


async def test_stream_respects_ttft_and_itl(sim: SimServer, client: aiohttp.ClientSession) -> None:
    headers = {"X-Sim-TTFT-Ms": "200", "X-Sim-ITL-Ms": "50", "X-Sim-Tokens": "5"}
    arrivals = []
    start = time.monotonic()
    async with client.post(sim.url + CHAT, json=chat(stream=True), headers=headers) as response:
        assert time.monotonic() - start < 0.15  # headers come at once, before the first token
        async for line in response.content:
            if line.startswith(b'data: {"id"') and b'"finish_reason":null' in line:
                arrivals.append(time.monotonic() - start)
    assert len(arrivals) == 5
    assert 0.19 <= arrivals[0] < 1.0
    assert 0.39 <= arrivals[-1] < 1.3
    assert all(later - earlier >= 0.03 for earlier, later in itertools.pairwise(arrivals))


async def test_whole_answer_waits_for_its_last_token(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    headers = {"X-Sim-TTFT-Ms": "100", "X-Sim-ITL-Ms": "20", "X-Sim-Tokens": "6"}
    start = time.monotonic()
    status, _, _ = await post(client, sim.url + CHAT, chat(), **headers)
    elapsed = time.monotonic() - start
    assert status == 200
    assert 0.19 <= elapsed < 1.0  # 100 ms + 5 * 20 ms
