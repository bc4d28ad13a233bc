"""Counters, lag and backlog of the archive, for metrics, ``/readyz`` and tests.

The archive mutates one :class:`ArchiveCounters` on the event loop; readers
get a frozen :class:`ArchiveStats` snapshot. The metrics module is told about
lag and backlog through an optional object with ``observe_archive_lag`` and
``set_archive_backlog`` (:class:`ArchiveMetrics`, which
``gateway.telemetry.metrics.GatewayMetrics`` satisfies).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.archive.record import ArchiveRecord

RECENT_LAGS = 20_000
"""Lags kept for the percentiles of :class:`ArchiveStats` (the histogram has them all)."""


class ArchiveMetrics(Protocol):
    def observe_archive_lag(self, seconds: float) -> None: ...

    def set_archive_backlog(self, records: int) -> None: ...


@dataclass(slots=True)
class ArchiveCounters:
    """Running totals since start."""

    records_written: int = 0
    """Records (turns) whose rows are committed, or were found committed already."""
    rows_inserted: int = 0
    batches_written: int = 0
    """Transactions that committed rows: ``records_written / batches_written`` is the
    batch size achieved (each transaction costs CPU whatever its size)."""
    duplicate_rows: int = 0
    """Rows a redelivery found already written (harmless, but counted)."""
    dead_letters: int = 0
    """Records the database refused, moved to the dead-letter table with the reason."""
    dead_letter_failures: int = 0
    """Refused records that could not even be moved aside (logged, then dropped)."""
    overflowed: int = 0
    """Records refused because the outbox (or the local queue) was full: not archived."""
    claimed: int = 0
    """Records claimed from a consumer that held them past ``claim_idle_ms``."""
    write_failures: int = 0
    """Transactions that failed (the database down, or a refused row in the batch)."""
    outbox_failures: int = 0
    """Outbox calls to Redis that failed."""
    outbox_backlog: int = 0
    """Records in the outbox streams at the last sample (read or not)."""
    database_down: bool = False
    outbox_down: bool = False
    lags: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_LAGS))


class LagRecorder:
    """Records, at commit, how long each record took from its turn to the archive."""

    def __init__(self, counters: ArchiveCounters, metrics: ArchiveMetrics | None) -> None:
        self._counters = counters
        self._metrics = metrics

    def committed(self, records: Iterable[ArchiveRecord]) -> None:
        now_ms = time.time() * 1000
        lags = self._counters.lags
        observe = self._metrics.observe_archive_lag if self._metrics is not None else None
        for record in records:
            lag = max(0.0, (now_ms - record.ts_ms) / 1000)
            lags.append(lag)
            if observe is not None:
                observe(lag)


@dataclass(frozen=True, slots=True)
class ArchiveStats:
    """A snapshot of :class:`ArchiveCounters` plus the backlog and recent lag."""

    records_written: int
    rows_inserted: int
    batches_written: int
    duplicate_rows: int
    dead_letters: int
    dead_letter_failures: int
    overflowed: int
    claimed: int
    write_failures: int
    outbox_failures: int
    backlog: int
    """Records waiting: in the outbox streams (last sample), the local queue, and
    the batches this gateway is writing."""
    lag_p50_s: float | None
    lag_p99_s: float | None
    lag_max_s: float | None
    """Over the last :data:`RECENT_LAGS` records."""

    @classmethod
    def of(cls, counters: ArchiveCounters, backlog: int) -> ArchiveStats:
        lags = sorted(counters.lags)
        return cls(
            records_written=counters.records_written, rows_inserted=counters.rows_inserted,
            batches_written=counters.batches_written,
            duplicate_rows=counters.duplicate_rows, dead_letters=counters.dead_letters,
            dead_letter_failures=counters.dead_letter_failures,
            overflowed=counters.overflowed, claimed=counters.claimed,
            write_failures=counters.write_failures,
            outbox_failures=counters.outbox_failures, backlog=backlog,
            lag_p50_s=percentile(lags, 0.50), lag_p99_s=percentile(lags, 0.99),
            lag_max_s=lags[-1] if lags else None)


def percentile(ordered: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted values (nearest rank), None when there are none."""
    if not ordered:
        return None
    rank = min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]
