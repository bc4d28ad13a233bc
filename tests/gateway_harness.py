"""Running the gateway in-process on a real loopback port, for tests.

Tests talk to the gateway over HTTP exactly as a client would; only the
process boundary is skipped, so a test can also look at the app's state.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.app import build_app
from gateway.config import GatewayConfig, parse_config


@dataclass(frozen=True)
class BackendSpec:
    name: str
    url: str
    models: tuple[str, ...] = ("sim-model",)
    extra: str = ""
    """Extra TOML lines for this [[backends]] table."""


def config_text(backends: Iterable[BackendSpec], *, timeouts: str = "", server: str = "",
                retry: str = "", extra: str = "") -> str:
    """A complete configuration file for the given backends."""
    parts = ["[server]", 'host = "127.0.0.1"', "port = 0", server,
             "[timeouts]", timeouts, "[retry]", retry, extra]
    if "[archive]" not in extra:
        # The embedded default archives to ./gateway-archive.db: not in tests.
        parts += ["[archive]", "enabled = false"]
    for spec in backends:
        models = ", ".join(f'"{m}"' for m in spec.models)
        parts += ["[[backends]]", f'name = "{spec.name}"', f'url = "{spec.url}"',
                  f"models = [{models}]", spec.extra]
    return "\n".join(parts) + "\n"


class RunningGateway:
    def __init__(self, config: GatewayConfig, **app_options: Any) -> None:
        self.config = config
        self.app = build_app(config, **app_options)
        self._runner = web.AppRunner(self.app, access_log=None)
        self.url = ""

    async def start(self) -> RunningGateway:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()


async def start_gateway(text: str, source: str = "test.toml") -> RunningGateway:
    """A gateway for ``text``; ``source`` is the file a reload would re-read."""
    return await RunningGateway(parse_config(text, source=source)).start()


def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Blackhole:
    """A loopback listener whose accept queue is full: new connects hang.

    Linux drops the SYN of a connection when the listen backlog is full, so a
    client's connect neither succeeds nor is refused: the way to exercise a
    connect timeout without leaving loopback.
    """

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(0)
        self.port = self._listener.getsockname()[1]
        self._fillers: list[socket.socket] = []
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", self.port))
            self._fillers.append(filler)

    def close(self) -> None:
        for sock in self._fillers:
            sock.close()
        self._listener.close()
