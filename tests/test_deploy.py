"""deploy/ is checked, not just written (issue 9).

There is no Docker engine here, so what can be checked without one is:

- every YAML and JSON file parses, and the files agree with each other: compose
  services, mounts, host names in the gateway's config, HAProxy and Prometheus
  targets, Grafana datasources, Kubernetes selectors, ports, probes and Secrets;
- the gateway configurations pass ``gateway check-config`` (the real CLI);
- the alert rules pass ``promtool check rules`` and their unit tests
  (``promtool test rules``), the Prometheus config ``promtool check config``,
  every dashboard query parses as PromQL, and HAProxy's config ``haproxy -c``;
- every metric name in the dashboard and the alerts is one the gateway exports,
  read from a live ``/metrics``;
- the image's pieces work outside Docker: the build context builds the package
  with the README's install step, the entrypoint runs ``gateway serve`` with
  workers from the environment and drains on SIGTERM, the HEALTHCHECK command
  passes against it, and the Redis Cluster init script forms a 3+3 cluster from
  the compose node configuration;
- the compose stack's load generator drives a real gateway and simulator.

promtool and haproxy come from Debian's ``prometheus`` and ``haproxy`` packages:
when missing and running as root, they are installed once per session (without
starting the services), otherwise their tests are skipped with the reason.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from gateway.sim import SimSettings, start_sim
from gateway.telemetry import metrics as metrics_module
from tests.gateway_harness import BackendSpec, config_text, start_gateway

yaml = pytest.importorskip(
    "yaml", reason="PyYAML is needed to read deploy/ (add pyyaml to the dev extra)")

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "compose.yaml"
COMPOSE_CONFIG = DEPLOY / "config.compose.toml"
K8S = DEPLOY / "k8s"
K8S_CONFIG = K8S / "config.k8s.toml"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
DASHBOARD = DEPLOY / "grafana" / "gateway.json"
DOCKERFILE = DEPLOY / "Dockerfile"
ENTRYPOINT = DEPLOY / "docker-entrypoint.sh"
GATEWAY_CONFIGS = (COMPOSE_CONFIG, K8S_CONFIG)

# Tables kept commented in the deploy configs (with a TODO) until check-config accepts them.
PENDING_SECTIONS = ("archive", "telemetry", "auth")
SYSTEM_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin",
                               "/sbin"])
DEBIAN_TOOLS = {"promtool": "prometheus", "haproxy": "haproxy"}
POLICY_RC = Path("/usr/sbin/policy-rc.d")
TOOL_INSTALL_TIMEOUT = 900  # the first test to use a tool may install it (apt)


# --- helpers -----------------------------------------------------------------------------


def load_yaml_docs(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
            if doc is not None]


def load_yaml(path: Path) -> Any:
    docs = load_yaml_docs(path)
    assert len(docs) == 1, f"{path}: expected one YAML document, got {len(docs)}"
    return docs[0]


def gateway_cli() -> list[str]:
    """The installed ``gateway`` console script beside this interpreter, else ``-m``."""
    script = Path(sys.executable).with_name("gateway")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway"]


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_CONFIG"}
    return subprocess.run([*gateway_cli(), "check-config", str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE_FILE)


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def toml(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def host_port(url_or_address: str) -> tuple[str, int]:
    if "://" in url_or_address:
        parts = urlsplit(url_or_address)
        assert parts.hostname and parts.port, url_or_address
        return parts.hostname, parts.port
    host, _, port = url_or_address.rpartition(":")
    return host, int(port)


def pending_blocks(text: str) -> dict[str, list[str]]:
    """The commented ``# [section]`` blocks of a config file, by section, uncommented."""
    lines = text.splitlines()
    blocks: dict[str, list[str]] = {}
    for index, line in enumerate(lines):
        match = re.fullmatch(r"# \[(\w+)\]", line)
        if not match:
            continue
        block: list[str] = []
        for follower in lines[index:]:
            if not follower.startswith("# "):
                break
            block.append(follower[2:])
        blocks[match.group(1)] = block
    return blocks


