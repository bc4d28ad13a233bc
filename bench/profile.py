"""Where the gateway's CPU goes per request: py-spy and perf against the running gateway.

    .venv/bin/python -m bench.profile [--scenario chat stream32] [--seconds 20]

While the load generator drives the gateway path of a scenario (concurrency
16), three outside observers look at the unmodified gateway process:

- ``perf record -e cpu-clock`` (if installed): on-CPU time by native group —
  Python interpreter, garbage collector, kernel, uvloop, aiohttp's C parts —
  the CPU-accurate split;
- py-spy (``.venv/bin/pip install py-spy``; a benchmark-only tool),
  ``--nonblocking``: which *Python* functions those interpreter cycles run;
- ``strace -c`` (if installed), in a separate round: system calls per request.

py-spy counts a sample whenever the thread is not idle, run-queue waits
included; the run-queue wait share is measured (``/proc/PID/schedstat``) and
reported. A preempted thread mostly stops as a system call returns, so leaves
at socket and log writes (``StreamWriter._write*``, ``StreamHandler.emit``)
and in the loop itself (``Runner.run``) soak up that wait: they are shown
apart, and the Python
tables' "µs per request" share out only the interpreter's perf-measured time
among the other samples. Collapsed stacks are kept in ``<scenario>.folded``
(speedscope, flamegraph.pl); the report is ``profile.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench import native
from bench.loadclient import LoadGenerator
from bench.procs import ROOT, cores, pin_self
from bench.scenarios import BY_NAME
from bench.stack import Stack

PY_SPY = Path(sys.executable).with_name("py-spy")
WAIT_LEAVES = ("StreamWriter._writelines (", "StreamWriter._write (", "Runner.run (",
               "StreamHandler.emit (", "StreamHandler.flush (",
               "StreamWriter.writelines (asyncio", "StreamWriter.write (asyncio",
               "Http1Connection.send (", "_LineSink.flush (")
"""Leaves that end in a system call (socket writes of aiohttp, of the backend client and
of redis-py's asyncio streams, log writes, the loop's own reads and polls):
where a preempted thread waits in the run queue, so py-spy's counts there are mostly wait.
Their real CPU is in perf's kernel / uvloop groups."""


@dataclass
class Profile:
    scenario: str
    stacks: Counter[tuple[str, ...]] = field(default_factory=Counter)
    requests: int = 0
    cpu_ms_per_req: float = 0.0
    runq_wait_share: float = 0.0
    """Share of the round's wall time the gateway spent runnable but not running."""
    native: native.NativeProfile | None = None

    def python_stacks(self) -> Counter[tuple[str, ...]]:
        """Stacks whose leaf is not a wait-prone leaf."""
        return Counter({stack: count for stack, count in self.stacks.items()
                        if stack and not stack[-1].startswith(WAIT_LEAVES)})

    @property
    def python_us_per_req(self) -> float:
        """Interpreter + GC time per request per perf (all CPU when perf is missing)."""
        share = (self.native.share("Python interpreter", "garbage collector")
                 if self.native else 1.0)
        return share * self.cpu_ms_per_req * 1000


