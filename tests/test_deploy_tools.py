"""deploy/ checked with Debian's tools: the alert rules pass ``promtool check rules`` and
their unit tests (``promtool test rules``), the Prometheus config ``promtool check config``,
every dashboard query parses as PromQL, and HAProxy's config ``haproxy -c``.

promtool and haproxy come from Debian's ``prometheus`` and ``haproxy`` packages:
when missing and running as root, they are installed once per session (without
starting the services), otherwise their tests are skipped with the reason.
See tests/deploy_support.py for the whole plan.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy_support import (
    ALERTS,
    DEPLOY,
    alert_rules,
    dashboard_exprs,
    load_yaml,
    yaml,
)

SYSTEM_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin",
                               "/sbin"])
DEBIAN_TOOLS = {"promtool": "prometheus", "haproxy": "haproxy"}
POLICY_RC = Path("/usr/sbin/policy-rc.d")
TOOL_INSTALL_TIMEOUT = 900  # the first test to use a tool may install it (apt)


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
        POLICY_RC.write_text("#!/bin/sh\n# written by tests/test_deploy_tools.py while installing "
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


# --- Prometheus rules, dashboard queries, HAProxy (promtool, haproxy) ------------------------


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