def stop_process(process: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


# --- PromQL metric names ------------------------------------------------------------------

_PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
                 "group_right", "offset", "bool", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric (and recording rule) names an expression selects.

    Strings, label matchers, ranges, grouping clauses and Grafana variables are
    removed first; what remains and is not a function call or a keyword is a name.
    """
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    text = re.sub(r"'(?:\\.|[^'\\])*'", "''", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.])[A-Za-z_:][\w:]*", text):
        if text[match.end():].lstrip().startswith("("):
            continue  # a function
        if match.group().lower() in _PROMQL_WORDS:
            continue
        names.add(match.group())
    return names


def grafana_variable_metric_names(query: str) -> set[str]:
    """``label_values(metric{...}, label)`` selects ``metric``; ``label_values(label)`` none."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query)
    if match:
        return promql_metric_names(match.group(1))
    if query.strip().startswith("label_values("):
        return set()
    return promql_metric_names(query)


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in alert_rules() if "record" in rule}


def dashboard_panels() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    for panel in json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in dashboard_panels()
            for target in panel.get("targets", []) if target.get("expr")]


def dashboard_variable_queries() -> list[str]:
    queries = []
    for variable in json.loads(DASHBOARD.read_text(encoding="utf-8"))["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if variable.get("type") == "query" and query:
            queries.append(query)
    return queries


def names_used() -> dict[str, set[str]]:
    """Every name the dashboard and the alerts select, and where it is used."""
    used: dict[str, set[str]] = {}
    for expr in dashboard_exprs():
        for name in promql_metric_names(expr):
            used.setdefault(name, set()).add("deploy/grafana/gateway.json")
    for query in dashboard_variable_queries():
        for name in grafana_variable_metric_names(query):
            used.setdefault(name, set()).add("deploy/grafana/gateway.json (variables)")
    for rule in alert_rules():
        for name in promql_metric_names(rule["expr"]):
            used.setdefault(name, set()).add("deploy/prometheus/alerts.yaml")
    return used


def gateway_names_used() -> dict[str, set[str]]:
    """The names that must come from the gateway: all but recording rules and ``up``."""
    own = recorded_names() | {"up"}  # ``up`` is Prometheus' own series for each target
    return {name: where for name, where in names_used().items() if name not in own}


def _series_names(name: str, kind: str) -> set[str]:
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    if kind == "counter":
        base = name.removesuffix("_total")
        return {f"{base}_total"}
    return {name}


def exposition_names(text: str) -> set[str]:
    """Series names of a Prometheus text exposition, including families without samples."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names |= _series_names(name, kind.strip())
        elif line and not line.startswith("#"):
            match = re.match(r"[A-Za-z_:][\w:]*", line)
            if match:
                names.add(match.group())
    return names


def declared_names() -> set[str]:
    """The names of the table in gateway/telemetry/metrics.py's docstring (the contract)."""
    doc = metrics_module.__doc__ or ""
    rows = re.findall(r"^\| ``(\w+)`` \| (\w+) \|", doc, flags=re.MULTILINE)
    assert rows, "no metrics table found in gateway/telemetry/metrics.py"
    names: set[str] = set()
    for name, kind in rows:
        names |= _series_names(name, kind)
    return names


def registry_names() -> set[str]:
    """What a fresh :class:`GatewayMetrics` exposes (the code behind the table)."""
    metrics = metrics_module.GatewayMetrics(models=["m"], backends=["b"])
    body, _ = metrics_module.render_metrics(metrics)
    return exposition_names(body.decode())


# --- Debian tools: promtool and haproxy ------------------------------------------------------


def find_tool(name: str) -> str | None:
    return shutil.which(name, path=SYSTEM_PATH)


def _apt_install(packages: list[str]) -> str:
    """Install Debian packages without letting their scripts start services.

    As scripts/ensure-services.sh does: a policy-rc.d answering 101 while apt
    runs, the previous one (if any) restored afterwards. Returns "" or an error.
    """
    backup = POLICY_RC.read_bytes() if POLICY_RC.exists() else None
    mode = POLICY_RC.stat().st_mode if POLICY_RC.exists() else 0o755
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    try:
        POLICY_RC.write_text("#!/bin/sh\n# written by tests/test_deploy.py while installing "
                             "packages\nexit 101\n")
        POLICY_RC.chmod(0o755)
        result = subprocess.run(command, env=env, capture_output=True, text=True,
                                timeout=TOOL_INSTALL_TIMEOUT)
        if result.returncode != 0:  # the package lists may be missing or stale
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True,
                           timeout=TOOL_INSTALL_TIMEOUT)
            result = subprocess.run(command, env=env, capture_output=True, text=True,
                                    timeout=TOOL_INSTALL_TIMEOUT)
        return "" if result.returncode == 0 else (result.stderr or result.stdout)[-2000:]
    except (OSError, subprocess.TimeoutExpired) as error:
        return repr(error)
    finally:
        if backup is None:
            POLICY_RC.unlink(missing_ok=True)
        else:
            POLICY_RC.write_bytes(backup)
            POLICY_RC.chmod(mode)


