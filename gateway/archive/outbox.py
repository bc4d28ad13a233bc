"""Archive readers of the Redis outbox: read, write a batch, acknowledge after commit.

Every gateway runs ``workers`` readers per Redis server (or cluster), each
owning a share of the buckets, all in one consumer group: a record goes to one
reader, and a record whose reader died — its gateway killed mid-batch — stays
pending in the group. Every ``claim_interval_ms`` each reader claims the
records of its buckets that have been pending longer than ``claim_idle_ms``
(XAUTOCLAIM), whoever held them, and writes them like new ones: the upsert
makes a second delivery of a committed record harmless (and counted).

A reader that waits for the database keeps its records claimed (XCLAIM
JUSTID before each wait), so other gateways do not take them over while it
is alive; they all wait for the same database anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Sequence

from redis.asyncio import RedisCluster

from gateway.archive.outbox_redis import (
    NoGroup,
    OutboxOps,
    OutboxUnavailable,
    Partition,
    StreamEntry,
)
from gateway.archive.settings import ArchiveConfig
from gateway.archive.stats import ArchiveCounters
from gateway.archive.tasks import reraise_if_cancelled, stop_tasks
from gateway.archive.writer import ArchiveWriter, Pending, pending_of

log = logging.getLogger("gateway.archive")
SAMPLE_INTERVAL_S = 1.0
"""How often the backlog (the outbox streams' length) is sampled."""
FORGET_CONSUMERS_AFTER_MS = 3_600_000
_FORGET_EVERY_S = 600.0
_ACK_ATTEMPTS = 20


class OutboxReader:
    """One reader task: some buckets' streams on one partition."""

    def __init__(self, ops: OutboxOps, writer: ArchiveWriter, config: ArchiveConfig,
                 counters: ArchiveCounters, cluster: bool) -> None:
        self._ops = ops
        self._writer = writer
        self._config = config
        self._counters = counters
        self._cluster = cluster
        self._per_stream = max(8, -(-config.batch_size // max(1, len(ops.streams))))
        self._fill_below = max(1, config.batch_size // 2)
        """A read bringing fewer records than this waits ``batch_wait_ms`` for more."""
        self._closing = False
        self._failures = 0
        self.in_flight = 0

    def close(self) -> None:
        """Stop after the batch in hand (the current read returns within its block time)."""
        self._closing = True

    async def run(self) -> None:
        next_claim = 0.0  # at once: records a dead gateway left are waiting
        next_forget = time.monotonic() + _FORGET_EVERY_S
        groups_ready = False
        while not self._closing:
            try:
                if not groups_ready:
                    await self._ops.ensure_groups()
                    groups_ready = True
                entries: list[StreamEntry] = []
                if time.monotonic() >= next_claim:
                    entries = await self._claim()
                    next_claim = time.monotonic() + (
                        0 if entries else self._config.claim_interval_ms / 1000)
                if not entries:
                    entries = await self._read_batch()
                if time.monotonic() >= next_forget:
                    next_forget = time.monotonic() + _FORGET_EVERY_S
                    await self._ops.forget_idle_consumers(FORGET_CONSUMERS_AFTER_MS)
            except OutboxUnavailable as exc:
                groups_ready = groups_ready and not isinstance(exc, NoGroup)
                await self._failed(exc)
                continue
            self._recovered()
            if entries:
                await self._deliver_or_leave(entries)
            elif self._cluster:  # cluster reads do not block: wait here instead
                await asyncio.sleep(self._config.poll_interval_ms / 1000)

    async def _read_batch(self) -> list[StreamEntry]:
        """New records; a small read waits ``batch_wait_ms`` and reads again (without
        blocking), so that a steady trickle is written in batches, not one by one:
        each transaction and acknowledgement costs the gateway CPU whatever its size.
        A full read (a backlog) is written at once."""
        entries = await self._ops.read_new(self._per_stream, self._config.poll_interval_ms)
        wait_s = self._config.batch_wait_ms / 1000
        if not entries or not wait_s or len(entries) >= self._fill_below or self._closing:
            return entries
        await asyncio.sleep(wait_s)
        try:  # with no BLOCK, XREADGROUP answers at once
            return entries + await self._ops.read_new(self._per_stream, None)
        except OutboxUnavailable:  # write what was read; the next read reports it
            return entries

    async def _claim(self) -> list[StreamEntry]:
        entries = await self._ops.claim_stale(self._config.claim_idle_ms, self._per_stream)
        if entries:
            self._counters.claimed += len(entries)
            log.info("archive: claimed %d records left pending by another reader",
                     len(entries))
        return entries

    async def _deliver_or_leave(self, entries: Sequence[StreamEntry]) -> None:
        """Deliver; on a bug, leave the records pending (they will be claimed again)."""
        try:
            await self._deliver(entries)
        except Exception:  # a bug must not end the task: these buckets would stall
            reraise_if_cancelled()
            log.exception("archive: %d records left pending after an unexpected failure",
                          len(entries))
            self._failures += 1
            await asyncio.sleep(self._backoff(self._failures))

    async def _deliver(self, entries: Sequence[StreamEntry]) -> None:
        size = self._config.batch_size
        for start in range(0, len(entries), size):
            chunk = entries[start:start + size]
            self.in_flight += len(chunk)
            try:
                await self._writer.write([_pending(entry) for entry in chunk],
                                         keepalive=lambda chunk=chunk: self._touch(chunk))
                await self._ack(chunk)
            finally:
                self.in_flight -= len(chunk)

    async def _touch(self, chunk: Sequence[StreamEntry]) -> None:
        try:
            await self._ops.touch(chunk)
        except OutboxUnavailable as exc:
            log.debug("archive: could not keep %d records claimed: %r", len(chunk), exc)

    async def _ack(self, chunk: Sequence[StreamEntry]) -> None:
        """Acknowledge committed records; if Redis does not answer for half the claim
        idle time, leave them: they will be claimed, found written, and skipped."""
        deadline = time.monotonic() + self._config.claim_idle_ms / 2000
        for attempt in range(_ACK_ATTEMPTS):
            try:
                await self._ops.ack(chunk)
                return
            except OutboxUnavailable as exc:
                self._counters.outbox_failures += 1
                if time.monotonic() >= deadline or attempt == _ACK_ATTEMPTS - 1:
                    log.warning("archive: %d committed records not acknowledged (%r); "
                                "they will be delivered again and skipped", len(chunk), exc)
                    return
                await asyncio.sleep(self._backoff(attempt))

    async def _failed(self, exc: OutboxUnavailable) -> None:
        self._counters.outbox_failures += 1
        self._failures += 1
        if not self._counters.outbox_down:
            log.warning("archive: the outbox is unavailable: %r", exc)
        self._counters.outbox_down = True
        await asyncio.sleep(self._backoff(self._failures))

    def _recovered(self) -> None:
        if self._failures:
            log.info("archive: the outbox answers again")
            self._counters.outbox_down = False
            self._failures = 0

    def _backoff(self, failures: int) -> float:
        initial = self._config.backoff_initial_ms / 1000
        cap = self._config.backoff_max_ms / 1000
        return random.uniform(initial / 2, min(cap, initial * 2 ** min(failures, 30)))


def _pending(entry: StreamEntry) -> Pending:
    if not entry.raw:
        return Pending(b"", None, f"outbox entry {entry.entry_id.decode()} has no record")
    return pending_of(entry.raw)


class OutboxArchiver:
    """The readers of one gateway over every partition, and the backlog sampler."""

    def __init__(self, partitions: Sequence[Partition], writer: ArchiveWriter,
                 config: ArchiveConfig, counters: ArchiveCounters) -> None:
        self._partitions = tuple(partitions)
        self._config = config
        self._counters = counters
        consumer = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        budget = config.redis_timeout_ms / 1000
        self._readers: list[OutboxReader] = []
        self._samplers: list[OutboxOps] = []
        for partition in self._partitions:
            cluster = isinstance(partition.client, RedisCluster)
            workers = min(config.workers, len(partition.streams))
            for n in range(workers):
                ops = OutboxOps(partition.client, partition.streams[n::workers],
                                config.consumer_group, f"{consumer}-{n}", budget)
                self._readers.append(OutboxReader(ops, writer, config, counters, cluster))
            self._samplers.append(OutboxOps(partition.client, partition.streams,
                                            config.consumer_group, consumer, budget))
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def in_flight(self) -> int:
        return sum(reader.in_flight for reader in self._readers)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(reader.run(), name=f"archive-outbox-{n}")
                       for n, reader in enumerate(self._readers)]
        self._tasks.append(asyncio.create_task(self._sample(), name="archive-backlog"))

    async def sample(self) -> int:
        """The outbox backlog now (also kept in the counters)."""
        total = 0
        for ops in self._samplers:
            total += await ops.backlog()
        self._counters.outbox_backlog = total
        return total

    async def _sample(self) -> None:
        while True:
            try:
                await self.sample()
            except OutboxUnavailable:
                pass  # the readers report it; the last sample stands
            except Exception:  # a bug must not end the task: the gauge would freeze
                reraise_if_cancelled()
                log.exception("archive: sampling the outbox backlog failed")
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    async def close(self) -> None:
        """Finish the batches in hand (``close_timeout_ms`` at most), then stop; what
        is still pending is claimed by another gateway (or this one, restarted)."""
        for reader in self._readers:
            reader.close()
        readers, sampler = self._tasks[:-1], self._tasks[-1:]
        await stop_tasks(readers, finish_s=self._config.close_timeout_ms / 1000)
        await stop_tasks(sampler, finish_s=0)
        self._tasks = []
        for partition in self._partitions:
            with contextlib.suppress(Exception):
                await partition.client.aclose()
