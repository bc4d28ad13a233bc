"""Starting ``gateway`` commands as real processes and waiting until they listen."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Process:
    """A ``gateway`` subcommand run with this interpreter, stopped on exit."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = [sys.executable, "-m", "gateway", *args]
        self.proc = subprocess.Popen(
            self.args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **(env or {})},
        )
        self.output: list[str] = []

    def wait_for_line(self, prefix: str, timeout: float = 15.0) -> str:
        """Read output until a line starts with ``prefix``; return that line."""
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.output.append(line)
            if line.startswith(prefix):
                return line.strip()
        raise AssertionError(f"{self.args} never printed {prefix!r}; output:\n"
                             + "".join(self.output))

    def drain_output(self) -> list[str]:
        """Every line printed so far, reading the rest once the process has ended."""
        assert self.proc.stdout is not None
        if self.proc.poll() is not None:
            self.output.extend(self.proc.stdout.readlines())
        return self.output

    def listening_url(self, prefix: str) -> str:
        return self.wait_for_line(prefix).rsplit(" ", 1)[-1]

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
