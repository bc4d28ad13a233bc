"""deploy/Dockerfile: the image's pieces work outside Docker: the build context builds the
package with the README's install step, the entrypoint runs ``gateway serve`` with workers from
the environment and drains on SIGTERM, and the HEALTHCHECK command passes against it; see
tests/deploy_support.py for the whole plan."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy_support import DEPLOY, DOCKERFILE, ENTRYPOINT, ROOT, free_port, stop_process
from tests.gateway_harness import BackendSpec, config_text

# --- image: Dockerfile, install step, entrypoint, healthcheck --------------------------------


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
