"""CPU per archived turn of the archive consumer (outbox -> SQL), in-process.

    taskset -c 0 .venv/bin/python -m bench.archive_cpu [--turns 20000] [--rate 1000]
        [--repeat 3] [--mariadb] [--set batch_wait_ms=0 ...]

The archive runs inside every gateway process, so its CPU is taken from
requests (issue 8: 0.5 ms of CPU per request with sessions). This measures
only the consumer side: it starts its own ``redis-server`` (loopback, temp
dir, pinned to core 1 when there are two cores), and per round

- a producer *subprocess* (any core, or ``--producer-cpu``) appends
  ``--turns`` turns at ``--rate`` turns/s to the bucket outbox streams, in the
  format the session Lua script writes (``XADD stream * r <encode_record()>``),
  16 sessions at a time, 8 turns each, prose-like messages of realistic sizes;
  with ``--sessions-producer`` through a real ``SessionService`` instead
  (``bench/archive_bench.py --load-worker``), which is exact but falls behind
  on a busy machine, and its delays then count as lag;
- this process runs ``ArchiveService`` (the ``[archive]`` defaults, a fresh
  SQLite file in a temp dir, or the private MariaDB with ``--mariadb``) and
  waits until every turn is committed.

Reported per round: this process's CPU (``time.process_time``) from the
producer's start until the last commit, divided by the turns (the producer
is another process, so nothing needs subtracting); transactions and their
sizes (records per ``write``); Redis commands per turn on the consumer side
(XREADGROUP, EVAL of the ack script); lag p50/p99 from turn to commit.
The median over ``--repeat`` rounds is the figure to compare. Bounded: each
round stops after ``--round-timeout`` seconds, servers are stopped at the end.
Run it pinned (``taskset -c 0``): the machine is small and shared.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout: the gateway and tests/services.py

from bench.sessions_cpu import PinnedRedis, event_loop_runner, text  # noqa: E402
from gateway.archive.record import ArchiveRecord, encode_record  # noqa: E402
from gateway.archive.service import ArchiveService  # noqa: E402
from gateway.archive.settings import ArchiveConfig  # noqa: E402
from gateway.archive.stats import percentile  # noqa: E402
from gateway.sessions.keys import KeyScheme  # noqa: E402
from gateway.sessions.settings import SessionsConfig  # noqa: E402
from tests.services import MariaDBServer, redis_command  # noqa: E402

SCRIPT = Path(__file__).resolve()
LOAD_SCRIPT = ROOT / "bench" / "archive_bench.py"
_COUNTED = ("xreadgroup", "eval", "evalsha", "xautoclaim", "xlen")


@dataclass
class Collector:
    """The archive's metrics hook: every lag (the backlog gauge is ignored); ``done`` is
    set at the ``expected``-th commit (no polling of ``ArchiveService.stats``, which
    sorts the recent lags and would be counted as the consumer's CPU)."""

    expected: int
    lags: list[float] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def observe_archive_lag(self, seconds: float) -> None:
        self.lags.append(seconds)
        if len(self.lags) >= self.expected:
            self.done.set()

    def set_archive_backlog(self, records: int) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Round:
    turns: int
    cpu_s: float
    wall_s: float
    writes: list[int]
    commands: dict[str, int]
    lag_p50_ms: float
    lag_p99_ms: float

    @property
    def cpu_us_per_turn(self) -> float:
        return self.cpu_s / self.turns * 1e6

    def line(self) -> str:
        sizes = sorted(self.writes)
        per_turn = ", ".join(f"{name} {count / self.turns:.3f}"
                             for name, count in self.commands.items() if count)
        return (f"{self.cpu_us_per_turn:.0f} µs CPU per turn; {len(sizes)} writes, records "
                f"per write mean {statistics.fmean(sizes):.1f} p50 {percentile(sizes, 0.5)} "
                f"p99 {percentile(sizes, 0.99)}; lag p50 {self.lag_p50_ms:.0f} ms p99 "
                f"{self.lag_p99_ms:.0f} ms; Redis commands per turn: {per_turn}; "
                f"{self.turns / self.wall_s:.0f} turns/s")


def command_counts(port: int) -> dict[str, int]:
    """Calls per command so far (``INFO commandstats``)."""
    stats = redis_command(port, "INFO", "commandstats")
    counts = {name: 0 for name in _COUNTED}
    for key, entry in stats.items():
        name = str(key).removeprefix("cmdstat_")
        if name in counts:
            counts[name] = int(entry["calls"])
    return counts


def produce_direct(redis_url: str, turns: int, rate: float, worker: int) -> None:
    """Producer mode: XADD ``turns`` records at ``rate`` as the session script does
    (``XADD {prefix}{shard_NN}:outbox * r <record>``), 16 sessions at a time of
    8 turns, prose-like messages; cheap enough to keep its pace on a busy machine
    (the ``SessionService`` producer falls behind, and its backlog shows up as lag)."""
    import redis

    config = SessionsConfig(store="redis", url=redis_url)
    keys, rng = KeyScheme(config.prefix, config.buckets), random.Random(worker)
    plan = []
    for n in range(turns):
        session, seq = f"w{worker}-s{n // (16 * 8) * 16 + n % 16}", n // 16 % 8 + 1
        messages = [{"role": "user", "content": text(rng, 300, 10, 4000)},
                    {"role": "assistant", "content": text(rng, 1100, 40, 6000)}]
        if seq == 1 and rng.random() < 0.5:
            messages.insert(0, {"role": "system", "content": text(rng, 200, 40, 800)})
        plan.append((keys.outbox_key(keys.bucket(session)), session, seq, tuple(messages)))
    client = redis.Redis.from_url(redis_url)
    start, sent = time.monotonic(), 0
    while sent < turns:
        due = min(turns, int((time.monotonic() - start) * rate) + 1)
        pipe = client.pipeline(transaction=False)
        for stream, session, seq, messages in plan[sent:due]:
            record = ArchiveRecord("bench", session, f"{session}-t{seq}", seq,
                                   int(time.time() * 1000), messages, "bench-model",
                                   "bench-backend", 100, 200, 300)
            pipe.xadd(stream, {"r": encode_record(record)})
        pipe.execute()
        sent = due
        time.sleep(max(0.0, start + sent / rate - time.monotonic()))
    client.close()


async def produce(redis_url: str, turns: int, rate: float, worker: int,
                  cpu: int | None, sessions: bool) -> asyncio.subprocess.Process:
    """The producer subprocess: direct XADDs, or (``sessions``) a ``SessionService``."""
    argv = [sys.executable, str(SCRIPT), "--produce", redis_url, "--turns", str(turns),
            "--rate", str(rate), "--worker", str(worker)]
    if sessions:
        argv = [sys.executable, str(LOAD_SCRIPT), "--load-worker", redis_url, "--rate",
                str(rate), "--seconds", str(turns / rate), "--sessions", "2000",
                "--worker", str(worker)]
    # Inherited affinity would put it on this process's core: pin it explicitly.
    cpus = str(cpu) if cpu is not None else f"0-{(os.cpu_count() or 1) - 1}"
    argv = ["taskset", "-c", cpus, *argv]
    return await asyncio.create_subprocess_exec(*argv, cwd=ROOT,
                                                stdout=asyncio.subprocess.DEVNULL)


def record_writes(archive: ArchiveService, sizes: list[int]) -> None:
    """Count records per ``ArchiveWriter.write`` (one transaction when all goes well)."""
    writer = archive.writer
    write = writer.write

    async def counted(items: Sequence[Any], keepalive: Any = None) -> None:
        sizes.append(len(items))
        await write(items, keepalive)

    writer.write = counted  # type: ignore[method-assign]


async def one_round(args: argparse.Namespace, number: int, redis: PinnedRedis,
                    config: ArchiveConfig) -> Round:
    """One archive, fresh tables, ``--turns`` turns; CPU from the producer's start to
    the last commit (the archive is started first: its startup is not counted)."""
    sessions = SessionsConfig(store="redis", url=redis.url)
    collector, sizes = Collector(args.turns), []
    archive = ArchiveService(config, sessions, collector)
    record_writes(archive, sizes)
    await archive.start()
    try:
        await asyncio.sleep(0.5)  # tables created, readers blocked on the empty outbox
        gc.collect()
        before = command_counts(redis.port)
        wall, cpu = time.perf_counter(), time.process_time()
        producer = await produce(redis.url, args.turns, args.rate, number, args.producer_cpu,
                                 args.sessions_producer)
        try:
            async with asyncio.timeout(args.round_timeout):
                await collector.done.wait()
        finally:
            if producer.returncode is None:
                await asyncio.wait_for(producer.wait(), timeout=args.round_timeout)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        after = command_counts(redis.port)
        if archive.stats.duplicate_rows or archive.stats.dead_letters:
            raise RuntimeError(f"unexpected duplicates or dead letters: {archive.stats}")
    finally:
        await archive.close()
    lags = sorted(collector.lags)
    commands = {name: after[name] - before[name] for name in _COUNTED}
    return Round(args.turns, cpu, wall, sizes, commands,
                 1000 * (percentile(lags, 0.5) or 0), 1000 * (percentile(lags, 0.99) or 0))


def archive_config(args: argparse.Namespace, url: str, number: int) -> ArchiveConfig:
    """The ``[archive]`` defaults (what the A/B measured), a table per round, ``--set``."""
    dialect = "sqlite" if url.startswith("sqlite") else "mysql"
    config = ArchiveConfig(url=url, dialect=dialect, table=f"cpu_{os.getpid()}_{number}")
    fields = {f.name: f.type for f in dataclasses.fields(ArchiveConfig)}
    for setting in args.set:
        name, _, value = setting.partition("=")
        if name not in fields:
            raise SystemExit(f"--set {setting}: no such [archive] key")
        kind = type(getattr(config, name))
        typed = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
        config = replace(config, **{name: typed})
    return config


async def measure(args: argparse.Namespace, redis: PinnedRedis, db_dir: Path,
                  mariadb: MariaDBServer | None) -> list[Round]:
    """A warm-up round (imports, first connections, SQLite files), then ``--repeat``."""
    rounds = []
    for number in range(args.repeat + 1):  # the first round warms up, not counted
        redis.flushall()
        url = (mariadb.url if mariadb is not None
               else f"sqlite+aiosqlite:///{db_dir / f'archive-{number}.db'}")
        config = archive_config(args, url, number)
        result = await one_round(args, number, redis, config)
        label = "warm-up" if number == 0 else f"round {number}"
        print(f"{label}: {result.line()}", flush=True)
        if number:
            rounds.append(result)
    return rounds


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20_000, help="turns per round")
    parser.add_argument("--rate", type=float, default=1000.0, help="turns/s produced")
    parser.add_argument("--repeat", type=int, default=3, help="measured rounds")
    parser.add_argument("--mariadb", action="store_true", help="MariaDB instead of SQLite")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an [archive] setting (repeatable), e.g. batch_wait_ms=0")
    parser.add_argument("--redis-cpu", type=int, default=1 if (os.cpu_count() or 1) > 1
                        else None, help="core for redis-server (taskset); -1: no pinning")
    parser.add_argument("--producer-cpu", type=int, default=None,
                        help="core for the producer subprocess (default: any core)")
    parser.add_argument("--sessions-producer", action="store_true",
                        help="produce through SessionService (bench/archive_bench.py)")
    parser.add_argument("--round-timeout", type=float, default=300.0)
    parser.add_argument("--produce", metavar="REDIS_URL", help=argparse.SUPPRESS)
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.redis_cpu is not None and args.redis_cpu < 0:
        args.redis_cpu = None
    if not 0 < args.turns <= 200_000 or not 0 < args.rate <= 5_000:
        parser.error("--turns must be in (0, 200000], --rate in (0, 5000]")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.produce:
        produce_direct(args.produce, args.turns, args.rate, args.worker)
        return 0
    logging.basicConfig(level=logging.WARNING)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    print(f"# archive_cpu: {args.repeat} rounds of {args.turns} turns at {args.rate:g}/s, "
          f"{'MariaDB' if args.mariadb else 'SQLite'}, settings {args.set or 'default'}; "
          f"consumer on CPUs {affinity}, redis-server and producer on CPU {args.redis_cpu}")
    redis = PinnedRedis(args.redis_cpu).start()
    mariadb = MariaDBServer().start() if args.mariadb else None
    try:
        with tempfile.TemporaryDirectory(prefix="archive-cpu-") as db_dir, \
                event_loop_runner() as runner:
            rounds = runner.run(measure(args, redis, Path(db_dir), mariadb))
    finally:
        redis.stop()
        if mariadb is not None:
            mariadb.stop()
    per_turn = [r.cpu_us_per_turn for r in rounds]
    p99 = [r.lag_p99_ms for r in rounds]
    mean_write = [statistics.fmean(r.writes) for r in rounds]
    print(f"median CPU per turn: {statistics.median(per_turn):.0f} µs (rounds: "
          f"{', '.join(f'{v:.0f}' for v in per_turn)}); median records per write "
          f"{statistics.median(mean_write):.1f}; median lag p50 "
          f"{statistics.median(r.lag_p50_ms for r in rounds):.0f} ms, p99 "
          f"{statistics.median(p99):.0f} ms (worst {max(p99):.0f} ms, target 800 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
