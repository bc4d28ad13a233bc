"""The archive without Redis: a bounded in-process queue in front of the writer.

With the ``memory`` session store there is no outbox stream: the store puts
a turn's record here in the same event-loop step as the session write, and
reader tasks hand the records to the writer. The queue is bounded; a record
that finds it full is refused, and the session layer counts it
(``overflowed``). Like the memory store itself, the queue does not survive the
process: ``close()`` writes what it holds for ``close_timeout_ms`` and logs
what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from gateway.archive.settings import ArchiveConfig
from gateway.archive.tasks import reraise_if_cancelled, stop_tasks
from gateway.archive.writer import ArchiveWriter, pending_of

log = logging.getLogger("gateway.archive")


class LocalQueue:
    """Raw records waiting to be written, oldest first, at most ``max_records``."""

    def __init__(self, max_records: int) -> None:
        self._records: deque[bytes] = deque()
        self._max = max_records
        self._arrived = asyncio.Event()

    def __len__(self) -> int:
        return len(self._records)

    def put(self, raw: bytes) -> bool:
        """Queue a record; False when the queue is full (the caller counts it)."""
        if len(self._records) >= self._max:
            return False
        self._records.append(raw)
        self._arrived.set()
        return True

    def put_back(self, raws: list[bytes]) -> None:
        """Return taken records to the front, in order (even beyond the bound: they
        were in the queue already)."""
        self._records.extendleft(reversed(raws))

    async def take(self, max_records: int, wait_s: float) -> list[bytes]:
        """Up to ``max_records`` records, waiting ``wait_s`` at most for the first."""
        if not self._records and wait_s > 0:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._arrived.wait()
        count = min(max_records, len(self._records))
        return [self._records.popleft() for _ in range(count)]


class LocalArchiver:
    """Reader tasks from the :class:`LocalQueue` to the writer."""

    def __init__(self, queue: LocalQueue, writer: ArchiveWriter, config: ArchiveConfig) -> None:
        self._queue = queue
        self._writer = writer
        self._config = config
        self._tasks: list[asyncio.Task[None]] = []
        self._in_flight = 0
        self._closing = False

    @property
    def backlog(self) -> int:
        """Records queued or being written."""
        return len(self._queue) + self._in_flight

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(), name=f"archive-local-{n}")
                       for n in range(self._config.workers)]

    async def close(self) -> None:
        """Write what is queued (``close_timeout_ms`` at most), then stop."""
        if not self._tasks:  # closed before it started: still write what is queued
            self.start()
        self._closing = True
        await stop_tasks(self._tasks, finish_s=self._config.close_timeout_ms / 1000)
        self._tasks = []
        if self.backlog:
            log.error("archive: closing with %d records never written (local queue)",
                      self.backlog)

    async def _take(self) -> list[bytes]:
        """A batch; a small one waits ``batch_wait_ms`` for more (as the outbox readers
        do: a transaction per record or two would cost the gateway CPU for nothing)."""
        size = self._config.batch_size
        raws = await self._queue.take(size, self._config.poll_interval_ms / 1000)
        linger_s = self._config.batch_wait_ms / 1000
        if not raws or not linger_s or len(raws) >= max(1, size // 2) or self._closing:
            return raws
        self._in_flight += len(raws)
        try:
            await asyncio.sleep(linger_s)
        except asyncio.CancelledError:  # stopped: the records stay queued (and counted)
            self._queue.put_back(raws)
            raise
        finally:
            self._in_flight -= len(raws)
        return raws + await self._queue.take(size - len(raws), 0)

    async def _run(self) -> None:
        wait_s = self._config.poll_interval_ms / 1000
        while not (self._closing and not len(self._queue)):
            raws = await self._take()
            if not raws:
                continue
            self._in_flight += len(raws)
            try:
                await self._writer.write([pending_of(raw) for raw in raws])
            except Exception:  # a bug must not end the task: the queue would never drain
                reraise_if_cancelled()
                log.exception("archive: %d records lost to an unexpected failure", len(raws))
                await asyncio.sleep(wait_s)
            finally:
                self._in_flight -= len(raws)


