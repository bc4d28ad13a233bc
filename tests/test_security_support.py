"""Helpers for the security tests: keys, config text, and a real gateway with security on.

No tests here. The gateway is the one ``gateway.app.build_app`` builds; until
``build_app`` installs security itself (the lead wires ``[auth]``, ``[ratelimit]``
and ``[limits]`` into ``GatewayConfig``), :class:`SecureGateway` installs it with
:func:`gateway.security.install_security`, the same call ``build_app`` will
make. Once wired, it checks that ``build_app`` did.
"""

from __future__ import annotations

import asyncio
import hashlib
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

import pytest
from aiohttp import web

from gateway.app import build_app
from gateway.config import parse_config
from gateway.configreader import ConfigError, Table
from gateway.security import SECURITY, install_security, parse_security, server_limit_kwargs
from gateway.security.middleware import SecurityState
from gateway.security.settings import SecurityConfig

ALPHA_KEY = "sk-alpha-6f1c2a9e4b7d3f8a0c5e9b2d"
BETA_KEY = "sk-beta-0d8e7c6b5a4f3e2d1c0b9a8f"
ADMIN_KEY = "adm-3e9f1b7c5d2a8e6f4b0c9d1a"
SOURCE = "test.toml"


def sha256_hex(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class KeySpec:
    name: str
    tenant: str
    key: str
    rpm: int | None = None
    tpm: int | None = None
    env: str | None = None
    """Configure the key through this environment variable instead of its hash."""


ALPHA = KeySpec("alpha", "tenant-a", ALPHA_KEY)
BETA = KeySpec("beta", "tenant-b", BETA_KEY)


def auth_toml(keys: Iterable[KeySpec] = (ALPHA, BETA), *, enabled: bool = True,
              admin: str | None = ADMIN_KEY, ratelimit: str = "", limits: str = "") -> str:
    """``[auth]`` (with keys by hash or env), ``[ratelimit]`` and ``[limits]`` text."""
    lines = ["[auth]", f"enabled = {'true' if enabled else 'false'}"]
    if admin:
        lines.append(f'admin_key_sha256 = "{sha256_hex(admin)}"')
    for spec in keys:
        lines += ["[[auth.keys]]", f'name = "{spec.name}"', f'tenant = "{spec.tenant}"']
        lines.append(f'key_env = "{spec.env}"' if spec.env
                     else f'sha256 = "{sha256_hex(spec.key)}"')
        if spec.rpm is not None:
            lines.append(f"requests_per_minute = {spec.rpm}")
        if spec.tpm is not None:
            lines.append(f"tokens_per_minute = {spec.tpm}")
    lines += ["[ratelimit]", ratelimit, "[limits]", limits]
    return "\n".join(lines) + "\n"


def security_from_text(text: str) -> SecurityConfig:
    root = Table(SOURCE, "", tomllib.loads(text))
    config = parse_security(root)
    root.finish()
    return config


def security_is_wired() -> bool:
    """Whether GatewayConfig reads ``[auth]`` (and build_app installs security) yet."""
    try:
        parse_config('[[backends]]\nname = "b"\nurl = "http://127.0.0.1:9"\n'
                     'models = ["m"]\n[auth]\nenabled = false\n', source=SOURCE)
    except ConfigError:
        return False
    return True


WIRED = security_is_wired()
needs_wiring = pytest.mark.skipif(
    not WIRED, reason="needs the lead's wiring of gateway.security into build_app/Proxy")


class SecureGateway:
    """A gateway with security, on a real loopback port (like tests.gateway_harness)."""

    def __init__(self, gateway_text: str, security_text: str,
                 setup: Callable[[web.Application], None] | None = None) -> None:
        self.security = security_from_text(security_text)
        if WIRED:
            self.app = build_app(parse_config(gateway_text + security_text, source=SOURCE))
            assert SECURITY in self.app, "build_app must call install_security"
        else:
            self.app = build_app(parse_config(gateway_text, source=SOURCE))
            install_security(self.app, self.security, source=SOURCE, host="127.0.0.1")
        if setup is not None:
            setup(self.app)  # e.g. test-only routes, before the app is frozen
        self._runner = web.AppRunner(self.app, access_log=None,
                                     **server_limit_kwargs(self.security.limits))
        self.url = ""
        self.port = 0

    @property
    def state(self) -> SecurityState:
        return self.app[SECURITY].state

    async def start(self) -> SecureGateway:
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()


StartSecure = Callable[..., Awaitable[SecureGateway]]


@pytest.fixture
async def secure_gateways() -> AsyncIterator[StartSecure]:
    """Start secured gateways from (gateway text, security text); all stopped at the end."""
    started: list[SecureGateway] = []

    async def start(gateway_text: str, security_text: str | None = None,
                    setup: Callable[[web.Application], None] | None = None) -> SecureGateway:
        gateway = await SecureGateway(gateway_text, security_text or auth_toml(), setup).start()
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        await gateway.stop()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}


async def raw_exchange(port: int, data: bytes, wait_s: float = 3.0) -> bytes:
    """Send raw bytes on a fresh connection; everything the server answers until it
    closes (or ``wait_s`` seconds have passed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        chunks = []
        try:
            async with asyncio.timeout(wait_s):
                while chunk := await reader.read(65536):
                    chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)
    finally:
        writer.close()


def status_of(raw: bytes) -> int:
    """The status code of the first response in raw bytes (0 when there is none)."""
    parts = raw.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
