"""The admin API, hot reload (admin and SIGHUP) and graceful shutdown (SIGTERM)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from gateway.resilience.breaker import BreakerState
from gateway.sim import SimSettings, answer_text
from tests.gateway_harness import BackendSpec
from tests.gateway_harness import config_text as plain_config
from tests.processes import Process
from tests.resilience_helpers import CHAT, breaker, eventually, inference_requests, post, set_faults
from tests.sse_client import stream

ADMIN_KEY = "admin-key-for-the-tests-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(autouse=True)
def _admin_key(monkeypatch):
    monkeypatch.setenv("GW_TEST_ADMIN_KEY", ADMIN_KEY)


def config_text(*args, extra: str = "", **kwargs) -> str:
    """A configuration with an admin key (the admin API is closed without one)."""
    return plain_config(*args, extra='[auth]\nadmin_key_env = "GW_TEST_ADMIN_KEY"\n' + extra,
                        **kwargs)


async def _gateway_from_file(gateways, path, text):
    path.write_text(text)
    return await gateways(text, source=str(path))


async def test_breaker_admin_endpoints(sim, gateways, http):
    gateway = await gateways(config_text([BackendSpec("a", sim.url)]))
    async with http.post(f"{gateway.url}/admin/breakers/a/open", headers=ADMIN) as response:
        assert response.status == 200
        assert (await response.json())["state"] == "open"
    assert (await post(http, gateway))[0] == 503
    async with http.get(f"{gateway.url}/admin/breakers", headers=ADMIN) as response:
        [snapshot] = (await response.json())["breakers"]
    assert snapshot["name"] == "a" and snapshot["state"] == "open"
    assert snapshot["open_until"] > 100  # the most severe tier: 180 s
    async with http.post(f"{gateway.url}/admin/breakers/a/close", headers=ADMIN) as response:
        assert (await response.json())["state"] == "closed"
    assert (await post(http, gateway))[0] == 200
    async with http.post(f"{gateway.url}/admin/breakers/nope/open", headers=ADMIN) as response:
        assert response.status == 404
    async with http.post(f"{gateway.url}/admin/breakers/a/explode", headers=ADMIN) as response:
        assert response.status == 404


async def test_admin_config_shows_no_secret(sim, gateways, http, monkeypatch):
    monkeypatch.setenv("ADMIN_TEST_KEY", "sk-very-secret")
    gateway = await gateways(config_text(
        [BackendSpec("a", sim.url, extra='api_key_env = "ADMIN_TEST_KEY"')]))
    async with http.get(f"{gateway.url}/admin/config", headers=ADMIN) as response:
        text = await response.text()
    assert "ADMIN_TEST_KEY" in text and "sk-very-secret" not in text
    assert '"max_attempts": 4' in text.replace(":4", ": 4")


async def test_reload_changes_breaker_behaviour_while_a_stream_completes(sims, gateways, http,
                                                                         tmp_path):
    slow = await sims(SimSettings(tokens=20, itl_ms=50))
    path = tmp_path / "gw.toml"
    tiers = ("[breaker]\nmin_calls = 1\n[[breaker.tiers]]\nconsecutive_failures = {n}\n"
             "error_rate = 0.5\nopen_seconds = 30\n")
    text = config_text([BackendSpec("a", slow.url)], retry="max_attempts = 1",
                       extra=tiers.format(n=5))
    gateway = await _gateway_from_file(gateways, path, text)
    in_flight = asyncio.create_task(
        stream(http, f"{gateway.url}/v1/chat/completions", {**CHAT, "stream": True}))
    await eventually(lambda: inference_requests(slow) == 1, within=3, what="stream started")

    path.write_text(text.replace("consecutive_failures = 5", "consecutive_failures = 1"))
    async with http.post(f"{gateway.url}/admin/reload", headers=ADMIN) as response:
        report = await response.json()
    assert response.status == 200 and report["kept"] == ["a"]

    record = await in_flight
    assert record.done_count == 1 and record.text() == answer_text(0, 20)
    await set_faults(http, slow, status=500)
    assert (await post(http, gateway))[0] == 502
    assert breaker(gateway, "a").state is BreakerState.OPEN  # one failure now trips it


async def test_an_invalid_file_is_refused_and_the_running_config_stays(sim, gateways, http,
                                                                       tmp_path):
    path = tmp_path / "gw.toml"
    gateway = await _gateway_from_file(gateways, path, config_text([BackendSpec("a", sim.url)]))
    path.write_text('[timeouts]\nread = "fast"\n')
    async with http.post(f"{gateway.url}/admin/reload", headers=ADMIN) as response:
        assert response.status == 400
        message = (await response.json())["error"]["message"]
    assert 'timeouts.read: expected seconds > 0, got "fast"' in message
    assert (await post(http, gateway))[0] == 200


async def test_reload_adds_and_retires_backends(sims, gateways, http, tmp_path):
    old, new = await sims(), await sims()
    path = tmp_path / "gw.toml"
    gateway = await _gateway_from_file(gateways, path, config_text([BackendSpec("old", old.url)]))
    path.write_text(config_text([BackendSpec("new", new.url)]))
    async with http.post(f"{gateway.url}/admin/reload", headers=ADMIN) as response:
        report = await response.json()
    assert (report["added"], report["retired"]) == (["new"], ["old"])
    for _ in range(5):
        status, _, headers, _ = await post(http, gateway)
        assert (status, headers["X-Gateway-Backend"]) == (200, "new")


def _config_file(tmp_path, sim_url: str, **server: float) -> str:
    path = tmp_path / "gw.toml"
    settings = "".join(f"{k} = {v}\n" for k, v in server.items())
    path.write_text(f"[server]\nport = 0\n{settings}[sessions]\nenabled = false\n"
                    f'[[backends]]\nname = "sim"\nurl = "{sim_url}"\nmodels = ["sim-model"]\n')
    return str(path)


async def test_sigterm_lets_a_stream_in_flight_finish_and_exits_0(sims, tmp_path):
    sim = await sims(SimSettings(tokens=30, itl_ms=50))
    gateway = Process("serve", "--config", _config_file(tmp_path, sim.url,
                                                        drain_seconds=10,
                                                        shutdown_grace_seconds=0.3))
    url = gateway.listening_url("gateway listening on")
    try:
        async with aiohttp.ClientSession() as http:
            in_flight = asyncio.create_task(
                stream(http, f"{url}/v1/chat/completions", {**CHAT, "stream": True}))
            await eventually(lambda: inference_requests(sim) == 1, within=5,
                             what="stream started")
            gateway.proc.send_signal(signal.SIGTERM)
            await eventually(lambda: _not_ready(url), within=2, what="readyz 503")
            record = await in_flight
        assert record.done_count == 1 and record.text() == answer_text(0, 30)
        assert await asyncio.to_thread(gateway.proc.wait, 15) == 0
    finally:
        gateway.stop()


def _replace_in_file(path: str, old: str, new: str) -> None:
    config = Path(path)
    config.write_text(config.read_text().replace(old, new))


def _not_ready(url: str) -> bool:
    import urllib.error
    import urllib.request
    try:
        urllib.request.urlopen(f"{url}/readyz", timeout=1)
    except urllib.error.HTTPError as error:
        return error.code == 503
    except OSError:
        return False
    return False


async def test_sighup_reloads_the_file(sims, tmp_path):
    first, second = await sims(), await sims()
    path = _config_file(tmp_path, first.url)
    gateway = Process("serve", "--config", path)
    url = gateway.listening_url("gateway listening on")
    try:
        _replace_in_file(path, first.url, second.url)
        gateway.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        async with aiohttp.ClientSession() as http:
            while inference_requests(second) == 0:
                assert time.monotonic() < deadline, "SIGHUP did not reload"
                async with http.post(f"{url}/v1/chat/completions", json=CHAT) as response:
                    assert response.status == 200
    finally:
        assert gateway.stop() == 0


async def test_the_admin_api_needs_the_admin_key(sim, gateways, http):
    gateway = await gateways(config_text([BackendSpec("a", sim.url)]))
    for headers in ({}, {"Authorization": "Bearer wrong-key-wrong-key-wrong"}):
        async with http.post(f"{gateway.url}/admin/breakers/a/open",
                             headers=headers) as response:
            assert response.status == 401
    assert breaker(gateway, "a").state is BreakerState.CLOSED
    closed = await gateways(plain_config([BackendSpec("a", sim.url)]))
    async with http.get(f"{closed.url}/admin/breakers", headers=ADMIN) as response:
        assert response.status == 403  # no admin key configured: the admin API is closed
