"""A request bound to its session: the body it forwards, the reply it records, its commit.

The streamed bytes are the real simulator's, cut into events exactly as the
relay cuts them (``EventBuffer``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest

from gateway.http.errors import GatewayError
from gateway.sessions.accumulate import ReplyAccumulator
from gateway.sessions.binding import SessionBinding
from gateway.sessions.service import SessionService, parse_session_id
from gateway.sessions.settings import SessionsConfig
from gateway.sim import SimServer, answer_text
from gateway.upstream.sse import EventBuffer
from tests.fixtures_sessions import chat_body, completion, running

JSON_HEADERS = {"Content-Type": "application/json"}


@pytest.fixture
async def service() -> AsyncIterator[SessionService]:
    async with running(SessionsConfig()) as started:
        yield started


async def relay(http: aiohttp.ClientSession, sim: SimServer, binding: SessionBinding,
                headers: dict[str, str] | None = None, chunk_size: int | None = None) -> bytes:
    """Send the binding's body to the simulator and show the binding each run of events."""
    events = EventBuffer()
    raw = b""
    async with http.post(f"{sim.url}/v1/chat/completions", data=binding.request_body(),
                         headers={**JSON_HEADERS, **(headers or {})}) as response:
        assert response.status == 200
        async for chunk in response.content.iter_any():
            raw += chunk
    pieces = [raw[i:i + chunk_size] for i in range(0, len(raw), chunk_size)] if chunk_size \
        else [raw]
    for piece in pieces:
        if complete := events.feed(piece):
            binding.observe_stream_events(complete)
    return raw


@pytest.mark.parametrize("tokens,chunk_size", [(8, None), (200, 1), (64, 7)])
async def test_streamed_text_is_accumulated_exactly(
        service: SessionService, sim: SimServer, http: aiohttp.ClientSession,
        tokens: int, chunk_size: int | None) -> None:
    body = {**chat_body("hello"), "stream": True, "stream_options": {"include_usage": True}}
    binding = await service.bind("default", "stream", body)
    await relay(http, sim, binding, {"X-Sim-Tokens": str(tokens)}, chunk_size)
    assert binding.reply_text == answer_text(0, tokens)


async def test_a_streamed_turn_becomes_history_for_the_next_request(
        service: SessionService, sim: SimServer, http: aiohttp.ClientSession) -> None:
    first = await service.bind("default", "chat", {**chat_body("hello", system="Be brief."),
                                                   "stream": True})
    assert orjson.loads(first.request_body())["messages"] == chat_body(
        "hello", system="Be brief.")["messages"]
    await relay(http, sim, first)
    await first.commit("req-1")

    second = await service.bind("default", "chat", {**chat_body("and then?"), "stream": True})
    forwarded = orjson.loads(second.request_body())
    assert forwarded["stream"] is True and forwarded["model"] == "sim-model"
    assert forwarded["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": answer_text(0, 8)},
        {"role": "user", "content": "and then?"}]
    assert second.request_body() is second.request_body()  # serialized once


async def test_a_json_answer_is_recorded(service: SessionService, sim: SimServer,
                                         http: aiohttp.ClientSession) -> None:
    binding = await service.bind("default", "json", chat_body("hi"))
    async with http.post(f"{sim.url}/v1/chat/completions", data=binding.request_body(),
                         headers=JSON_HEADERS) as response:
        binding.observe_json(await response.read())
    await binding.commit("req-json")
    assert await service.history("default", "json") == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": answer_text(0, 8)}]


def test_tool_calls_are_assembled_from_their_pieces() -> None:
    reply = ReplyAccumulator()
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
            {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "get_", "arguments": ""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"name": "weather", "arguments": '{"city":'}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": ' "Paris"}'}}]}}]},
        {"choices": [{"index": 1, "delta": {"content": "other choice"}}]},
    ]
    events = b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in chunks)
    reply.feed_events(events + b"data: [DONE]\n\n")
    assert reply.done
    assert reply.message() == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}


async def test_commit_is_idempotent_and_a_second_call_does_nothing(
        service: SessionService) -> None:
    binding = await service.bind("default", "twice", chat_body("q"))
    binding.observe_json(completion("a"))
    await binding.commit("req-7")
    await binding.commit("req-7")
    again = await service.bind("default", "twice", chat_body("q"))
    again.observe_json(completion("a"))
    await again.commit("req-7")  # a retried request with the same id
    history = await service.history("default", "twice")
    assert history == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


async def test_the_client_system_message_replaces_the_stored_one(
        service: SessionService) -> None:
    for n, system in enumerate(["Be brief.", None, "Be verbose."]):
        binding = await service.bind("default", "sys", chat_body(f"q{n}", system=system))
        binding.observe_json(completion(f"a{n}"))
        await binding.commit(f"r{n}")
    history = await service.history("default", "sys") or []
    assert history[0] == {"role": "system", "content": "Be verbose."}
    assert [m["role"] for m in history].count("system") == 1
    assert len(history) == 7


@pytest.mark.parametrize("value", ["", "a b", "x" * 129, "é", "a/b", "{tag}"])
async def test_a_bad_session_id_is_a_400_naming_the_header(
        service: SessionService, value: str) -> None:
    with pytest.raises(GatewayError) as error:
        await service.bind("default", value, chat_body("q"))
    assert error.value.status == 400 and "X-Session-Id" in error.value.message
    with pytest.raises(GatewayError):
        parse_session_id(value)


def test_good_session_ids_pass() -> None:
    for value in ("a", "x" * 128, "user-42:chat.7_A"):
        assert parse_session_id(value) == value


@pytest.mark.parametrize("body", [
    {"model": "m"}, {"model": "m", "messages": []}, {"model": "m", "messages": ["hi"]},
    {"model": "m", "messages": [{"content": "no role"}]}])
async def test_bad_messages_are_a_400_and_nothing_is_stored(
        service: SessionService, body: dict) -> None:
    with pytest.raises(GatewayError) as error:
        await service.bind("default", "bad", body)
    assert error.value.status == 400 and "messages" in error.value.message
    assert await service.history("default", "bad") is None


async def test_the_memory_store_is_never_degraded(service: SessionService) -> None:
    binding = await service.bind("default", "mem", chat_body("q"))
    await binding.commit("r")
    assert not binding.degraded
    assert service.stats.fallback_reads == service.stats.fallback_writes == 0


def test_malformed_events_never_break_the_stream() -> None:
    """The hot path must not raise: whatever a backend sends reaches the client as it is."""
    reply = ReplyAccumulator()
    garbage = [b"data: {not json", b"data: [1, 2]", b'data: {"choices": "x", "delta": 1}',
               b'data: {"choices": [{"delta": "text"}]}',
               b'data: {"choices": [{"delta": {"tool_calls": [{"index": "x"}, 5]}}]}',
               b'data: {"error": {"message": "boom"}}', b": a comment", b"event: ping",
               b'data: {"choices": [{"delta": {"content": "ok"}}]}']
    reply.feed_events(b"\n\n".join(garbage) + b"\n\n")
    assert reply.text == "ok" and not reply.done
