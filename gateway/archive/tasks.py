"""Background tasks that stop when told to, even through libraries that lose a cancel.

A client library that cleans up in a ``finally`` (a pipeline releasing its
connection, a pool rolling back) can replace the ``CancelledError`` of a
cancelled task with its own error. A loop that catches that error to retry
would then run on after ``close()`` cancelled it, and ``close()`` would wait
for ever. So every broad ``except`` in the archive's loops asks
:func:`reraise_if_cancelled` first, and :func:`stop_tasks` waits a bounded
time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

log = logging.getLogger("gateway.archive")
STOP_GRACE_S = 2.0


def reraise_if_cancelled() -> None:
    """Raise ``CancelledError`` if the running task has been asked to stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def stop_tasks(tasks: Collection[asyncio.Task[None]], *, finish_s: float) -> None:
    """Let ``tasks`` finish for ``finish_s``, then cancel them and wait a bounded time."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=finish_s)
    for task in pending:
        task.cancel()
    if pending:
        _, stuck = await asyncio.wait(pending, timeout=STOP_GRACE_S)
        for task in stuck:
            log.error("archive: task %s did not stop", task.get_name())
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.error("archive: task %s failed: %r", task.get_name(), task.exception())
