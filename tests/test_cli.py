"""The ``gateway`` command as a user runs it: real processes, real ports."""

from __future__ import annotations

import subprocess
import sys

import aiohttp

from tests.gateway_harness import closed_port
from tests.processes import ROOT, Process

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)


def test_check_config_accepts_the_default_file():
    result = _run("check-config")
    assert result.returncode == 0, result.stderr
    assert "config.toml: OK" in result.stdout
    assert "backend sim-1: http://127.0.0.1:8001" in result.stdout


def test_check_config_rejects_a_bad_file_with_status_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[timeouts]\nread = "fast"\n')
    result = _run("check-config", str(bad))
    assert result.returncode == 2
    assert f'{bad}: timeouts.read: expected seconds > 0, got "fast"' in result.stderr


def test_serve_refuses_a_missing_secret(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[[backends]]\nname = "a"\nurl = "http://127.0.0.1:9"\nmodels = ["m"]\n'
                      'api_key_env = "GW_ABSENT_KEY_FOR_TEST"\n')
    result = _run("serve", "--config", str(config), "--port", "0")
    assert result.returncode == 2
    assert "GW_ABSENT_KEY_FOR_TEST is not set" in result.stderr


def _config_for(sim_url: str, port: int = 0, workers: int = 1, sessions: bool = True) -> str:
    return (f'[server]\nport = {port}\nworkers = {workers}\n'
            f"[sessions]\nenabled = {str(sessions).lower()}\n[archive]\nenabled = false\n"
            f'[[backends]]\nname = "sim"\nurl = "{sim_url}"\nmodels = ["sim-model"]\n')


def test_in_process_sessions_are_refused_with_several_workers(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(_config_for("http://127.0.0.1:9", port=closed_port()))
    result = _run("serve", "--config", str(config), "--workers", "2")
    assert result.returncode == 2
    assert 'sessions.store = "memory" keeps sessions inside one process' in result.stderr


async def test_sim_and_serve_commands_work_end_to_end(tmp_path):
    sim = Process("sim", "--port", "0", "--tokens", "4")
    try:
        sim_url = sim.listening_url("sim listening on")
        config = tmp_path / "gw.toml"
        config.write_text(_config_for(sim_url))
        gateway = Process("serve", env={"GATEWAY_CONFIG": str(config)})
        try:
            url = gateway.listening_url("gateway listening on")
            async with aiohttp.ClientSession() as http, http.post(
                    f"{url}/v1/chat/completions", json=BODY) as response:
                assert response.status == 200
                body = await response.json()
            assert len(body["choices"][0]["message"]["content"].split()) == 4
        finally:
            assert gateway.stop() == 0
    finally:
        sim.stop()


async def test_workers_share_one_port(tmp_path):
    sim = Process("sim", "--port", "0")
    try:
        sim_url = sim.listening_url("sim listening on")
        port = closed_port()
        config = tmp_path / "gw.toml"
        config.write_text(_config_for(sim_url, port=port, sessions=False))
        gateway = Process("serve", "--config", str(config), "--workers", "2")
        try:
            gateway.wait_for_line("gateway listening on")
            gateway.wait_for_line("gateway listening on")
            async with aiohttp.ClientSession() as http:
                for _ in range(20):
                    async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                         json=BODY) as response:
                        assert response.status == 200
        finally:
            assert gateway.stop() == 0
    finally:
        sim.stop()