@pytest.fixture(scope="session")
def debian_tools() -> dict[str, str]:
    """Paths of promtool and haproxy, installed once when missing and running as root."""
    missing = sorted({DEBIAN_TOOLS[tool] for tool in DEBIAN_TOOLS if not find_tool(tool)})
    problem = ""
    if missing:
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            problem = (f"not root (or no apt-get): install Debian's {' '.join(missing)} "
                       f"for these checks")
        else:
            problem = _apt_install(missing)
    tools = {tool: find_tool(tool) or "" for tool in DEBIAN_TOOLS}
    for tool, path in tools.items():
        if not path:
            tools[tool] = ""
            tools[f"{tool}_why"] = (f"{tool} not found (Debian package {DEBIAN_TOOLS[tool]}): "
                                    f"{problem or 'install failed'}")
    return tools


def tool(tools: dict[str, str], name: str) -> str:
    if not tools.get(name):
        pytest.skip(tools.get(f"{name}_why", f"{name} not found"))
    return tools[name]


# --- every file parses ------------------------------------------------------------------------

YAML_FILES = sorted(p for ext in ("*.yaml", "*.yml") for p in DEPLOY.rglob(ext))
JSON_FILES = sorted(DEPLOY.rglob("*.json"))


def test_deploy_holds_the_files_of_the_issue() -> None:
    expected = ["Dockerfile", "compose.yaml", "config.compose.toml", "k8s/kustomization.yaml",
                "k8s/deployment.yaml", "k8s/service.yaml", "k8s/hpa.yaml", "k8s/pdb.yaml",
                "k8s/config.k8s.toml", "grafana/gateway.json", "prometheus/alerts.yaml",
                "prometheus/prometheus.yml", "haproxy/haproxy.cfg", "otel/collector.yaml"]
    assert [name for name in expected if not (DEPLOY / name).is_file()] == []
    assert len(YAML_FILES) >= 15 and JSON_FILES


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path: Path) -> None:
    docs = load_yaml_docs(path)
    assert docs, f"{path}: no YAML document"
    assert all(isinstance(doc, dict) for doc in docs), f"{path}: a document is not a mapping"


