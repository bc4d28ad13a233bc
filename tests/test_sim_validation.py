"""Tests of the simulated inference backend: echo, request validation, models and
embeddings, against real servers on loopback ports.

The gateway's own tests trust the simulator's timing, text and faults, so
each test here checks one of them from the outside, with a real HTTP client.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.sim import SimServer, SimSettings, start_sim
from tests import sim_support
from tests.sim_support import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
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


# --- echo and validation ---------------------------------------------------------------------


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
