"""Shared helpers of the tests/test_deploy_*.py modules: deploy/ is checked, not just written
(issue 9).

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

The checks live in test_deploy_config.py (files parse, check-config),
test_deploy_compose.py (compose stack, Redis Cluster init, load generator),
test_deploy_observability.py (Prometheus, Grafana, collector, metric names),
test_deploy_tools.py (promtool and haproxy), test_deploy_image.py (Dockerfile,
entrypoint, healthcheck) and test_deploy_k8s.py (Kubernetes).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from gateway.telemetry import metrics as metrics_module

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


# --- helpers ---------------------------------------------------------------------------------


def load_yaml_docs(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
            if doc is not None]


def load_yaml(path: Path) -> Any:
    docs = load_yaml_docs(path)
    assert len(docs) == 1, f"{path}: expected one YAML document, got {len(docs)}"
    return docs[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


# --- compose services and mounts -------------------------------------------------------------

GATEWAYS = ("gateway-1", "gateway-2")


def _bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2] if isinstance(volume, str) else (
            volume["source"], volume["target"])
        if source.startswith((".", "/")):
            mounts.append((source, target))
    return mounts


# --- PromQL metric names ---------------------------------------------------------------------

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
