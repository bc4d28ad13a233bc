"""Fixtures and helpers for the session tests (real Redis servers, no mocks).

Import the fixtures with ``from tests.fixtures_sessions import *`` (conftest.py).
Cluster tests share the session-scoped cluster, so each uses its own key prefix.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import orjson
import pytest

from gateway.sessions.service import SessionService
from gateway.sessions.settings import CompensationConfig, SessionsConfig
from tests.services import RedisCluster, RedisServer

__all__ = ["second_redis_server", "second_redis_url"]

FAST_REPLAY = CompensationConfig(backoff_initial_ms=20, backoff_max_ms=200,
                                 flush_on_close_ms=500)
_prefixes = itertools.count()


@pytest.fixture(scope="session")
def second_redis_server() -> Iterator[RedisServer]:
    """Another standalone server, for the sharded store."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def second_redis_url(second_redis_server: RedisServer) -> str:
    second_redis_server.start()
    second_redis_server.flushall()
    return second_redis_server.url


def unique_prefix() -> str:
    """A key prefix no other test uses (the cluster is shared by the whole run)."""
    return f"t{os.getpid()}-{next(_prefixes)}:session:"


def redis_config(url: str, **overrides: Any) -> SessionsConfig:
    return replace(SessionsConfig(store="redis", url=url, compensation=FAST_REPLAY),
                   **overrides)


def cluster_config(cluster: RedisCluster, **overrides: Any) -> SessionsConfig:
    nodes = tuple(f"{host}:{port}" for host, port in cluster.startup_nodes)
    base = SessionsConfig(store="cluster", nodes=nodes, wait_replicas=1,
                          prefix=unique_prefix(), compensation=FAST_REPLAY)
    return replace(base, **overrides)


@asynccontextmanager
async def running(config: SessionsConfig) -> AsyncIterator[SessionService]:
    service = SessionService(config)
    await service.start()
    try:
        yield service
    finally:
        await service.close()


def chat_body(text: str, *, system: str | None = None) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system else []
    return {"model": "sim-model", "messages": [*messages, {"role": "user", "content": text}]}


def completion(text: str) -> bytes:
    """A non-streaming chat completion body whose answer is ``text``."""
    return orjson.dumps({"object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text},
         "finish_reason": "stop"}]})


async def chat_turn(service: SessionService, session_id: str, n: int,
                    tenant: str = "default") -> bool:
    """One complete request on the session (question q<n>, answer a<n>); degraded?"""
    binding = await service.bind(tenant, session_id, chat_body(f"q{n}"))
    binding.observe_json(completion(f"a{n}"))
    await binding.commit(f"req-{session_id}-{n}")
    return binding.degraded


def turn_numbers(messages: list[dict[str, Any]]) -> list[int]:
    """The n of every q<n> user message, in stored order."""
    return [int(m["content"][1:]) for m in messages if m["role"] == "user"]


async def wait_until(check: Callable[[], bool | Awaitable[bool]], *, within: float,
                     what: str, interval: float = 0.02) -> None:
    """Poll ``check`` until true; fail after ``within`` seconds (a bounded loop)."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not true after {within:g} s")
        await asyncio.sleep(interval)
