"""deploy/compose.yaml: the services, mounts and host names agree with each other and with
the gateway's config, the Redis Cluster init script forms a 3+3 cluster from the compose node
configuration, and the stack's load generator drives a real gateway and simulator; see
tests/deploy_support.py for the whole plan."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from gateway.sim import SimSettings, start_sim
from tests.deploy_support import (
    COMPOSE_CONFIG,
    DEPLOY,
    GATEWAYS,
    _bind_mounts,
    compose,
    free_port,
    host_port,
    pending_blocks,
    services,
    stop_process,
    toml,
)
from tests.gateway_harness import BackendSpec, config_text, start_gateway


def free_cluster_port() -> int:
    """A free port whose Redis Cluster bus port (port + 10000) is valid and free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise AssertionError("no free port pair for a Redis Cluster node")


# --- compose ---------------------------------------------------------------------------------

REQUIRED_SERVICES = ["lb", "gateway-1", "gateway-2", "sim-1", "sim-2",
                     *(f"redis-{i}" for i in range(1, 7)), "redis-cluster-init", "tidb",
                     "otel-collector", "prometheus", "grafana"]


def test_compose_has_every_service_of_the_issue() -> None:
    assert [name for name in REQUIRED_SERVICES if name not in services()] == []


def test_compose_references_exist() -> None:
    """Bind-mounted files, build contexts and depends_on targets all exist."""
    all_services = services()
    for name, service in all_services.items():
        for source, _ in _bind_mounts(service):
            assert (DEPLOY / source).exists(), f"{name}: mounts missing {source}"
        if "build" in service:
            context = DEPLOY / service["build"]["context"]
            assert (context / service["build"]["dockerfile"]).is_file(), name
        depends = service.get("depends_on", [])
        for target in depends if isinstance(depends, list) else depends.keys():
            assert target in all_services, f"{name} depends on unknown {target}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose().get("volumes", {}), f"{name}: volume {source}"


def test_gateway_replicas_run_the_image_with_the_compose_config() -> None:
    config = toml(COMPOSE_CONFIG)["server"]
    for name in GATEWAYS:
        service = services()[name]
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert ("./config.compose.toml", "/etc/gateway/config.toml") in _bind_mounts(service)
        environment = service["environment"]
        assert environment["GATEWAY_CONFIG"] == "/etc/gateway/config.toml"
        assert int(environment["GATEWAY_WORKERS"]) == config["workers"]
        grace = int(str(service["stop_grace_period"]).removesuffix("s"))
        assert grace > config["drain_seconds"] + config["shutdown_grace_seconds"]


def test_compose_config_names_compose_services() -> None:
    """Every host the gateway's config names is a service, on the port it listens on."""
    config = toml(COMPOSE_CONFIG)
    all_services = services()
    for backend in config["backends"]:
        host, port = host_port(backend["url"])
        assert host in all_services, backend["name"]
        entrypoint = all_services[host]["entrypoint"]
        assert entrypoint[:2] == ["gateway", "sim"]
        assert entrypoint[entrypoint.index("--port") + 1] == str(port)
    nodes = config["sessions"]["nodes"]
    assert sorted(host_port(node)[0] for node in nodes) == [f"redis-{i}" for i in range(1, 7)]
    assert {host_port(node)[1] for node in nodes} == {6379}
    assert config["breaker"]["shared"] is True
    assert urlsplit(config["breaker"]["redis_url"]).hostname in all_services
    otlp = config["telemetry"]["otlp_endpoint"]
    assert config["telemetry"]["traces_exporter"] == "otlp"
    assert urlsplit(otlp).hostname == "otel-collector" and urlsplit(otlp).port == 4318
    # The archive block, commented until the archive lands, points at the TiDB service.
    archive = tomllib.loads("\n".join(pending_blocks(
        COMPOSE_CONFIG.read_text(encoding="utf-8")).get("archive", [])))
    if "archive" in config:
        archive = {"archive": config["archive"]}
    assert archive["archive"]["url"] == "mysql+asyncmy://root@tidb:4000/gateway"
    assert archive["archive"]["dialect"] == "tidb"
    assert "tidb" in all_services


def test_redis_cluster_nodes_and_init_job() -> None:
    all_services = services()
    conf = (DEPLOY / "redis" / "redis-cluster.conf").read_text(encoding="utf-8")
    assert re.search(r"^cluster-enabled yes$", conf, flags=re.MULTILINE)
    for i in range(1, 7):
        node = all_services[f"redis-{i}"]
        assert node["command"][-2:] == ["--cluster-announce-hostname", f"redis-{i}"]
        assert ("./redis/redis-cluster.conf", node["command"][1]) in _bind_mounts(node)
    init = all_services["redis-cluster-init"]
    assert init["command"][2:] == [f"redis-{i}:6379" for i in range(1, 7)]
    assert all(init["depends_on"][f"redis-{i}"]["condition"] == "service_healthy"
               for i in range(1, 7))
    for name in GATEWAYS:
        assert all_services[name]["depends_on"]["redis-cluster-init"]["condition"] == \
            "service_completed_successfully"


