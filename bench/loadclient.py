"""The caller's side of the load generator process (``python -m bench.loadgen``).

The suite, the soak, the profiler and the A/B tool all drive rounds through
this handle: one JSON line out per round, one JSON line back, so the load
runs in its own pinned process and the caller stays cheap.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import asdict

import orjson

from bench.loadgen import RoundResult, RoundSpec
from bench.procs import ROOT


class LoadGenerator:
    """The caller's handle on a ``bench.loadgen`` process: one round at a time."""

    def __init__(self, core: int | None) -> None:
        self.core = core
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self) -> LoadGenerator:
        argv = [sys.executable, "-m", "bench.loadgen"]
        if self.core is not None:
            argv += ["--core", str(self.core)]
        self._proc = await asyncio.create_subprocess_exec(
            *argv, cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=64 * 1024 * 1024)  # a result line carries every latency sample
        return self

    async def run(self, spec: RoundSpec) -> RoundResult:
        """Send one spec, wait for its result (the round bounds itself in time)."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise RuntimeError("load generator not started")
        proc.stdin.write(orjson.dumps(asdict(spec)) + b"\n")
        await proc.stdin.drain()
        line = await proc.stdout.readline()
        if not line:
            raise RuntimeError(f"load generator exited with {await proc.wait()}")
        return RoundResult(**orjson.loads(line))

    async def stop(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            try:
                await asyncio.wait_for(self._proc.wait(), 10)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
