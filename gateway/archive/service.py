"""The archive service: what ``app.py`` builds, starts, closes, and asks about health.

With a Redis session store, records reach the database from the outbox
streams (:mod:`gateway.archive.outbox`); with the ``memory`` store, from the
local queue (:mod:`gateway.archive.local_queue`). Either way the session layer
hands records over through :attr:`ArchiveService.outbox_policy`, which the
:class:`~gateway.sessions.SessionService` takes at construction.

Nothing here affects requests: a database that is down makes the archive
*degraded* (records wait, bounded), never a request slower or failed.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.archive.local_queue import LocalArchiver, LocalQueue
from gateway.archive.outbox import SAMPLE_INTERVAL_S, OutboxArchiver
from gateway.archive.outbox_redis import build_partitions
from gateway.archive.record import OutboxPolicy
from gateway.archive.settings import ArchiveConfig
from gateway.archive.stats import ArchiveCounters, ArchiveMetrics, ArchiveStats, LagRecorder
from gateway.archive.tasks import reraise_if_cancelled, stop_tasks
from gateway.archive.writer import ArchiveWriter
from gateway.sessions.keys import KeyScheme
from gateway.sessions.settings import SessionsConfig

log = logging.getLogger("gateway.archive")


class ArchiveService:
    """Archives every session turn; see :mod:`gateway.archive`."""

    def __init__(self, config: ArchiveConfig, sessions: SessionsConfig,
                 metrics: ArchiveMetrics | None = None) -> None:
        """``metrics``: anything with ``observe_archive_lag(seconds)`` and
        ``set_archive_backlog(records)`` (e.g. ``GatewayMetrics``)."""
        self._config = config
        self._metrics = metrics
        self._counters = ArchiveCounters()
        socket_timeout = (config.redis_timeout_ms + config.poll_interval_ms) / 1000
        partitions = build_partitions(sessions, socket_timeout) if sessions.remote else []
        readers = sum(min(config.workers, len(p.streams)) for p in partitions)
        self._writer = ArchiveWriter(config, self._counters,
                                     LagRecorder(self._counters, metrics),
                                     pool_size=(readers or config.workers) + 1)
        self._queue = LocalQueue(config.local_queue_max)
        self._outbox = (OutboxArchiver(partitions, self._writer, config, self._counters)
                        if partitions else None)
        self._local = (LocalArchiver(self._queue, self._writer, config)
                       if not partitions else None)
        self.outbox_policy = OutboxPolicy(KeyScheme(sessions.prefix, sessions.buckets),
                                          config.outbox_max_records, self._queue.put,
                                          self._refused)
        """Pass to ``SessionService(config, outbox=...)``."""
        self._task: asyncio.Task[None] | None = None

    @property
    def config(self) -> ArchiveConfig:
        return self._config

    @property
    def writer(self) -> ArchiveWriter:
        return self._writer

    @property
    def backlog(self) -> int:
        """Records waiting: in the outbox streams (sampled every second), or in the
        local queue and the batches being written."""
        if self._outbox is not None:
            return self._counters.outbox_backlog
        return self._local.backlog if self._local is not None else 0

    @property
    def stats(self) -> ArchiveStats:
        return ArchiveStats.of(self._counters, self.backlog)

    @property
    def degraded_reason(self) -> str | None:
        """Why the archive is behind or blocked now, or None: for ``/readyz``, which
        reports it without failing (requests are not affected)."""
        counters = self._counters
        if counters.database_down:
            return "archive database unavailable"
        if counters.outbox_down:
            return "archive outbox unavailable"
        if self.backlog >= self._config.degraded_backlog:
            return f"archive backlog of {self.backlog} records"
        return None

    @property
    def degraded(self) -> bool:
        return self.degraded_reason is not None

    async def start(self) -> None:
        """Start in the background: creating the tables must not hold up the gateway's
        start (a database that is down is only logged, the readers wait for it)."""
        self._task = asyncio.create_task(self._run(), name="archive")

    async def _run(self) -> None:
        await self._writer.start()
        if self._outbox is not None:
            try:
                await self._outbox.sample()
            except Exception:  # Redis is down: the readers wait for it
                reraise_if_cancelled()
            self._outbox.start()
        if self._local is not None:
            self._local.start()
        while True:
            self._report_once()
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    async def close(self) -> None:
        """Close after the session service (its last writes feed the outbox): write
        what this gateway holds for ``close_timeout_ms`` at most, then stop."""
        if self._task is not None:
            await stop_tasks([self._task], finish_s=0)
            self._task = None
        if self._outbox is not None:
            await self._outbox.close()
        if self._local is not None:
            await self._local.close()
        self._report_once()
        await self._writer.close()

    async def sample_backlog(self) -> int:
        """Sample the outbox now instead of waiting for the next second (tests, tools)."""
        if self._outbox is not None:
            await self._outbox.sample()
        return self.backlog

    def _refused(self) -> None:
        self._counters.overflowed += 1

    def _report_once(self) -> None:
        if self._metrics is not None:
            self._metrics.set_archive_backlog(self.backlog)