def test_load_balancer_health_checks_both_replicas() -> None:
    cfg = (DEPLOY / "haproxy" / "haproxy.cfg").read_text(encoding="utf-8")
    servers = re.findall(r"^\s*server\s+\S+\s+(\S+)", cfg, flags=re.MULTILINE)
    assert sorted(servers) == [f"{name}:8080" for name in GATEWAYS]
    assert "uri /readyz" in cfg and "http-check expect status 200" in cfg
    assert ("./haproxy/haproxy.cfg", "/usr/local/etc/haproxy/haproxy.cfg") in \
        _bind_mounts(services()["lb"])


def test_load_generator_targets_the_balancer_and_a_simulator() -> None:
    environment = services()["loadgen"]["environment"]
    assert urlsplit(environment["LOADGEN_URL"]).hostname == "lb"
    assert urlsplit(environment["LOADGEN_FAULT_URL"]).hostname in ("sim-1", "sim-2")
    assert ("./loadgen", "/loadgen") in _bind_mounts(services()["loadgen"])


# --- Redis Cluster init job ------------------------------------------------------------------


def test_cluster_init_forms_a_cluster_from_the_node_config(tmp_path: Path) -> None:
    """deploy/redis: six nodes with redis-cluster.conf, then cluster-init.sh, twice."""
    redis_server, redis_cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not redis_server or not redis_cli:
        pytest.skip("redis-server / redis-cli not installed (scripts/ensure-services.sh)")
    ports = [free_cluster_port() for _ in range(6)]
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        for port in ports:
            data = tmp_path / str(port)
            data.mkdir()
            nodes.append(subprocess.Popen(
                [redis_server, str(DEPLOY / "redis" / "redis-cluster.conf"), "--port", str(port),
                 "--bind", "127.0.0.1", "--dir", str(data),
                 "--cluster-config-file", str(data / "nodes.conf"),
                 "--cluster-announce-hostname", "localhost", "--appendonly", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for port in ports:
            deadline = time.monotonic() + 10
            while subprocess.run([redis_cli, "-p", str(port), "ping"], capture_output=True,
                                 text=True).stdout.strip() != "PONG":
                assert time.monotonic() < deadline, f"redis on {port} did not start"
                time.sleep(0.05)
        script = [shutil.which("sh") or "/bin/sh", str(DEPLOY / "redis" / "cluster-init.sh"),
                  *(f"localhost:{port}" for port in ports)]
        first = subprocess.run(script, capture_output=True, text=True, timeout=90)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "creating the cluster" in first.stdout
        again = subprocess.run(script, capture_output=True, text=True, timeout=90)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "already formed" in again.stdout
        roles = [subprocess.run([redis_cli, "-p", str(port), "role"], capture_output=True,
                                text=True).stdout.split()[0] for port in ports]
        assert sorted(roles) == ["master"] * 3 + ["slave"] * 3
        slots = subprocess.run([redis_cli, "-p", str(ports[0]), "cluster", "shards"],
                               capture_output=True, text=True).stdout
        assert "localhost" in slots  # clients are given the announced host names
    finally:
        for node in nodes:
            stop_process(node)


# --- load generator --------------------------------------------------------------------------


def _load_loadgen() -> Any:
    spec = importlib.util.spec_from_file_location("deploy_loadgen",
                                                  DEPLOY / "loadgen" / "loadgen.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_load_generator_drives_a_gateway_and_injects_faults() -> None:
    loadgen = _load_loadgen()
    sims = [await start_sim(SimSettings(tokens=4)), await start_sim(SimSettings(tokens=4))]
    gateway = await start_gateway(config_text(
        [BackendSpec("sim-1", sims[0].url), BackendSpec("sim-2", sims[1].url)]))
    try:
        settings = loadgen.Settings.from_env({
            "LOADGEN_URL": gateway.url, "LOADGEN_MODEL": "sim-model",
            "LOADGEN_CONCURRENCY": "3", "LOADGEN_PAUSE": "0.02",
            "LOADGEN_FAULT_URL": sims[1].url, "LOADGEN_FAULT_EVERY": "0.6",
            "LOADGEN_FAULT_FOR": "0.3", "LOADGEN_REPORT_EVERY": "60",
            "LOADGEN_DURATION": "1.5"})
        counts = await asyncio.wait_for(loadgen.LoadGen(settings).run(), timeout=20)
        async with aiohttp.ClientSession() as http, \
                http.get(f"{sims[1].url}/sim/state") as response:
            state = await response.json()
    finally:
        await gateway.stop()
        for sim in sims:
            await sim.stop()
    assert counts["200"] >= 10, counts
    assert counts["fault_faults_200"] >= 1 and counts["fault_reset_200"] >= 1, counts
    assert not any(key.startswith("fault_") and not key.endswith("_200") for key in counts)
    assert state["settings"]["faults"]["status"] is None, "the fault was not reset at the end"
