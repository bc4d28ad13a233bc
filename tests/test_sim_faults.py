"""Tests of the simulated inference backend: faults (status, hang, stall, drop, refuse),
the control API and the server's lifecycle, against real servers on loopback ports.

The gateway's own tests trust the simulator's timing, text and faults, so
each test here checks one of them from the outside, with a real HTTP client.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import aiohttp.web
import orjson
import pytest

from gateway.sim import (
    SimServer,
    SimSettings,
    answer_text,
    build_app,
    start_sim,
)
from tests import sim_support
from tests.sim_support import (
    CHAT,
    COMPLETIONS,
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
fresh_client = sim_support.fresh_client


# --- faults ----------------------------------------------------------------------------------


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


# --- control API and lifecycle ---------------------------------------------------------------


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
