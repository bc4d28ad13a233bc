"""Tests of the simulated inference backend, against real servers on loopback ports.

The gateway's own tests trust the simulator's timing, text and faults, so
each test here checks one of them from the outside, with a real HTTP client.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import aiohttp.web
import orjson
import pytest

from gateway.sim import (
    SimServer,
    SimSettings,
    answer_text,
    answer_tokens,
    build_app,
    start_sim,
)

pytestmark = pytest.mark.timeout(15)

SEED = 7
N = 12
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
FULL_TEXT = answer_text(SEED, N)


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    server = await start_sim(SimSettings(tokens=N, seed=SEED))
    yield server
    await server.stop()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        yield session


@pytest.fixture
async def fresh_client() -> AsyncIterator[aiohttp.ClientSession]:
    """A client that opens a new connection per request, so "refused" means refused.

    With pooled connections a request could pick one the server has just closed
    and fail differently.
    """
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield session


def chat(content: str = "hello there world", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


async def post(
    client: aiohttp.ClientSession, url: str, body: Any, **headers: str
) -> tuple[int, Any, aiohttp.ClientResponse]:
    """POST a JSON body; the status, the parsed answer, and the response (for headers)."""
    async with client.post(url, json=body, headers=headers) as response:
        return response.status, orjson.loads(await response.read()), response


async def stream(client: aiohttp.ClientSession, url: str, body: Any, **headers: str) -> list[str]:
    """POST a streaming request; the payloads of its ``data:`` events, in order."""
    async with client.post(url, json={**body, "stream": True}, headers=headers) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        assert response.headers["Cache-Control"] == "no-cache"
        return [
            line[6:].strip().decode() async for line in response.content if line[:6] == b"data: "
        ]


def chunks(payloads: list[str]) -> list[dict[str, Any]]:
    """The JSON chunks of a stream that ended with exactly one ``[DONE]``, as its last event."""
    assert payloads.count("[DONE]") == 1
    assert payloads[-1] == "[DONE]"
    return [orjson.loads(payload) for payload in payloads[:-1]]


def streamed_text(events: list[dict[str, Any]]) -> str:
    parts = []
    for event in events:
        for choice in event["choices"]:
            parts.append(choice.get("text") or choice.get("delta", {}).get("content") or "")
    return "".join(parts)


# --- answers ------------------------------------------------------------------------------


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


# --- timing -------------------------------------------------------------------------------


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


# --- faults -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry_after", "seconds", "millis"), [("2", "2", "2000"), ("0.25", "0.25", "250")]
)
async def test_status_fault_answers_openai_error_with_retry_after(
    sim: SimServer, client: aiohttp.ClientSession, retry_after: str, seconds: str, millis: str
) -> None:
    headers = {"X-Sim-Status": "503", "X-Sim-Retry-After": retry_after}
    status, answer, response = await post(client, sim.url + CHAT, chat(), **headers)
    assert status == 503
    assert answer["error"]["type"] == "sim_fault"
    assert answer["error"]["code"] == 503
    assert answer["error"]["message"]
    assert response.headers["Retry-After"] == seconds
    assert response.headers["retry-after-ms"] == millis


async def test_status_fault_without_retry_after_sends_none(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    status, _, response = await post(
        client, sim.url + COMPLETIONS, {"model": "m", "prompt": "x"}, **{"X-Sim-Status": "500"}
    )
    assert status == 500
    assert "Retry-After" not in response.headers


async def test_status_rate_fails_about_that_fraction(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    headers = {"X-Sim-Status": "500", "X-Sim-Status-Rate": "0.5"}
    statuses = [(await post(client, sim.url + CHAT, chat(), **headers))[0] for _ in range(200)]
    assert set(statuses) == {200, 500}
    assert 70 <= statuses.count(500) <= 130


async def test_hang_headers_never_answers(sim: SimServer, client: aiohttp.ClientSession) -> None:
    start = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        async with client.post(
            sim.url + CHAT,
            json=chat(),
            headers={"X-Sim-Hang": "headers"},
            timeout=aiohttp.ClientTimeout(total=0.3),
        ):
            pass
    assert time.monotonic() - start < 1.0
    status, _, _ = await post(client, sim.url + CHAT, chat())  # the server is still responsive
    assert status == 200


async def test_stall_after_k_tokens_goes_silent(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    async with client.post(
        sim.url + CHAT, json=chat(stream=True), headers={"X-Sim-Stall-After": "3"}
    ) as response:
        received = 0
        while received < 3:
            line = await asyncio.wait_for(response.content.readline(), 2.0)
            received += line.startswith(b"data: ")
        # Only the blank line that ends the third event may still come; then silence.
        with pytest.raises(asyncio.TimeoutError):
            while True:
                line = await asyncio.wait_for(response.content.readline(), 0.3)
                assert line.strip() == b"", line


async def test_stall_applies_to_whole_answers_too(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    with pytest.raises(asyncio.TimeoutError):
        await client.post(
            sim.url + CHAT,
            json=chat(),
            headers={"X-Sim-Stall-After": "2"},
            timeout=aiohttp.ClientTimeout(total=0.3),
        )


async def test_drop_after_k_tokens_aborts_the_connection(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    payloads: list[str] = []
    with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError)):
        async with client.post(
            sim.url + CHAT, json=chat(stream=True), headers={"X-Sim-Drop-After": "3"}
        ) as response:
            async for line in response.content:
                if line.startswith(b"data: "):
                    payloads.append(line[6:].strip().decode())
    assert len(payloads) == 3
    assert "[DONE]" not in payloads
    assert streamed_text([orjson.loads(payload) for payload in payloads]) == answer_text(SEED, 3)


async def test_drop_applies_to_whole_answers_too(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await client.post(sim.url + CHAT, json=chat(), headers={"X-Sim-Drop-After": "0"})


async def test_fault_after_the_last_token_does_not_strike(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    events = chunks(
        await stream(client, sim.url + CHAT, chat(max_tokens=2), **{"X-Sim-Drop-After": "3"})
    )
    assert streamed_text(events) == answer_text(SEED, 2)


# --- echo and validation ----------------------------------------------------------------------


async def test_echo_returns_what_was_received(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "part"}]},
        ],
    }
    _, answer, _ = await post(client, sim.url + CHAT, body, **{"X-Sim-Echo": "1"})
    assert orjson.loads(answer["choices"][0]["message"]["content"]) == ["sys", "part"]

    events = chunks(
        await stream(
            client,
            sim.url + COMPLETIONS,
            {"model": "m", "prompt": ["a", "b c"]},
            **{"x-sim-echo": "true"},
        )
    )
    assert len(events) == 2  # the echo is one token, then the finish chunk
    assert orjson.loads(streamed_text(events)) == ["a", "b c"]


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("X-Sim-TTFT-Ms", "abc"),
        ("X-Sim-ITL-Ms", "-1"),
        ("X-Sim-TTFT-Ms", "nan"),
        ("X-Sim-Tokens", "1.5"),
        ("X-Sim-Seed", "x"),
        ("X-Sim-Status", "200"),
        ("X-Sim-Status-Rate", "2"),
        ("X-Sim-Retry-After", "soon"),
        ("X-Sim-Hang", "yes"),
        ("X-Sim-Stall-After", "-3"),
        ("x-sim-drop-after", "nan"),
        ("X-Sim-Echo", "maybe"),
    ],
)
async def test_invalid_header_is_a_400_naming_it(
    sim: SimServer, client: aiohttp.ClientSession, header: str, value: str
) -> None:
    status, answer, _ = await post(client, sim.url + CHAT, chat(), **{header: value})
    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error"
    assert header.lower() in answer["error"]["message"].lower()


@pytest.mark.parametrize(
    ("path", "body", "word"),
    [
        (CHAT, [1, 2], "object"),
        (CHAT, {"messages": []}, "model"),
        (CHAT, {"model": 3, "messages": []}, "model"),
        (CHAT, {"model": "m"}, "messages"),
        (CHAT, {"model": "m", "messages": "hi"}, "messages"),
        (CHAT, {"model": "m", "messages": [{"content": "no role"}]}, "role"),
        (CHAT, chat(max_tokens=0), "max_tokens"),
        (CHAT, chat(stream="yes"), "stream"),
        (CHAT, chat(continue_final_message=True), "assistant"),
        (COMPLETIONS, {"model": "m"}, "prompt"),
        (COMPLETIONS, {"model": "m", "prompt": [1, 2]}, "prompt"),
        (EMBEDDINGS, {"model": "m"}, "input"),
    ],
)
async def test_invalid_body_is_a_400(
    sim: SimServer, client: aiohttp.ClientSession, path: str, body: Any, word: str
) -> None:
    status, answer, _ = await post(client, sim.url + path, body)
    assert status == 400
    assert word in answer["error"]["message"]


async def test_body_that_is_not_json_is_a_400(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    async with client.post(sim.url + CHAT, data=b"{nope") as response:
        assert response.status == 400
        assert (await response.json())["error"]["code"] == 400


async def test_unknown_model_is_a_404_when_models_are_listed(client: aiohttp.ClientSession) -> None:
    async with await start_sim(SimSettings(models=("alpha", "beta"))) as server:
        status, answer, _ = await post(client, server.url + CHAT, chat() | {"model": "gamma"})
        assert status == 404
        assert "gamma" in answer["error"]["message"]
        status, _, _ = await post(client, server.url + CHAT, chat() | {"model": "beta"})
        assert status == 200
        async with client.get(server.url + "/v1/models") as response:
            listed = await response.json()
    assert listed["object"] == "list"
    assert [model["id"] for model in listed["data"]] == ["alpha", "beta"]
    assert all(
        model["object"] == "model" and model["owned_by"] == "sim" for model in listed["data"]
    )


async def test_any_model_is_accepted_and_sim_model_is_listed(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    async with client.get(sim.url + "/v1/models") as response:
        assert [model["id"] for model in (await response.json())["data"]] == ["sim-model"]
    async with client.get(sim.url + "/health") as response:
        assert response.status == 200


async def test_embeddings_are_deterministic(sim: SimServer, client: aiohttp.ClientSession) -> None:
    body = {"model": "emb", "input": ["alpha beta", "gamma"]}
    _, first, _ = await post(client, sim.url + EMBEDDINGS, body)
    _, again, _ = await post(client, sim.url + EMBEDDINGS, body)
    _, single, _ = await post(client, sim.url + EMBEDDINGS, {"model": "emb", "input": "gamma"})
    assert first == again
    assert first["object"] == "list" and first["model"] == "emb"
    assert first["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    vectors = [item["embedding"] for item in first["data"]]
    assert [item["index"] for item in first["data"]] == [0, 1]
    assert all(len(vector) == 8 and all(-1 <= x <= 1 for x in vector) for vector in vectors)
    assert vectors[0] != vectors[1]
    assert single["data"][0]["embedding"] == vectors[1]

    _, packed, _ = await post(client, sim.url + EMBEDDINGS, {**body, "encoding_format": "base64"})
    decoded = struct.unpack("<8f", base64.b64decode(packed["data"][1]["embedding"]))
    assert decoded == pytest.approx(vectors[1], abs=1e-6)


# --- control API and lifecycle ------------------------------------------------------------


async def test_control_api_changes_only_that_server(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    async with await start_sim(SimSettings(tokens=N, seed=SEED)) as other:
        async with client.put(
            sim.url + "/sim/faults", json={"status": 503, "retry_after": 1}
        ) as response:
            assert response.status == 200
            assert (await response.json())["settings"]["faults"]["status"] == 503
        status, _, response = await post(client, sim.url + CHAT, chat())
        assert (status, response.headers["Retry-After"]) == (503, "1")
        assert (await post(client, other.url + CHAT, chat()))[0] == 200

        async with client.put(
            sim.url + "/sim/faults", json={"status": None, "tokens": 3}
        ) as response:
            assert response.status == 200
        _, answer, _ = await post(client, sim.url + CHAT, chat())
        assert answer["choices"][0]["message"]["content"] == answer_text(SEED, 3)
        assert other.state.settings.tokens == N


@pytest.mark.parametrize(
    "body", [{"bogus": 1}, {"status": "500"}, {"ttft_ms": -5}, {"hang_headers": 1}, [1]]
)
async def test_control_api_rejects_bad_updates(
    sim: SimServer, client: aiohttp.ClientSession, body: Any
) -> None:
    async with client.put(sim.url + "/sim/faults", json=body) as response:
        assert response.status == 400
        assert (await response.json())["error"]["type"] == "invalid_request_error"
    assert sim.state.settings == SimSettings(tokens=N, seed=SEED)


async def test_state_counts_and_records_requests_but_not_control(
    sim: SimServer, client: aiohttp.ClientSession
) -> None:
    await post(client, sim.url + CHAT, chat("counted"), **{"X-Custom": "Value"})
    await post(client, sim.url + COMPLETIONS, {"model": "m", "prompt": "x"})
    await client.put(sim.url + "/sim/faults", json={"itl_ms": 1})
    async with client.get(sim.url + "/sim/state") as response:
        state = await response.json()
    assert state["requests_total"] == 2
    assert state["requests_by_path"] == {CHAT: 1, COMPLETIONS: 1}
    assert state["settings"]["itl_ms"] == 1
    first = state["last_requests"][0]
    assert first["path"] == CHAT
    assert first["headers"]["x-custom"] == "Value"
    assert first["body"]["messages"][0]["content"] == "counted"
    assert sim.state.requests_total == 2

    async with client.post(sim.url + "/sim/reset") as response:
        assert response.status == 200
    assert sim.state.requests_total == 0
    assert not sim.state.last_requests
    assert sim.state.settings == SimSettings(tokens=N, seed=SEED)


async def test_stop_and_restart_keep_the_port(
    sim: SimServer, fresh_client: aiohttp.ClientSession
) -> None:
    port = sim.port
    await post(fresh_client, sim.url + CHAT, chat())
    await sim.stop()
    with pytest.raises(aiohttp.ClientConnectorError):
        await fresh_client.get(sim.url + "/health")
    await sim.restart()
    assert sim.port == port
    assert (await post(fresh_client, sim.url + CHAT, chat()))[0] == 200
    assert sim.state.requests_total == 2  # counters survive a restart


async def test_stop_cuts_streams_in_flight(sim: SimServer, client: aiohttp.ClientSession) -> None:
    async with client.post(
        sim.url + CHAT, json=chat(stream=True), headers={"X-Sim-Stall-After": "1"}
    ) as response:
        await asyncio.wait_for(response.content.readline(), 2.0)
        await sim.stop()
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(response.read(), 2.0)


async def test_refuse_fault_stops_listening_until_restart(
    sim: SimServer, fresh_client: aiohttp.ClientSession
) -> None:
    async with fresh_client.put(sim.url + "/sim/faults", json={"refuse": True}) as response:
        assert response.status == 200
        assert (await response.json())["settings"]["faults"]["refuse"] is True
    # The listener closes before the loop gets to the client's next connection.
    with pytest.raises(aiohttp.ClientConnectorError):
        await fresh_client.get(sim.url + "/health")
    await sim.restart()
    assert (await post(fresh_client, sim.url + CHAT, chat()))[0] == 200
    assert sim.state.settings.faults.refuse is False


async def test_refuse_needs_a_sim_server(client: aiohttp.ClientSession) -> None:
    """A bare application (someone else's runner) cannot stop listening, so it says so."""
    runner = aiohttp.web.AppRunner(build_app(SimSettings()))
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        host, port = runner.addresses[0][:2]
        async with client.put(
            f"http://{host}:{port}/sim/faults", json={"refuse": True}
        ) as response:
            assert response.status == 400
            assert "refuse" in (await response.json())["error"]["message"]
    finally:
        await runner.cleanup()


async def test_stop_right_after_refuse_waits_for_it(fresh_client: aiohttp.ClientSession) -> None:
    server = await start_sim()
    async with fresh_client.put(server.url + "/sim/faults", json={"refuse": True}) as response:
        assert response.status == 200
    await server.stop()
    await server.stop()  # idempotent
    pending = [task.get_coro() for task in asyncio.all_tasks() if not task.done()]
    assert not [coro for coro in pending if "SimServer" in getattr(coro, "__qualname__", "")]
