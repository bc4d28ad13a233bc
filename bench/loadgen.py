"""The load generator: HTTP clients, bounded in request count and in time.

It runs as a process of its own, pinned to the load core (the one the gateway
is not on), so its CPU never competes with the gateway's: ``python -m
bench.loadgen --core 1`` reads one JSON :class:`RoundSpec` per line on stdin
and answers one JSON :class:`RoundResult` per line on stdout, until stdin
closes (``bench.loadclient.LoadGenerator`` is the caller's side). Keeping one
process for the whole suite saves the ~0.3 s import cost per round and lets
the caller alternate direct and gateway rounds cheaply.

A round is ``concurrency`` workers, each sending its next request as soon as
the previous one ended (closed loop), until ``max_requests`` have been started
or ``max_seconds`` have passed, whichever comes first; requests in flight at
the deadline finish (each under ``request_timeout``). With ``rate`` set, the
round is an open loop instead: requests start on a fixed schedule whatever
the answers do, at most ``concurrency`` at once. An unmeasured warm-up
first opens the keep-alive connections. The gateway's CPU time is read from
``/proc`` right around the measured phase, by this process, so start-up and
warm-up are not billed to the requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.procs import cpu_times, pin_self, raise_nofile

CHAT_PATH = "/v1/chat/completions"
MODEL = "sim-model"


@dataclass
class RoundSpec:
    """What one round sends. Plain data, so it travels as one JSON line."""

    targets: list[str]
    """Base URLs; requests go to them in turn (two simulators on the direct path)."""
    stream: bool = False
    concurrency: int = 16
    """Closed loop: the number of workers. Open loop (``rate``): the cap on requests in flight."""
    rate: float = 0.0
    """Requests per second on a fixed schedule (open loop); 0 = closed loop."""
    max_requests: int = 1000
    max_seconds: float = 10.0
    warmup: int = 0
    """Unmeasured requests first, at the same concurrency (opens connections)."""
    ramp_seconds: float = 0.0
    """Workers start spread over this time: 1,000 connects at once overflow a listen backlog."""
    headers: dict[str, str] = field(default_factory=dict)
    session_turns: int = 0
    """Turns per conversation in the session scenario; 0 for single requests."""
    session_mode: str = ""
    """``client``: the client resends the whole history (direct path);
    ``server``: only the new message, with ``X-Session-Id`` (gateway sessions)."""
    cpu_pid: int = 0
    """A process whose utime+stime is read around the measured phase (0: none): the gateway."""
    watch_cores: list[int] = field(default_factory=list)
    """Cores whose busy share (all processes, ours and the neighbours') is reported."""
    request_timeout: float = 60.0
    prompt: str = "Write one short sentence about load balancers."


@dataclass
class RoundResult:
    """One measured phase. Latencies in ms, successful requests only."""

    requests: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    elapsed: float = 0.0
    latency_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    max_in_flight: int = 0
    cpu_seconds: float | None = None
    """CPU time (user + system) of ``cpu_pid`` during the measured phase."""
    cpu_sys_seconds: float | None = None
    """Its system (kernel) part."""
    core_busy: list[list[float]] = field(default_factory=list)
    """[busy share, irq + softirq share] of each of ``watch_cores`` in the measured phase,
    from ``/proc/stat``. Busy 1.0 = saturated. Softirq is mostly loopback TCP receive work,
    which the kernel does not bill to any process's utime/stime."""

    def add_error(self, key: str) -> None:
        self.errors[key] = self.errors.get(key, 0) + 1


class _Budget:
    """Tickets for requests: a count bound and a time bound shared by all workers."""

    def __init__(self, count: int, seconds: float) -> None:
        self._left = count
        self.deadline = time.monotonic() + seconds  # ramp included by the caller

    def take(self) -> bool:
        if self._left <= 0 or time.monotonic() >= self.deadline:
            return False
        self._left -= 1
        return True


class _Conversation:
    """The messages of one worker's chat, as a session client or a history-resending one."""

    def __init__(self, spec: RoundSpec, worker: int, tag: str) -> None:
        self._spec = spec
        self._worker = worker
        self._tag = tag
        self._number = 0
        self._turn = 0
        self._history: list[dict[str, str]] = []

    def request(self) -> tuple[list[dict[str, str]], dict[str, str]]:
        """Messages and extra headers of the next turn (starts a new chat when one is full)."""
        if self._turn >= self._spec.session_turns:
            self._number, self._turn, self._history = self._number + 1, 0, []
        self._turn += 1
        user = {"role": "user", "content": f"{self._spec.prompt} (turn {self._turn})"}
        if self._spec.session_mode == "server":
            session = f"bench-{self._tag}-{self._worker}-{self._number}"
            return [user], {"X-Session-Id": session}
        self._history.append(user)
        return list(self._history), {}

    def answered(self, body: bytes) -> None:
        """Keep the assistant's answer in the client-side history (direct path)."""
        if self._spec.session_mode != "client":
            return
        try:
            content = orjson.loads(body)["choices"][0]["message"]["content"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            content = ""
        self._history.append({"role": "assistant", "content": content})


class _Round:
    """The state of one round: the session, the targets, the counters."""

    def __init__(self, spec: RoundSpec, http: aiohttp.ClientSession) -> None:
        self.spec = spec
        self.http = http
        self._targets = itertools.cycle([t.rstrip("/") + CHAT_PATH for t in spec.targets])
        self._plain = orjson.dumps({"model": MODEL, "stream": spec.stream,
                                    "messages": [{"role": "user", "content": spec.prompt}]})
        self._headers = {"Content-Type": "application/json", **spec.headers}
        self._tag = os.urandom(4).hex()
        self.in_flight = 0

    async def phase(self, count: int, result: RoundResult | None) -> None:
        """Run ``count`` requests (or until the time bound) with all workers."""
        budget = _Budget(count, self.spec.max_seconds + self.spec.ramp_seconds)
        self._tag = os.urandom(4).hex()  # new session ids: warm-up chats do not continue
        workers = min(self.spec.concurrency, max(count, 1))
        hard_stop = self.spec.max_seconds + self.spec.request_timeout + self.spec.ramp_seconds
        with contextlib.suppress(TimeoutError):  # a stuck request cannot hold the round
            async with asyncio.timeout(hard_stop):
                if self.spec.rate:
                    await self._open_loop(budget, result)
                    return
                await asyncio.gather(*(self._worker(i, workers, budget, result)
                                       for i in range(workers)))

    async def _open_loop(self, budget: _Budget, result: RoundResult | None) -> None:
        """Requests started on a fixed schedule (``rate`` per second), whatever the answers
        do, at most ``concurrency`` at once: latency without the queue a closed loop builds."""
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.spec.concurrency)
        interval, due = 1.0 / self.spec.rate, loop.time()
        tasks: set[asyncio.Task[None]] = set()
        while budget.take():
            await asyncio.sleep(max(0.0, due - loop.time()))
            due += interval
            await slots.acquire()  # over the cap the schedule slips (max_in_flight shows it)
            task = loop.create_task(self._tracked(self._plain, self._headers, result, None))
            task.add_done_callback(lambda _: slots.release())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def _worker(self, index: int, workers: int, budget: _Budget,
                      result: RoundResult | None) -> None:
        if self.spec.ramp_seconds:
            await asyncio.sleep(self.spec.ramp_seconds * index / workers)
        chat = _Conversation(self.spec, index, self._tag) if self.spec.session_turns else None
        while budget.take():
            if chat is None:
                body, headers = self._plain, self._headers
            else:
                messages, extra = chat.request()
                body = orjson.dumps({"model": MODEL, "stream": self.spec.stream,
                                     "messages": messages})
                headers = {**self._headers, **extra}
            await self._tracked(body, headers, result, chat)

    async def _tracked(self, body: bytes, headers: dict[str, str], result: RoundResult | None,
                       chat: _Conversation | None) -> None:
        self.in_flight += 1
        if result is not None:
            result.max_in_flight = max(result.max_in_flight, self.in_flight)
        try:
            await self._one(body, headers, result, chat)
        finally:
            self.in_flight -= 1

    async def _one(self, body: bytes, headers: dict[str, str], result: RoundResult | None,
                   chat: _Conversation | None) -> None:
        """Send one request and record its latency (and TTFT), or its error."""
        start = time.perf_counter()
        ttft: float | None = None
        error = ""
        try:
            async with self.http.post(next(self._targets), data=body, headers=headers) as resp:
                if resp.status != 200:
                    error = error_kind(resp.status, await resp.read())
                elif self.spec.stream:
                    ttft, error = await _read_stream(resp, start)
                else:
                    answer = await resp.read()
                    if chat is not None:
                        chat.answered(answer)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = type(exc).__name__
        if result is None:
            return
        result.requests += 1
        if error:
            result.add_error(error)
            return
        result.ok += 1
        result.latency_ms.append((time.perf_counter() - start) * 1000)
        if ttft is not None:
            result.ttft_ms.append(ttft * 1000)


_ATTEMPTS = re.compile(r"\(\d+ attempt\(s\)[^)]*\)|after \d+ attempt\(s\)[^:]*")


def error_kind(status: int, body: bytes) -> str:
    """``http_502 upstream_503 after 2 attempt(s), retry budget exhausted``: enough to say why."""
    try:
        error = orjson.loads(body)["error"]
        code, message = str(error.get("code")), str(error.get("message"))
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return f"http_{status}"
    attempts = _ATTEMPTS.search(message)
    return f"http_{status} {code}" + (f" {attempts.group(0)}" if attempts else "")


async def _read_stream(resp: aiohttp.ClientResponse, start: float) -> tuple[float | None, str]:
    """Read an SSE body as raw chunks: (seconds to the first chunk, error or "")."""
    first: float | None = None
    tail = b""
    async for chunk in resp.content.iter_any():
        if first is None:
            first = time.perf_counter() - start
        tail = (tail + chunk)[-256:]
    if b'data: {"error"' in tail:
        return first, "stream_error_event"
    if not tail.rstrip().endswith(b"[DONE]"):
        return first, "stream_without_done"
    return first, ""


CoreTicks = tuple[int, int, int]


def core_times(cores: list[int]) -> list[CoreTicks]:
    """(busy, irq + softirq, total) jiffies of each core, from the ``cpuN`` lines of /proc/stat."""
    wanted = {f"cpu{core}": core for core in cores}
    found: dict[int, CoreTicks] = {}
    with open("/proc/stat") as stat:
        for line in stat:
            name, *values = line.split()
            if name in wanted:
                ticks = [int(v) for v in values[:8]]
                idle = ticks[3] + ticks[4]  # idle + iowait
                found[wanted[name]] = (sum(ticks) - idle, ticks[5] + ticks[6], sum(ticks))
    return [found.get(core, (0, 0, 0)) for core in cores]


def busy_shares(before: list[CoreTicks], after: list[CoreTicks]) -> list[list[float]]:
    """[busy share, interrupt share] of each core between two readings."""
    shares = []
    for (b0, i0, t0), (b1, i1, t1) in zip(before, after, strict=True):
        span = t1 - t0
        shares.append([(b1 - b0) / span, (i1 - i0) / span] if span > 0 else [0.0, 0.0])
    return shares


async def run_round(spec: RoundSpec) -> RoundResult:
    """Warm up, then run the measured phase; the result of the measured phase only."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=spec.request_timeout)
    result = RoundResult()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     skip_auto_headers=("User-Agent",)) as http:
        state = _Round(spec, http)
        if spec.warmup:
            await state.phase(spec.warmup, None)
        cpu_before = cpu_times(spec.cpu_pid) if spec.cpu_pid else None
        cores_before = core_times(spec.watch_cores)
        started = time.perf_counter()
        await state.phase(spec.max_requests, result)
        result.elapsed = time.perf_counter() - started
        result.core_busy = busy_shares(cores_before, core_times(spec.watch_cores))
        if cpu_before is not None:
            user, system = cpu_times(spec.cpu_pid)
            result.cpu_seconds = user + system - sum(cpu_before)
            result.cpu_sys_seconds = system - cpu_before[1]
    return result


def _loop_factory() -> Any:
    """uvloop when installed: a cheaper client leaves more of the load core to the simulator."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> int:
    """Serve rounds from stdin until it closes (the suite's load generator process)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", type=int, default=None, help="CPU core to pin this process to")
    args = parser.parse_args(argv)
    if args.core is not None:
        pin_self(args.core)
    raise_nofile()
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        for line in sys.stdin:
            if not line.strip():
                continue
            spec = RoundSpec(**orjson.loads(line))
            result = runner.run(run_round(spec))
            sys.stdout.write(orjson.dumps(asdict(result)).decode() + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
