"""System profilers for the gateway process: ``perf`` (where CPU goes, natively) and
``strace -c`` (how many system calls a request costs).

Why both besides py-spy: py-spy samples a thread whenever it is not idle,
which includes time it waits in the run queue for its core. On this shared
machine that wait is large (a neighbour preempts the gateway, most often as a
system call returns), so py-spy's leaf frames around socket writes are
inflated. ``perf record -e cpu-clock`` counts only time on the CPU, so its
split (interpreter, garbage collector, kernel, C extensions) is the one to
convert into microseconds per request. ``strace -c`` slows the process a lot
but counts calls exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_PERF_LINE = re.compile(r"^\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.+?)\s*$")
_GC_SYMBOL = re.compile(r"^(gc_|visit_|move_|subtract_refs|update_refs|deduce_unreachable|"
                        r"\w*traverse)")
_EXTENSIONS = {"loop.": "uvloop (C event loop)", "_http_parser": "aiohttp C parser",
               "_http_writer": "aiohttp C writer", "_helpers": "aiohttp C helpers",
               "_websocket": "aiohttp C helpers", "_multidict": "multidict/yarl/propcache",
               "_quoting": "multidict/yarl/propcache", "_helpers_c": "multidict/yarl/propcache",
               "_frozenlist": "multidict/yarl/propcache", "orjson": "orjson",
               "_asyncio": "asyncio C", "libc": "libc (malloc, memcpy)"}


def has_tool(name: str) -> bool:
    return shutil.which(name) is not None


@dataclass
class NativeProfile:
    """perf's on-CPU samples of the gateway, grouped."""

    groups: Counter[str] = field(default_factory=Counter)
    """Percent of on-CPU samples per group (interpreter, garbage collector, kernel, ...)."""
    symbols: list[tuple[float, str, str]] = field(default_factory=list)
    """(percent, group, symbol), heaviest first."""

    def share(self, *names: str) -> float:
        return sum(self.groups[name] for name in names) / 100


def group_of(dso: str, kind: str, symbol: str) -> str:
    """The group of one perf line: by shared object, and GC apart from the interpreter."""
    if kind == "k" or "kernel" in dso:
        return "kernel (socket calls, TCP)"
    if dso.startswith("libpython") or dso.startswith("python"):
        return "garbage collector" if _GC_SYMBOL.match(symbol) else "Python interpreter"
    for prefix, name in _EXTENSIONS.items():
        if dso.startswith(prefix):
            return name
    return "other native code"


def parse_perf_report(text: str) -> NativeProfile:
    """``perf report --stdio --no-children --sort dso,sym -g none`` output, grouped."""
    profile = NativeProfile()
    for line in text.splitlines():
        match = _PERF_LINE.match(line)
        if not match:
            continue
        percent, dso, kind, symbol = float(match[1]), match[2], match[3], match[4]
        group = group_of(dso, kind, symbol)
        profile.groups[group] += percent
        profile.symbols.append((percent, group, symbol))
    profile.symbols.sort(reverse=True)
    return profile


Process = asyncio.subprocess.Process


async def start_perf(pid: int, seconds: float, output: Path, core: int) -> Process:
    """``perf record`` of ``pid`` for ``seconds`` (on-CPU samples at 999 Hz), pinned to ``core``."""
    return await asyncio.create_subprocess_exec(
        "perf", "record", "-e", "cpu-clock", "-F", "999", "-p", str(pid), "-o", str(output),
        "--", "sleep", str(seconds), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}))


async def perf_report(data: Path) -> NativeProfile:
    proc = await asyncio.create_subprocess_exec(
        "perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "dso,sym",
        "-g", "none", "--percent-limit", "0", stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL)
    out, _ = await proc.communicate()
    return parse_perf_report(out.decode(errors="replace"))


def parse_strace_summary(text: str) -> Counter[str]:
    """Calls per syscall from ``strace -c`` output (its table; the total line left out)."""
    calls: Counter[str] = Counter()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[-1] != "total" and parts[3].isdigit():
            with contextlib.suppress(ValueError):
                float(parts[0])
                calls[parts[-1]] += int(parts[3])
    return calls


async def start_strace(pid: int, output: Path) -> Process:
    """``strace -c -f -p PID``: counts until it gets SIGINT."""
    return await asyncio.create_subprocess_exec(
        "strace", "-c", "-f", "-p", str(pid), "-o", str(output),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def schedstat(pid: int) -> tuple[int, int]:
    """(ns on CPU, ns waiting in the run queue) of the process's main thread."""
    on_cpu, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(on_cpu), int(waiting)


def native_lines(native: NativeProfile, cpu_ms_per_req: float, top: int = 15) -> list[str]:
    """Markdown: perf's groups and heaviest symbols, in µs per request."""
    lines = ["On-CPU time by native group (perf, cpu-clock):", "",
             "| group | share of CPU | µs per request |", "|---|---|---|"]
    for name, percent in native.groups.most_common():
        lines.append(f"| {name} | {percent:.1f} % | {percent / 100 * cpu_ms_per_req * 1000:.0f} |")
    lines += ["", "Heaviest native symbols:", "",
              "| symbol | group | share of CPU |", "|---|---|---|"]
    lines += [f"| `{symbol}` | {group} | {percent:.1f} % |"
              for percent, group, symbol in native.symbols[:top]]
    return [*lines, ""]
