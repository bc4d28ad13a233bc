"""The interface every session store implements, and how a store fails.

A store knows nothing about turns: it keeps encoded sessions under keys and
offers one atomic write, a compare-and-set on the version. The append loop
(:mod:`gateway.sessions.appender`) builds everything else on these calls,
so the ``memory``, ``redis``, ``cluster`` and ``sharded`` stores behave alike.

Redis stores also hand out a token per write (see
:mod:`gateway.sessions.append_script`): a reader that holds a value with its
version and token can ask whether it is still current without receiving it
again (:meth:`SessionStore.read`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gateway.sessions.keys import SessionKey

if TYPE_CHECKING:
    from gateway.archive.record import OutboxEntry


class StoreUnavailable(Exception):
    """The store did not answer in time or failed: the caller falls back."""


def reraise_if_cancelled() -> None:
    """Raise ``CancelledError`` if the running task has been asked to stop.

    redis-py cleans up in ``finally`` blocks (a pipeline releasing its
    connection), and an error there replaces the ``CancelledError`` of a
    cancelled task: without this check a cancelled caller would see a
    ``StoreUnavailable``, treat it as Redis trouble, and go on.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


@dataclass(frozen=True, slots=True)
class Stored:
    """A stored value as read, with the token of the write that stored it."""

    blob: bytes | None
    """None: no such session."""
    token: bytes | None = None
    """None: no token (the memory store, or a value an older gateway wrote)."""


@dataclass(frozen=True, slots=True)
class Held:
    """A value the caller already has: what :meth:`SessionStore.read` compares with."""

    version: int
    token: bytes


@dataclass(frozen=True, slots=True)
class CasOutcome:
    """What a compare-and-set did."""

    applied: bool
    current: bytes | None = None
    """On a conflict: the value stored now (None if there is none), to retry on."""
    token: bytes | None = None
    """Applied: the token of the new value. On a conflict: the token of ``current``."""
    replicated: bool = True
    """False when the write applied but fewer replicas than asked acknowledged it."""
    outbox_refused: bool = False
    """The write applied, but the archive outbox was full: its record was not added."""


class SessionStore(Protocol):
    """Encoded sessions under keys, with an atomic versioned write."""

    @property
    def remote(self) -> bool:
        """True for Redis stores: they can fail, so the service keeps a fallback."""
        ...

    async def ping(self, budget: float | None = None) -> None:
        """Reach every server once (learning a cluster's topology); raise if not."""
        ...

    async def get(self, key: SessionKey) -> bytes | None:
        ...

    async def read(self, key: SessionKey, held: Held | None = None) -> Stored | None:
        """The stored value with its token; None when it is still ``held`` (same
        version and token), so that the caller's copy is current."""
        ...

    async def compare_and_set(self, key: SessionKey, expected_version: int,
                              blob: bytes, new_version: int,
                              outbox: OutboxEntry | None = None) -> CasOutcome:
        """Store ``blob`` if the stored version is ``expected_version`` (0: absent).

        The idle TTL starts again with every applied write. With ``outbox``, the
        archive record is added in the same atomic step, exactly when the write
        applies (to the bucket's outbox stream, or the local queue without Redis).
        """
        ...

    async def delete(self, key: SessionKey) -> bool:
        """Remove the session; whether it existed."""
        ...

    async def close(self) -> None:
        ...
