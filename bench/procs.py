"""Child processes of a benchmark: the gateway, simulators, the load generator.

Why processes and not in-process servers: the gateway's CPU time is read from
``/proc/PID/stat`` of *its own* process, so nothing else may run in it, and it
must sit alone on one core while the simulators and the load generator share
the other; then a noisy neighbour on the load side cannot be billed to the
gateway. Every child is pinned with ``os.sched_setaffinity`` before it execs,
gets the hard limit of open files (1,000 streams need ~2,000 sockets in the
gateway), and dies with its parent (``PR_SET_PDEATHSIG``), so an interrupted
run leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
GATEWAY_CLI = [PYTHON, "-m", "gateway.cli"]
_LISTENING = re.compile(rb"listening on (http://\S+)")
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PR_SET_PDEATHSIG = 1


def cores() -> tuple[int, int]:
    """(gateway core, load core): 0 and 1 on a 2-core machine; both 0 on one core.

    On a single core the numbers still come out, but the gateway then competes
    with the load it measures; the suite says so in its header.
    """
    available = sorted(os.sched_getaffinity(0))
    if len(available) >= 2:
        return available[0], available[1]
    return available[0], available[0]


def pin_self(core: int) -> None:
    """Pin the calling process (the orchestrator, the load generator) to ``core``."""
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {core})


def raise_nofile() -> None:
    """Soft open-files limit up to the hard limit: 1,000 streams exceed the usual 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _child_setup(core: int) -> Callable[[], None]:
    """What runs in the child between fork and exec: pin, raise limits, die with us."""
    libc = ctypes.CDLL(None, use_errno=True)

    def setup() -> None:
        os.sched_setaffinity(0, {core})
        raise_nofile()
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return setup


class Child:
    """A pinned child process that announces its URL with a ``listening on`` line."""

    def __init__(self, name: str, argv: Sequence[str], core: int) -> None:
        self.name = name
        self.argv = list(argv)
        self.core = core
        self.url = ""
        self.proc: asyncio.subprocess.Process | None = None
        self._log: list[str] = []
        self._drain: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.proc.pid

    async def start(self, wait_s: float = 20.0) -> Child:
        """Spawn, then wait for the ``listening on`` line (or fail with the output so far)."""
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, preexec_fn=_child_setup(self.core))
        try:
            async with asyncio.timeout(wait_s):
                await self._read_until_listening()
        except (TimeoutError, RuntimeError) as exc:
            await self.stop()
            tail = "\n".join(self._log[-20:])
            raise RuntimeError(f"{self.name} did not start: {exc}\n{tail}") from None
        self._drain = asyncio.create_task(self._keep_draining())
        return self

    async def _read_until_listening(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"exited with {await self.proc.wait()}")
            self._log.append(line.decode(errors="replace").rstrip())
            if match := _LISTENING.search(line):
                self.url = match.group(1).decode()
                return

    async def _keep_draining(self) -> None:
        """Read the child's log so a full pipe never blocks it; keep the last lines."""
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self._log.append(line.decode(errors="replace").rstrip())
            del self._log[:-200]

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self._log[-lines:])

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; always reaps."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain


def sim_child(core: int, *, ttft_ms: float = 0.0, itl_ms: float = 0.0, tokens: int = 16,
              name: str = "sim") -> Child:
    """``gateway sim`` on a free port (port 0) pinned to ``core``."""
    argv = [*GATEWAY_CLI, "sim", "--port", "0", "--ttft-ms", str(ttft_ms),
            "--itl-ms", str(itl_ms), "--tokens", str(tokens)]
    return Child(name, argv, core)


def gateway_child(config_path: Path, core: int, name: str = "gateway") -> Child:
    """``gateway serve`` with ``config_path`` on a free port, pinned to ``core``."""
    argv = [*GATEWAY_CLI, "serve", "--config", str(config_path), "--port", "0"]
    return Child(name, argv, core)


def check_config(path: Path) -> tuple[bool, str]:
    """``gateway check-config PATH``: whether the gateway accepts the file, and its words."""
    done = subprocess.run([*GATEWAY_CLI, "check-config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of the whole process (all its threads), in seconds.

    Fields 14 and 15 of ``/proc/PID/stat``, counted after the parenthesized
    command name, which may itself contain spaces. On loopback, stime also
    holds the kernel's TCP work for the *receiving* side of each send (the
    softirq runs on the sender's CPU), so fewer writes cut both.
    """
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process, in seconds."""
    return sum(cpu_times(pid))


def status_kb(pid: int, key: str) -> int:
    """A ``/proc/PID/status`` line in kB, e.g. ``VmHWM`` (peak RSS) or ``VmRSS``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(f"{key} not in /proc/{pid}/status")


def peak_rss_mb(pid: int) -> float:
    return status_kb(pid, "VmHWM") / 1024


def rss_mb(pid: int) -> float:
    return status_kb(pid, "VmRSS") / 1024
