"""CPU per session turn (bind + commit) against a local Redis: issue 8's session target.

    taskset -c 0 .venv/bin/python -m bench.sessions_cpu [--turns 3000] [--repeat 3]

Issue 8 wants at most 0.5 ms of gateway CPU per non-streaming chat request
with sessions on. This isolates the session part of that cost: it starts its
own ``redis-server`` (loopback, ephemeral port, temp dir; pinned to core 1
with ``taskset`` when the machine has two cores, so Redis's CPU is not counted
and does not compete), builds :class:`SessionService` exactly as
``gateway/app.py`` does (``SessionService(config.sessions, outbox=...)`` with
the archive's outbox policy, since the archive is on by default), and runs
what the proxy does per request: ``bind``, ``request_body``, ``observe_json``,
``commit``. Conversations of 8 turns of prose-like text (log-normal lengths:
user median ~300 characters, assistant ~1,100, half of them with a system
prompt; about 15-20 KiB of JSON and 7-9 KiB stored after 8 turns, somewhat
more than ShareGPT's median conversation of 7.9 KiB) run 16 at a time, each
conversation's turns in order, as a client waits for an answer before it
sends the next message. The text is generated before the clock starts.

Reported per round: CPU µs per turn of this process (``time.process_time``:
everything the event loop did for the turns), turns per second, Redis
commands per turn (``INFO commandstats``, which counts the commands scripts
run too), compare-and-set conflicts and degraded turns.
The median over ``--repeat`` rounds is the figure to compare. Bounded: a fixed
number of turns, and each round under ``--round-timeout`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout: the gateway and tests/services.py

from gateway.archive.record import OutboxPolicy  # noqa: E402
from gateway.archive.settings import ArchiveConfig  # noqa: E402
from gateway.sessions.keys import KeyScheme  # noqa: E402
from gateway.sessions.service import SessionService  # noqa: E402
from gateway.sessions.settings import SessionsConfig  # noqa: E402
from tests.services import RedisServer, redis_command  # noqa: E402

Message = dict[str, Any]
_PROSE = ("the of and to a in that is for it as with was on be by this are or at from "
         "have an they which one you were all we can her has there been if more when "
         "will would who so no use data model time code function return value list "
         "string error file python example system user request server client question "
         "answer because however first also these into then only other its about make "
         "like than some could them see way may well should need just each how between "
         "write following step result number given type class method output input text "
         "process information important provide different specific approach")
WORDS = tuple(_PROSE.split())


class PinnedRedis(RedisServer):
    """A private redis-server, started under ``taskset -c CPU`` when a CPU is given."""

    def __init__(self, cpu: int | None) -> None:
        super().__init__()
        self.cpu = cpu

    def _argv(self) -> list[str]:
        argv = super()._argv()
        taskset = shutil.which("taskset")
        if self.cpu is None or taskset is None:
            return argv
        return [taskset, "-c", str(self.cpu), *argv]  # taskset execs: the pid stays


@dataclass(frozen=True, slots=True)
class Step:
    """One request of a conversation, prepared before the clock starts."""

    body: dict[str, Any]
    completion: bytes


@dataclass(frozen=True, slots=True)
class Round:
    turns: int
    cpu_s: float
    wall_s: float
    commands: int
    conflicts: int
    degraded: int

    @property
    def cpu_us_per_turn(self) -> float:
        return self.cpu_s / self.turns * 1e6


def text(rng: random.Random, median: int, low: int, high: int) -> str:
    """Prose-like text with a log-normal length (median ``median`` characters)."""
    size = int(min(high, max(low, rng.lognormvariate(0, 0.8) * median)))
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]


def conversation(rng: random.Random, turns: int) -> list[Step]:
    """``turns`` requests: a system prompt with the first (some conversations), then
    one user message each; the answer becomes the turn's assistant message."""
    steps = []
    for index in range(turns):
        messages: list[Message] = []
        if index == 0 and rng.random() < 0.5:
            messages.append({"role": "system", "content": text(rng, 200, 40, 800)})
        messages.append({"role": "user", "content": text(rng, 300, 10, 4000)})
        answer = text(rng, 1100, 40, 6000)
        completion = orjson.dumps({
            "id": "chatcmpl-bench", "object": "chat.completion", "model": "sim-model",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": answer}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 200, "total_tokens": 300}})
        steps.append(Step({"model": "sim-model", "messages": messages}, completion))
    return steps


async def run_conversation(service: SessionService, session_id: str,
                           steps: Sequence[Step]) -> int:
    """The proxy's calls for each request, in order; how many turns were degraded."""
    degraded = 0
    for index, step in enumerate(steps):
        binding = await service.bind("default", session_id, step.body)
        binding.request_body()
        binding.observe_json(step.completion)
        await binding.commit(f"{session_id}-req-{index}")
        degraded += binding.degraded
    return degraded


async def run_round(service: SessionService, port: int, label: str,
                    conversations: Sequence[list[Step]], concurrency: int,
                    timeout_s: float) -> Round:
    """Every conversation once (``concurrency`` at a time), under ``timeout_s``."""
    queue = list(enumerate(conversations))
    queue.reverse()
    degraded = [0]

    async def client() -> None:
        while queue:
            number, steps = queue.pop()
            degraded[0] += await run_conversation(service, f"{label}-{number}", steps)

    conflicts = service.stats.conflicts
    commands = command_count(port)
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    async with asyncio.timeout(timeout_s):
        await asyncio.gather(*(client() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    turns = sum(len(steps) for steps in conversations)
    return Round(turns, cpu, wall, command_count(port) - commands - 1,
                 service.stats.conflicts - conflicts, degraded[0])


def command_count(port: int) -> int:
    """Commands the server has run (``INFO commandstats``; the INFO itself included)."""
    stats = redis_command(port, "INFO", "commandstats")
    return sum(int(entry["calls"]) for entry in stats.values())


def build_service(url: str, with_outbox: bool) -> SessionService:
    """As ``gateway/app.py`` builds it: the configured store via the factory, plus the
    archive's outbox policy (default settings; nobody drains the streams here)."""
    config = replace(SessionsConfig(), store="redis", url=url)
    if not with_outbox:
        return SessionService(config)
    policy = OutboxPolicy(KeyScheme(config.prefix, config.buckets),
                          ArchiveConfig().outbox_max_records, lambda record: True, lambda: None)
    return SessionService(config, outbox=policy)


async def measure(args: argparse.Namespace, server: PinnedRedis) -> list[Round]:
    rng = random.Random(args.seed)
    count = -(-args.turns // args.turns_per_conversation)
    service = build_service(server.url, not args.no_outbox)
    await service.start()
    rounds = []
    try:
        warm = [conversation(rng, args.turns_per_conversation) for _ in range(32)]
        await run_round(service, server.port, "warm", warm, args.concurrency,
                        args.round_timeout)
        for number in range(args.repeat):
            conversations = [conversation(rng, args.turns_per_conversation)
                             for _ in range(count)]
            result = await run_round(service, server.port, f"r{number}", conversations,
                                     args.concurrency, args.round_timeout)
            rounds.append(result)
            print(f"round {number + 1}: {result.turns} turns, "
                  f"{result.cpu_us_per_turn:.0f} µs CPU per turn, "
                  f"{result.turns / result.wall_s:,.0f} turns/s, "
                  f"{result.commands / result.turns:.2f} Redis commands per turn "
                  f"(those scripts run included), "
                  f"{result.conflicts} conflicts, {result.degraded} degraded", flush=True)
    finally:
        await service.close()
    return rounds


def event_loop_runner() -> asyncio.Runner:
    """uvloop when installed, as ``gateway/server.py`` runs the gateway."""
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=3000, help="turns per round")
    parser.add_argument("--turns-per-conversation", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="measured rounds")
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--no-outbox", action="store_true",
                        help="without the archive's outbox record (archive off)")
    parser.add_argument("--redis-cpu", type=int, default=1 if (os.cpu_count() or 1) > 1
                        else None, help="core for redis-server (taskset); -1: no pinning")
    parser.add_argument("--round-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    if args.redis_cpu is not None and args.redis_cpu < 0:
        args.redis_cpu = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    print(f"# sessions_cpu: {args.repeat} rounds of {args.turns} turns "
          f"({args.turns_per_conversation} per conversation), concurrency "
          f"{args.concurrency}, outbox {'off' if args.no_outbox else 'on'}; "
          f"this process on CPUs {affinity}, redis-server on CPU {args.redis_cpu}")
    server = PinnedRedis(args.redis_cpu).start()
    try:
        with event_loop_runner() as runner:
            rounds = runner.run(measure(args, server))
    finally:
        server.stop()
    per_turn = [r.cpu_us_per_turn for r in rounds]
    print(f"median CPU per turn: {statistics.median(per_turn):.0f} µs "
          f"(rounds: {', '.join(f'{v:.0f}' for v in per_turn)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