def parse_folded(lines: Iterable[str]) -> Counter[tuple[str, ...]]:
    """py-spy's raw format: ``frame;frame;...;frame COUNT`` per line."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in lines:
        body, _, count = line.rstrip().rpartition(" ")
        if body and count.isdigit():
            stacks[tuple(body.split(";"))] += int(count)
    return stacks


def _is_root(frame: str) -> bool:
    return frame.endswith(("(gateway/cli.py)", "(gateway/server.py)", "(<frozen runpy>)",
                           "(asyncio/runners.py)"))


def area(frame: str) -> str:
    """The package (and for ours, the sub-package) of a frame ``func (path/file.py)``."""
    parts = frame.rpartition("(")[2].rstrip(")").split("/")
    if parts[0] == "gateway" and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0]


def self_by(stacks: Counter[tuple[str, ...]], by_area: bool = False) -> Counter[str]:
    totals: Counter[str] = Counter()
    for stack, count in stacks.items():
        totals[area(stack[-1]) if by_area else stack[-1]] += count
    return totals


def inclusive(stacks: Counter[tuple[str, ...]], prefix: str = "",
              by_area: bool = False) -> Counter[str]:
    """Samples with each function (or area) on the stack, once per stack; root frames out."""
    totals: Counter[str] = Counter()
    for stack, count in stacks.items():
        frames = {frame for frame in stack if prefix in frame and not _is_root(frame)}
        for name in {area(frame) for frame in frames} if by_area else frames:
            totals[name] += count
    return totals


async def _observe(stack: Stack, load: LoadGenerator, seconds: float, rate: int,
                   out: Path, profile: Profile) -> None:
    """Run the measured round under py-spy (and perf); fill ``profile``."""
    assert stack.gateway is not None
    pid, load_core = stack.gateway.pid, stack.load_core
    folded, perf_data = out / f"{profile.scenario}.folded", out / f"{profile.scenario}.perf"
    spy = await asyncio.create_subprocess_exec(
        str(PY_SPY), "record", "--pid", str(pid), "--format", "raw", "--output", str(folded),
        "--duration", str(int(seconds)), "--rate", str(rate), "--nonblocking", "--nolineno",
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=lambda: os.sched_setaffinity(0, {load_core}))
    perf = (await native.start_perf(pid, seconds - 1.0, perf_data, load_core)
            if native.has_tool("perf") else None)
    await asyncio.sleep(0.5)  # both attached before the measured load starts
    before = native.schedstat(pid)
    base = stack.spec("gateway", 16, stack.scenario.full)
    result = await load.run(replace(base, max_requests=10**6, max_seconds=seconds - 2.0,
                                    warmup=0))
    after = native.schedstat(pid)
    async with asyncio.timeout(seconds + 30):
        _, errors = await spy.communicate()
        if perf is not None:
            await perf.wait()
    if spy.returncode != 0 or not folded.exists():
        raise RuntimeError(f"py-spy failed ({spy.returncode}): {errors.decode().strip()}")
    profile.requests = result.requests
    profile.cpu_ms_per_req = (result.cpu_seconds or 0.0) / max(result.requests, 1) * 1000
    profile.runq_wait_share = (after[1] - before[1]) / 1e9 / max(result.elapsed, 1e-9)
    profile.stacks = parse_folded(folded.read_text().splitlines())
    if perf is not None and perf_data.exists():
        profile.native = await native.perf_report(perf_data)


async def record(scenario_name: str, seconds: float, rate: int, out: Path) -> Profile:
    """A fresh stack for the scenario, warmed up, then observed for ``seconds``."""
    gateway_core, load_core = cores()
    stack = await Stack(BY_NAME[scenario_name], gateway_core, load_core).start()
    load = await LoadGenerator(load_core).start()
    profile = Profile(scenario_name)
    try:
        base = stack.spec("gateway", 16, stack.scenario.full)
        await load.run(replace(base, max_requests=500, max_seconds=2.0, warmup=100))
        await _observe(stack, load, seconds, rate, out, profile)
    finally:
        await load.stop()
        await stack.close()
    return profile


async def count_syscalls(scenario_name: str, requests: int, out: Path) -> tuple[int, Counter[str]]:
    """System calls the gateway makes for ``requests`` requests (``strace -c``): exact
    counts (the trace covers the whole closed-loop round and nothing else), no timings."""
    gateway_core, load_core = cores()
    stack = await Stack(BY_NAME[scenario_name], gateway_core, load_core).start()
    load = await LoadGenerator(load_core).start()
    summary_path = out / f"{scenario_name}.strace.txt"
    try:
        assert stack.gateway is not None
        base = stack.spec("gateway", 16, stack.scenario.full)
        await load.run(replace(base, max_requests=300, max_seconds=2.0, warmup=50))
        tracer = await native.start_strace(stack.gateway.pid, summary_path)
        await asyncio.sleep(1.0)  # attached before the first request of the round
        result = await load.run(replace(base, max_requests=requests, max_seconds=60.0,
                                        warmup=0))
        tracer.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            await tracer.wait()
    finally:
        await load.stop()
        await stack.close()
    return result.requests, native.parse_strace_summary(summary_path.read_text())


def syscall_lines(scenario: str, requests: int, calls: Counter[str], top: int = 8) -> list[str]:
    per_request = sum(calls.values()) / max(requests, 1)
    detail = ", ".join(f"{name} {count / max(requests, 1):.1f}"
                       for name, count in calls.most_common(top))
    return [f"System calls of `{scenario}` (strace -c over {requests} requests): "
            f"**{per_request:.1f} per request**: {detail}", ""]


def _rows(counter: Counter[str], total: int, us_total: float, top: int) -> list[str]:
    lines = ["| where | share of samples | ≈ µs per request |", "|---|---|---|"]
    for name, count in counter.most_common(top):
        share = count / max(total, 1)
        lines.append(f"| `{name}` | {share * 100:.1f} % | {share * us_total:.0f} |")
    return lines


def summary(profile: Profile, top: int = 20) -> list[str]:
    """Markdown: perf's native split, then py-spy's Python view (wait-prone leaves apart)."""
    python = profile.python_stacks()
    total, kept = sum(profile.stacks.values()), sum(python.values())
    us = profile.python_us_per_req
    lines = [f"### `{profile.scenario}` at concurrency 16: {profile.requests} requests, gateway "
             f"CPU {profile.cpu_ms_per_req:.3f} ms per request (under the profilers), "
             f"run-queue wait {profile.runq_wait_share * 100:.0f} % of the time", ""]
    if profile.native is not None:
        lines += native.native_lines(profile.native, profile.cpu_ms_per_req)
    waits = self_by(Counter({s: c for s, c in profile.stacks.items() if s not in python}))
    lines += [f"py-spy: {total} samples; {(total - kept) / max(total, 1) * 100:.0f} % end in "
              "wait-prone leaves (" + ", ".join(f"`{k}` {v / max(total, 1) * 100:.0f} %"
                                                for k, v in waits.most_common()) + "), "
              f"left out below. The other {kept} share out the interpreter's "
              f"{us:.0f} µs per request (perf).", ""]
    lines += ["Python self time by area:", "", *_rows(self_by(python, True), kept, us, top)]
    lines += ["", "Python inclusive time by area (a stack counts once per area on it):", "",
              *_rows(inclusive(python, by_area=True), kept, us, top)]
    lines += ["", "Python self time by function:", "", *_rows(self_by(python), kept, us, top)]
    lines += ["", "Inclusive time of the gateway's own functions:", "",
              *_rows(inclusive(python, "(gateway/"), kept, us, top), ""]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", nargs="+", default=["chat", "stream32"],
                        choices=sorted(BY_NAME))
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--syscall-requests", type=int, default=2000,
                        help="requests traced with strace -c (0: skip; needs strace)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "profile")
    args = parser.parse_args(argv)
    if not PY_SPY.exists() and not shutil.which("py-spy"):
        parser.error("py-spy is not installed: .venv/bin/pip install py-spy")
    pin_self(cores()[1])
    args.out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    for name in args.scenario:
        profile = asyncio.run(record(name, max(args.seconds, 5.0), args.rate, args.out))
        lines += summary(profile)
        if args.syscall_requests and native.has_tool("strace"):
            requests, calls = asyncio.run(count_syscalls(name, args.syscall_requests, args.out))
            lines += syscall_lines(name, requests, calls)
    (args.out / "profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
