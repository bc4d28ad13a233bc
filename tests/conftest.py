from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from gateway.sim import SimServer, SimSettings, start_sim
from tests.fixtures_services import *  # noqa: F403 - real Redis / MariaDB fixtures
from tests.gateway_harness import RunningGateway, start_gateway


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    server = await start_sim(SimSettings(tokens=8))
    yield server
    await server.stop()


@pytest.fixture
async def sims() -> AsyncIterator[Callable[..., Awaitable[SimServer]]]:
    """Start as many simulators as a test needs; all are stopped at the end."""
    started: list[SimServer] = []

    async def start(settings: SimSettings | None = None) -> SimServer:
        server = await start_sim(settings or SimSettings(tokens=8))
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()


@pytest.fixture
async def gateways() -> AsyncIterator[Callable[..., Awaitable[RunningGateway]]]:
    """Start gateways from configuration text; all are stopped at the end."""
    started: list[RunningGateway] = []

    async def start(text: str, source: str = "test.toml") -> RunningGateway:
        gateway = await start_gateway(text, source)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        await gateway.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