@pytest.mark.parametrize("path", JSON_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_json_file_parses(path: Path) -> None:
    assert isinstance(json.loads(path.read_text(encoding="utf-8")), dict)


# --- gateway configurations ---------------------------------------------------------------------


@pytest.mark.parametrize("path", GATEWAY_CONFIGS, ids=lambda p: p.name)
def test_config_passes_check_config(path: Path) -> None:
    result = check_config(path)
    assert result.returncode == 0, result.stderr
    assert f"{path}: OK" in result.stdout


class SectionNotAcceptedYet(AssertionError):
    """check-config still rejects a table kept commented with a TODO."""


PENDING_CASES = [(path, section) for path in GATEWAY_CONFIGS
                 for section in pending_blocks(path.read_text(encoding="utf-8"))]


def test_commented_tables_are_only_the_pending_ones_with_a_todo() -> None:
    for path in GATEWAY_CONFIGS:
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for section in pending_blocks(text):
            assert section in PENDING_SECTIONS, f"{path}: [{section}] is commented out"
            header = lines.index(f"# [{section}]")
            assert any("TODO" in line for line in lines[max(0, header - 4):header]), (
                f"{path}: the commented [{section}] needs a TODO saying when it is enabled")


@pytest.mark.parametrize(("path", "section"), PENDING_CASES,
                         ids=[f"{p.name}-{s}" for p, s in PENDING_CASES])
def test_commented_table_passes_check_config_once_it_lands(
        path: Path, section: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A commented table, uncommented, must pass check-config once its feature lands.

    Until then check-config rejects it as an unknown key: an expected failure. When
    this passes (XPASS), the feature has landed: uncomment the block in the file.
    """
    request.applymarker(pytest.mark.xfail(
        raises=SectionNotAcceptedYet, strict=False,
        reason=f"[{section}] not accepted by check-config yet; when this passes, uncomment "
               f"it in {path.relative_to(ROOT)}"))
    text = path.read_text(encoding="utf-8")
    block = pending_blocks(text)[section]
    candidate = tmp_path / path.name
    candidate.write_text(text + "\n" + "\n".join(block) + "\n", encoding="utf-8")
    result = check_config(candidate)
    if result.returncode != 0 and re.search(rf": {section}: unknown key", result.stderr):
        raise SectionNotAcceptedYet(result.stderr)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", GATEWAY_CONFIGS, ids=lambda p: p.name)
def test_cluster_sessions_use_enough_buckets(path: Path) -> None:
    sessions = toml(path)["sessions"]
    assert sessions["store"] == "cluster"
    assert sessions["buckets"] >= 1024


# --- compose ------------------------------------------------------------------------------

REQUIRED_SERVICES = ["lb", "gateway-1", "gateway-2", "sim-1", "sim-2",
                     *(f"redis-{i}" for i in range(1, 7)), "redis-cluster-init", "tidb",
                     "otel-collector", "prometheus", "grafana"]
GATEWAYS = ("gateway-1", "gateway-2")


def test_compose_has_every_service_of_the_issue() -> None:
    assert [name for name in REQUIRED_SERVICES if name not in services()] == []


def _bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2] if isinstance(volume, str) else (
            volume["source"], volume["target"])
        if source.startswith((".", "/")):
            mounts.append((source, target))
    return mounts


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


def test_prometheus_scrapes_both_replicas_and_loads_the_alerts() -> None:
    config = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = [t for static in jobs["gateway"]["static_configs"] for t in static["targets"]]
    assert sorted(targets) == [f"{name}:8080" for name in GATEWAYS]
    assert config["rule_files"] == ["alerts.yaml"]
    mounts = dict(_bind_mounts(services()["prometheus"]))
    assert mounts["./prometheus/alerts.yaml"] == "/etc/prometheus/alerts.yaml"
    assert mounts["./prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"


def test_grafana_provisions_the_dashboard_and_its_datasource() -> None:
    provisioning = DEPLOY / "grafana" / "provisioning"
    datasources = load_yaml(provisioning / "datasources" / "datasources.yaml")["datasources"]
    by_uid = {source["uid"]: source for source in datasources}
    used = {json.dumps(panel["datasource"], sort_keys=True) for panel in dashboard_panels()
            if "datasource" in panel}
    for entry in used:
        assert json.loads(entry)["uid"] in by_uid
    assert urlsplit(by_uid["prometheus"]["url"]).hostname == "prometheus"
    provider = load_yaml(provisioning / "dashboards" / "dashboards.yaml")["providers"][0]
    mounts = dict(_bind_mounts(services()["grafana"]))
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    assert Path(mounts["./grafana/gateway.json"]).parent == Path(provider["options"]["path"])


def test_collector_receives_on_the_configured_endpoint() -> None:
    collector = load_yaml(DEPLOY / "otel" / "collector.yaml")
    http = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert http.endswith(":4318")
    pipeline = collector["service"]["pipelines"]["traces"]
    assert pipeline["receivers"] == ["otlp"]
    for exporter in pipeline["exporters"]:
        endpoint = collector["exporters"][exporter].get("endpoint")
        if endpoint:
            assert host_port(endpoint)[0] in services()


def test_load_generator_targets_the_balancer_and_a_simulator() -> None:
    environment = services()["loadgen"]["environment"]
    assert urlsplit(environment["LOADGEN_URL"]).hostname == "lb"
    assert urlsplit(environment["LOADGEN_FAULT_URL"]).hostname in ("sim-1", "sim-2")
    assert ("./loadgen", "/loadgen") in _bind_mounts(services()["loadgen"])


# --- Prometheus rules, dashboard queries, HAProxy (promtool, haproxy) -------------------------


@pytest.mark.timeout(TOOL_INSTALL_TIMEOUT)
def test_alert_rules_pass_promtool(debian_tools: dict[str, str]) -> None:
    promtool = tool(debian_tools, "promtool")
    result = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(TOOL_INSTALL_TIMEOUT)
def test_alert_unit_tests_pass(debian_tools: dict[str, str]) -> None:
    """alerts.test.yaml and alerts.baseline.test.yaml: every alert fires when it should."""
    promtool = tool(debian_tools, "promtool")
    tests = sorted((DEPLOY / "prometheus").glob("*.test.yaml"))
    assert len(tests) == 2
    result = subprocess.run([promtool, "test", "rules", *map(str, tests)],
                            cwd=DEPLOY / "prometheus", capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set()
    for path in tests:
        for case in load_yaml(path)["tests"]:
            tested |= {check["alertname"] for check in case.get("alert_rule_test", [])
                       if check.get("exp_alerts")}
    assert tested == {rule["alert"] for rule in alert_rules() if "alert" in rule}


@pytest.mark.timeout(TOOL_INSTALL_TIMEOUT)
def test_prometheus_config_passes_promtool(debian_tools: dict[str, str]) -> None:
    promtool = tool(debian_tools, "promtool")
    result = subprocess.run([promtool, "check", "config",
                             str(DEPLOY / "prometheus" / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(TOOL_INSTALL_TIMEOUT)
def test_dashboard_queries_are_valid_promql(debian_tools: dict[str, str],
                                            tmp_path: Path) -> None:
    """Each panel query, with Grafana's variables filled in, as a recording rule for promtool."""
    promtool = tool(debian_tools, "promtool")
    exprs = dashboard_exprs()
    assert len(exprs) >= 20
    rules = []
    for index, expr in enumerate(exprs):
        filled = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m")
        filled = re.sub(r"\$\{?\w+\}?", ".*", filled)
        rules.append({"record": f"dashboard:query_{index}", "expr": filled})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(TOOL_INSTALL_TIMEOUT)
def test_haproxy_config_passes_haproxy_check(debian_tools: dict[str, str]) -> None:
    haproxy = tool(debian_tools, "haproxy")
    result = subprocess.run([haproxy, "-c", "-f", str(DEPLOY / "haproxy" / "haproxy.cfg")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# --- metric names -----------------------------------------------------------------------------


def test_metric_name_extraction() -> None:
    expr = ('sum by (model) (rate(gateway_requests_total{status=~"5..", model="a b"}[5m]))'
            ' / on (model) group_left sum(rate(other_total[$__rate_interval]))'
            ' > 1.05 * gateway:p99:baseline offset 1w and up{job="x"} == 0')
    assert promql_metric_names(expr) == {"gateway_requests_total", "other_total",
                                         "gateway:p99:baseline", "up"}
    assert grafana_variable_metric_names("label_values(gateway_requests_total, model)") == {
        "gateway_requests_total"}


def test_dashboard_and_alerts_cover_the_issue() -> None:
    dashboard = set().union(*(promql_metric_names(e) for e in dashboard_exprs()))
    for name in ["gateway_requests_total", "gateway_request_duration_seconds_bucket",
                 "gateway_time_to_first_token_seconds_bucket", "gateway_overhead_seconds_bucket",
                 "gateway_retries_total", "gateway_breaker_state", "gateway_shed_requests_total",
                 "gateway_session_fallback_backlog_entries",
                 "gateway_archive_lag_seconds_bucket"]:
        assert name in dashboard, f"the dashboard shows no {name}"
    exprs = " ".join(dashboard_exprs())
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.99," in exprs
    alerts = {rule["alert"]: rule for rule in alert_rules() if "alert" in rule}
    assert "gateway_breaker_state" in alerts["GatewayBreakerOpen"]["expr"]
    assert "gateway_archive_lag_seconds_bucket" in alerts["GatewayArchiveLagHigh"]["expr"]
    assert "> 0.8" in alerts["GatewayArchiveLagHigh"]["expr"]
    assert "5xx" in alerts["GatewayHigh5xxRatio"]["expr"]
    assert "1.05 * gateway:request_duration_seconds:p99_baseline" in \
        alerts["GatewayLatencyRegression"]["expr"]
    assert "gateway_session_fallback_backlog_entries" in \
        alerts["GatewaySessionFallbackBacklogGrowing"]["expr"]


def test_metric_names_are_declared_by_the_gateway() -> None:
    """Against the table of gateway/telemetry/metrics.py and the registry behind it."""
    used = gateway_names_used()
    assert len(used) >= 15
    for source, names in (("the table in gateway/telemetry/metrics.py", declared_names()),
                          ("GatewayMetrics' registry", registry_names())):
        unknown = {name: sorted(where) for name, where in used.items() if name not in names}
        assert unknown == {}, f"not in {source}: {unknown}"


async def test_metric_names_are_served_by_a_live_gateway(
        request: pytest.FixtureRequest) -> None:
    """Read from a live ``GET /metrics`` of a gateway started in-process."""
    gateway = await start_gateway(config_text([BackendSpec("b", "http://127.0.0.1:9")]))
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{gateway.url}/metrics") as r:
            status, body = r.status, await r.text()
    finally:
        await gateway.stop()
    if status == 404:
        request.applymarker(pytest.mark.xfail(
            strict=False, reason="GET /metrics is not wired yet; the names were checked "
                                 "against gateway/telemetry/metrics.py instead"))
    assert status == 200, f"GET /metrics answered {status}"
    live = exposition_names(body)
    unknown = {name: sorted(where) for name, where in gateway_names_used().items()
               if name not in live}
    assert unknown == {}, f"not exported by a live gateway: {unknown}"


# --- image: Dockerfile, install step, entrypoint, healthcheck -----------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    return instructions


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def pip_installs(commands: str) -> list[list[str]]:
    """The targets of each ``pip install`` in shell text, options dropped."""
    found = []
    for command in re.split(r"&&|;|\n", commands.replace("\\\n", " ")):
        words = shlex.split(command, comments=True)
        for index in range(len(words) - 1):
            if words[index].endswith("pip") and words[index + 1] == "install":
                targets = [w for w in words[index + 2:] if not w.startswith("-")]
                found.append(targets)
                break
    return found


def readme_deployment_section() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("\n## Deployment\n")
    end = readme.find("\n## ", start + 1)
    return readme[start:end if end != -1 else len(readme)]


def test_dockerfile_shape() -> None:
    instructions = dockerfile_instructions()
    stages = [args for keyword, args in instructions if keyword == "FROM"]
    assert len(stages) >= 2, "multi-stage: a build stage and a runtime stage"
    args = dict(a.split("=", 1) for k, a in instructions if k == "ARG" and "=" in a)
    bases = {re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], s.split()[0]) for s in stages}
    assert all(re.fullmatch(r"python:3\.11-slim(-\w+)?", base) for base in bases), bases
    final = final_stage()
    users = [a for k, a in final if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "runs as non-root"
    assert any(k == "COPY" and "--from=build" in a for k, a in final), "copies the build"
    assert not any(k == "RUN" and "pip" in a for k, a in final), "no install in the runtime"
    env = " ".join(a for k, a in final if k == "ENV")
    assert "GATEWAY_CONFIG=/etc/gateway/config.toml" in env
    assert "GATEWAY_WORKERS=" in env
    assert ("EXPOSE", "8080") in final
    healthcheck = next(a for k, a in final if k == "HEALTHCHECK")
    assert "/healthz" in healthcheck and "urllib" in healthcheck and "curl" not in healthcheck
    entrypoint = json.loads(next(a for k, a in final if k == "ENTRYPOINT"))
    assert entrypoint == ["/usr/local/bin/docker-entrypoint.sh"]
    script = ENTRYPOINT.read_text(encoding="utf-8")
    assert re.search(r"^exec gateway serve\b", script, flags=re.MULTILINE)
    assert '--workers "${GATEWAY_WORKERS' in script
    assert os.access(ENTRYPOINT, os.X_OK)


def test_dockerfile_installs_the_package_as_the_readme_does() -> None:
    """One source of truth for dependencies: both install ``.`` (pyproject.toml), no list."""
    docker = [t for k, a in dockerfile_instructions() if k == "RUN" for t in pip_installs(a)]
    blocks = re.findall(r"```(?:sh|bash|console)?\n(.*?)```", readme_deployment_section(),
                        flags=re.DOTALL)
    readme = [t for block in blocks for t in pip_installs(block)]
    assert docker == [["."]], f"the Dockerfile's pip installs: {docker}"
    assert readme == docker, f"README's Deployment section installs {readme}"
    copies = [a.split() for k, a in dockerfile_instructions() if k == "COPY" and "--" not in a]
    assert ["pyproject.toml", "README.md", "./"] in copies


def test_build_context_builds_the_package(tmp_path: Path) -> None:
    """The files the build stage copies, let through by the .dockerignore, make the wheel."""
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    context = tmp_path / "context"
    for keyword, args in dockerfile_instructions():
        if keyword != "COPY" or "--from=" in args:
            continue
        *sources, _ = [word for word in args.split() if not word.startswith("--")]
        for source in sources:
            assert source.rstrip("/") in allowed, f"{source} is excluded by the .dockerignore"
            origin, target = ROOT / source, context / source
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
         "--wheel-dir", str(tmp_path / "wheels"), str(context)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "wheels").glob("gateway-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(archive.read(n).decode() for n in names
                            if n.endswith("entry_points.txt"))
    assert "gateway/cli.py" in names and "gateway/sessions/session_context_pb2.py" in names
    assert "gateway = gateway.cli:main" in entry_points


@pytest.fixture
def entrypoint_gateway(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """deploy/docker-entrypoint.sh running with 2 workers on a loopback port."""
    config = tmp_path / "config.toml"
    config.write_text(config_text([BackendSpec("b", "http://127.0.0.1:9")],
                                  server="shutdown_grace_seconds = 0.2\ndrain_seconds = 2.0",
                                  extra="[sessions]\nenabled = false"))
    port = free_port()
    env = {**os.environ, "GATEWAY_CONFIG": str(config), "GATEWAY_HOST": "127.0.0.1",
           "GATEWAY_PORT": str(port), "GATEWAY_WORKERS": "2",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    process = subprocess.Popen([str(ENTRYPOINT)], env=env, cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield process, port
    finally:
        stop_process(process)
        if process.stderr:
            process.stderr.close()


def child_pids(parent: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # the process is gone
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


def healthcheck_command() -> list[str]:
    args = next(a for k, a in final_stage() if k == "HEALTHCHECK")
    command = json.loads(args[args.index("CMD") + 3:].strip())
    assert command[0] == "python"
    return [sys.executable, *command[1:]]


def test_entrypoint_serves_with_workers_and_the_healthcheck_passes(
        entrypoint_gateway: tuple[subprocess.Popen[bytes], int]) -> None:
    process, port = entrypoint_gateway
    env = {**os.environ, "GATEWAY_PORT": str(port)}
    deadline = time.monotonic() + 30
    while True:
        health = subprocess.run(healthcheck_command(), env=env, capture_output=True, timeout=10)
        if health.returncode == 0:
            break
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        assert time.monotonic() < deadline, health.stderr.decode()
        time.sleep(0.2)
    # exec: the entrypoint's process is the gateway itself, so it gets SIGTERM.
    cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")
    assert b"serve" in cmdline and b"--workers" in cmdline
    assert cmdline[cmdline.index(b"--workers") + 1] == b"2"
    assert len(child_pids(process.pid)) >= 2  # the workers (and multiprocessing's tracker)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=15) == 0
    health = subprocess.run(healthcheck_command(), env=env, capture_output=True, timeout=10)
    assert health.returncode != 0, "the healthcheck must fail when nothing answers"


# --- Redis Cluster init job ---------------------------------------------------------------------


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


# --- Kubernetes -----------------------------------------------------------------------------------


def k8s_resources() -> dict[str, dict[str, Any]]:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    resources: dict[str, dict[str, Any]] = {}
    for name in kustomization["resources"]:
        for doc in load_yaml_docs(K8S / name):
            resources[doc["kind"]] = doc
    return resources


def gateway_container() -> dict[str, Any]:
    (container,) = k8s_resources()["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def test_k8s_has_every_resource_of_the_issue() -> None:
    kinds = set(k8s_resources())
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds
    generator = load_yaml(K8S / "kustomization.yaml")["configMapGenerator"]
    assert generator == [{"name": "gateway-config", "files": ["config.toml=config.k8s.toml"]}]


def test_k8s_labels_ports_and_probes_agree() -> None:
    resources = k8s_resources()
    deployment = resources["Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert resources["Service"]["spec"]["selector"].items() <= pod_labels.items()
    assert resources["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= \
        pod_labels.items()
    target = resources["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    container = gateway_container()
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8080}
    assert all(p["targetPort"] in ports for p in resources["Service"]["spec"]["ports"])
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["resources"]["requests"]["cpu"] and \
        container["resources"]["limits"]["memory"]


def test_k8s_config_is_mounted_where_the_image_reads_it() -> None:
    container = gateway_container()
    pod = k8s_resources()["Deployment"]["spec"]["template"]["spec"]
    env = {e["name"]: e for e in container["env"]}
    assert env["GATEWAY_CONFIG"]["value"] == "/etc/gateway/config.toml"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert mount["mountPath"] == "/etc/gateway"
    assert volume["configMap"]["name"] == "gateway-config"
    # One worker per core: the workers equal the CPU request and the file's server.workers.
    workers = int(env["GATEWAY_WORKERS"]["value"])
    assert workers == int(container["resources"]["requests"]["cpu"])
    assert workers == toml(K8S_CONFIG)["server"]["workers"]


def test_k8s_termination_grace_covers_prestop_and_drain() -> None:
    server = toml(K8S_CONFIG)["server"]
    pod = k8s_resources()["Deployment"]["spec"]["template"]["spec"]
    pre_stop = gateway_container()["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    sleep = float(pre_stop[1])
    assert pod["terminationGracePeriodSeconds"] > \
        server["drain_seconds"] + server["shutdown_grace_seconds"]
    assert pod["terminationGracePeriodSeconds"] > \
        sleep + server["drain_seconds"] + server["shutdown_grace_seconds"]


def _env_names(value: Any) -> set[str]:
    """Every value of a ``*_env`` key anywhere in a TOML document."""
    names: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if key.endswith("_env") and isinstance(item, str) and item:
                names.add(item)
            else:
                names |= _env_names(item)
    elif isinstance(value, list):
        for item in value:
            names |= _env_names(item)
    return names


def test_k8s_secrets_cover_every_environment_variable_the_config_names() -> None:
    names = _env_names(toml(K8S_CONFIG))
    assert {"VLLM_LLAMA_70B_API_KEY", "GATEWAY_ADMIN_KEY"} <= names
    env = {e["name"]: e for e in gateway_container()["env"]}
    examples = {(doc["metadata"]["name"], key) for doc in load_yaml_docs(K8S /
                "secret.example.yaml") for key in doc["stringData"]}
    for name in names:
        assert name in env, f"deployment.yaml does not set {name}"
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["key"] == name and not ref.get("optional", False)
        assert (ref["name"], name) in examples, f"secret.example.yaml lacks {name}"
    kustomization = load_yaml(K8S / "kustomization.yaml")
    assert "secret.example.yaml" not in kustomization["resources"], "keys are never applied"


def test_k8s_kustomization_renders_with_the_config_file() -> None:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl not installed: the kustomization is checked file by file only")
    result = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    by_kind = {doc["kind"]: doc for doc in docs}
    config_map = by_kind["ConfigMap"]
    assert config_map["data"]["config.toml"] == K8S_CONFIG.read_text(encoding="utf-8")
    pod = by_kind["Deployment"]["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"] != "gateway-config"
    assert {doc["metadata"].get("namespace") for doc in docs if doc["kind"] != "Namespace"} \
        == {"llm-gateway"}


# --- load generator ------------------------------------------------------------------------------


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
