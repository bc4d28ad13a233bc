"""Shared fixtures and helpers of the tests/test_sim_*.py modules: tests of the simulated
inference backend, against real servers on loopback ports.

The gateway's own tests trust the simulator's timing, text and faults, so
each test here checks one of them from the outside, with a real HTTP client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.sim import SimServer, SimSettings, answer_text, start_sim

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
