"""A multi-turn chat through the gateway with only X-Session-Id and the newest message.

The openai client, real Redis (standalone and Cluster), and the real
simulator; the standalone Redis is killed and restarted mid-conversation, and
no turn is lost.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from gateway.app import SESSIONS
from gateway.sim import answer_text
from tests.gateway_harness import BackendSpec, config_text
from tests.resilience_helpers import eventually
from tests.services import redis_command


def _config(sim_url: str, sessions: str, retry: str = "") -> str:
    return config_text([BackendSpec("a", sim_url)], retry=retry,
                       extra="[sessions]\n" + sessions)


async def _turn(client: openai.AsyncOpenAI, session_id: str, text: str, stream: bool) -> str:
    messages = [{"role": "user", "content": text}]
    headers = {"X-Session-Id": session_id}
    if not stream:
        reply = await client.chat.completions.create(model="sim-model", messages=messages,
                                                     extra_headers=headers)
        return reply.choices[0].message.content or ""
    chunks = await client.chat.completions.create(model="sim-model", messages=messages,
                                                  extra_headers=headers, stream=True)
    return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])


async def _chat(gateway, sim, session_id: str, turns: range, http) -> None:
    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    async with client:
        for n in turns:
            reply = await _turn(client, session_id, f"question {n}", stream=n % 2 == 1)
            assert reply == answer_text(0, 8)
            sent = sim.state.last_requests[-1]["body"]["messages"]
            # the backend got the whole conversation (every chat here starts at
            # question 0), the client sent one message
            assert [m["content"] for m in sent if m["role"] == "user"] == [
                f"question {i}" for i in range(n + 1)]


async def _history(http, gateway, session_id: str) -> list[dict]:
    async with http.get(f"{gateway.url}/v1/sessions/{session_id}") as response:
        assert response.status == 200
        return (await response.json())["messages"]


def _expected(turns: int) -> list[dict]:
    messages = []
    for n in range(turns):
        messages += [{"role": "user", "content": f"question {n}"},
                     {"role": "assistant", "content": answer_text(0, 8)}]
    return messages


@pytest.mark.parametrize("store", ["memory", "redis", "cluster"])
async def test_multi_turn_chat_with_only_the_newest_message(store, sim, gateways, http,
                                                            request):
    if store == "redis":
        sessions = f'store = "redis"\nurl = "{request.getfixturevalue("redis_url")}"\n'
    elif store == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        nodes = ", ".join(f'"{h}:{p}"' for h, p in cluster.startup_nodes)
        sessions = f'store = "cluster"\nnodes = [{nodes}]\nprefix = "e2e:{id(sim)}:"\n'
    else:
        sessions = 'store = "memory"\n'
    gateway = await gateways(_config(sim.url, sessions))
    await _chat(gateway, sim, f"chat-{store}", range(0, 4), http)
    assert await _history(http, gateway, f"chat-{store}") == _expected(4)
    async with http.delete(f"{gateway.url}/v1/sessions/chat-{store}") as response:
        assert response.status == 204
    async with http.get(f"{gateway.url}/v1/sessions/chat-{store}") as response:
        assert response.status == 404


async def test_redis_killed_and_restarted_mid_conversation_loses_no_turn(
        sim, gateways, http, redis_url, redis_server):
    gateway = await gateways(_config(sim.url, f'store = "redis"\nurl = "{redis_url}"\n'
                                     "[sessions.compensation]\nbackoff_initial_ms = 20\n"
                                     "backoff_max_ms = 200\n"))
    await _chat(gateway, sim, "survivor", range(0, 3), http)
    redis_command(redis_server.port, "SAVE")  # the test server has no persistence of its own
    redis_server.kill()
    try:
        await _chat(gateway, sim, "survivor", range(3, 6), http)
        async with http.post(f"{gateway.url}/v1/chat/completions", headers={
                "X-Session-Id": "survivor"}, json={"model": "sim-model", "messages": [
                {"role": "user", "content": "question 6"}]}) as response:
            assert response.headers.get("X-Gateway-Session") == "degraded"
    finally:
        redis_server.restart()
    service = gateway.app[SESSIONS]
    await eventually(lambda: service.stats.backlog == 0, within=10, what="compensation drained")
    assert service.stats.replayed >= 4
    # A fresh gateway (no local copy) reads the whole conversation from Redis.
    fresh = await gateways(_config(sim.url, f'store = "redis"\nurl = "{redis_url}"\n'))
    assert await _history(http, fresh, "survivor") == _expected(7)


async def test_a_session_id_in_a_bad_format_is_400(sim, gateways, http):
    gateway = await gateways(_config(sim.url, 'store = "memory"\n'))
    for bad in ("", "has space", "x" * 129, "semi;colon"):
        async with http.post(f"{gateway.url}/v1/chat/completions", headers={
                "X-Session-Id": bad}, json={"model": "sim-model", "messages": [
                {"role": "user", "content": "hi"}]}) as response:
            assert response.status == 400, bad
            assert "X-Session-Id" in (await response.json())["error"]["message"]
    assert sim.state.requests_total == 0


async def test_a_failed_answer_appends_nothing(sim, gateways, http):
    gateway = await gateways(_config(sim.url, 'store = "memory"\n', retry="max_attempts = 1"))
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
            "stream": True}
    for fault in ({"X-Sim-Status": "503"}, {"X-Sim-Drop-After": "3"}):
        async with http.post(f"{gateway.url}/v1/chat/completions", json=body,
                             headers={"X-Session-Id": "fails", **fault}) as response:
            await response.read()
    async with http.get(f"{gateway.url}/v1/sessions/fails") as response:
        assert response.status == 404


async def test_concurrent_turns_on_one_session_all_land(sim, gateways, http, redis_url):
    gateway = await gateways(_config(sim.url, f'store = "redis"\nurl = "{redis_url}"\n'))

    async def turn(n: int) -> None:
        async with http.post(f"{gateway.url}/v1/chat/completions",
                             headers={"X-Session-Id": "busy"},
                             json={"model": "sim-model", "messages": [
                                 {"role": "user", "content": f"q{n}"}]}) as response:
            assert response.status == 200

    await asyncio.gather(*(turn(n) for n in range(20)))
    history = await _history(http, gateway, "busy")
    assert sorted(m["content"] for m in history if m["role"] == "user") == sorted(
        f"q{n}" for n in range(20))


async def test_two_tenants_with_the_same_session_id_never_meet(sim, gateways, http,
                                                               monkeypatch, redis_url):
    monkeypatch.setenv("GW_KEY_A", "key-of-tenant-a-0123456789")
    monkeypatch.setenv("GW_KEY_B", "key-of-tenant-b-0123456789")
    keys = ("[auth]\nenabled = true\n"
            '[[auth.keys]]\nname = "a"\ntenant = "tenant-a"\nkey_env = "GW_KEY_A"\n'
            '[[auth.keys]]\nname = "b"\ntenant = "tenant-b"\nkey_env = "GW_KEY_B"\n')
    gateway = await gateways(_config(sim.url, f'store = "redis"\nurl = "{redis_url}"\n') + keys)
    a = {"Authorization": "Bearer key-of-tenant-a-0123456789", "X-Session-Id": "shared"}
    b = {"Authorization": "Bearer key-of-tenant-b-0123456789", "X-Session-Id": "shared"}
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "secret of a"}]}
    async with http.post(f"{gateway.url}/v1/chat/completions", json=body,
                         headers=a) as response:
        assert response.status == 200
    url = f"{gateway.url}/v1/sessions/shared"
    async with http.get(url, headers=b) as response:
        assert response.status == 404  # not "forbidden": its existence is not revealed
    async with http.delete(url, headers=b) as response:
        assert response.status == 404
    other = {"model": "sim-model", "messages": [{"role": "user", "content": "hello from b"}]}
    async with http.post(f"{gateway.url}/v1/chat/completions", json=other,
                         headers=b) as response:
        assert response.status == 200
    sent = sim.state.last_requests[-1]["body"]["messages"]
    assert [m["content"] for m in sent] == ["hello from b"]  # b's own, empty history
    async with http.get(url, headers=a) as response:
        history = (await response.json())["messages"]
    assert [m["content"] for m in history if m["role"] == "user"] == ["secret of a"]
    async with http.get(url) as response:
        assert response.status == 401  # and without a key, nothing at all
