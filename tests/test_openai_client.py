"""The official ``openai`` client, sync and async, streaming and not, through the gateway."""

from __future__ import annotations

import asyncio

import openai
import pytest

from gateway.sim import answer_text
from tests.gateway_harness import BackendSpec, config_text

MESSAGES = [{"role": "user", "content": "tell me something"}]


@pytest.fixture
async def base_url(sim, gateways):
    gateway = await gateways(config_text([BackendSpec("a", sim.url)]))
    return f"{gateway.url}/v1"


async def test_async_client(base_url):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    async with client:
        reply = await client.chat.completions.create(model="sim-model", messages=MESSAGES)
        assert reply.choices[0].message.content == answer_text(0, 8)
        assert reply.usage is not None and reply.usage.completion_tokens == 8

        chunks = await client.chat.completions.create(model="sim-model", messages=MESSAGES,
                                                      stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        assert text == answer_text(0, 8)

        embedding = await client.embeddings.create(model="sim-model", input="abc")
        assert len(embedding.data[0].embedding) > 0

        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="missing", messages=MESSAGES)


def _sync_calls(base_url: str) -> tuple[str, str]:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    with client:
        reply = client.chat.completions.create(model="sim-model", messages=MESSAGES)
        stream = client.chat.completions.create(model="sim-model", messages=MESSAGES,
                                                stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        completion = client.completions.create(model="sim-model", prompt="once")
        assert completion.choices[0].text == answer_text(0, 8)
    return reply.choices[0].message.content or "", text


async def test_sync_client(base_url):
    # The sync client blocks, so it runs in a thread while the servers keep
    # running on this test's event loop.
    content, streamed = await asyncio.to_thread(_sync_calls, base_url)
    assert content == streamed == answer_text(0, 8)
