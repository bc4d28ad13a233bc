"""Getting a started response from a pool: attempts, retries, breakers, slots.

``Dispatcher.dispatch`` returns only once a backend has answered 2xx (and, for
a non-streaming request, its whole body has been read), or raises. Until then
nothing has reached the client, so every attempt may be retried; the retry
loop (:mod:`gateway.resilience.retry`) decides whether it is.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from gateway.resilience.backoff import retry_after_seconds
from gateway.resilience.breaker import Permit
from gateway.resilience.budget import RetryBudget
from gateway.resilience.deadline import Deadline
from gateway.resilience.retry import RetryPolicy, RetryRecord
from gateway.upstream.attempt import AttemptFailed, Failure, open_response, read_whole_body
from gateway.upstream.backend import Backend
from gateway.upstream.http1 import UpstreamResponse
from gateway.upstream.pool import Pool

HeadersFor = Callable[[Backend], dict[str, str]]


class AttemptListener(Protocol):
    """Who wants to know about each attempt (telemetry); the dispatcher works without."""

    def attempt_started(self, backend: str, breaker_state: str, wait: float,
                        headers: dict[str, str]) -> None: ...

    def attempt_ended(self, backend: str, failure: str | None, status: int | None) -> None: ...
_HINTED_STATUSES = (429, 503)


class NoBackendAdmits(Exception):
    """No backend of the pool admitted the first attempt: breakers open or all busy."""

    def __init__(self, pool: Pool) -> None:
        super().__init__(f"no backend of model '{pool.model}' admits a call")
        self.breakers_open = pool.all_refused_by_breakers()
        self.retry_after = pool.seconds_until_half_open() if self.breakers_open else 1.0


@dataclass(slots=True)
class Dispatched:
    """A backend's started 2xx response, with what must be settled when it ends."""

    backend: Backend
    response: UpstreamResponse
    body: bytes | None
    """The whole body of a non-streaming response; None for a stream."""
    permit: Permit
    attempts: int
    settled: bool = False
    """The outcome was reported already (a whole body read is a success)."""

    def finish(self, *, backend_failed: bool = False, ignore: bool = False) -> None:
        """Report the call's outcome to the breaker (once) and give the slot back."""
        if ignore:
            self.permit.ignore()
        elif not self.settled:
            settle(self.backend, self.permit, failed=backend_failed)
        self.settled = True
        self.backend.release()


@dataclass(slots=True)
class _Request:
    pool: Pool
    path: str
    body: bytes
    stream: bool
    headers_for: HeadersFor
    deadline: Deadline
    record: RetryRecord = field(default_factory=RetryRecord)
    exclude: Collection[Backend] = ()
    read: float = 0.0
    listener: AttemptListener | None = None
    tried: list[Backend] = field(default_factory=list)
    last_failure: AttemptFailed | None = None


class Dispatcher:
    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.budgets: dict[str, RetryBudget] = {}

    def budget_for(self, pool: Pool) -> RetryBudget:
        budget = self.budgets.get(pool.model)
        if budget is None:
            config = self.policy.config
            budget = RetryBudget(config.budget_ratio, config.budget_min_concurrency)
            self.budgets[pool.model] = budget
        return budget

    async def dispatch(self, pool: Pool, path: str, body: bytes, *, stream: bool,
                       headers_for: HeadersFor, deadline: Deadline,
                       exclude: Collection[Backend] = (), read: float = 0.0,
                       listener: AttemptListener | None = None) -> Dispatched:
        """Attempt until a backend answers; raise the last :class:`AttemptFailed` if none did.

        Backends in ``exclude`` are never tried (a resumed stream must go
        elsewhere); ``read`` replaces the backends' read timeout when set.
        Raises :class:`NoBackendAdmits` when not even a first attempt could start.
        The raised failure carries ``attempts`` and ``record`` for the caller.
        """
        request = _Request(pool, path, body, stream, headers_for, deadline,
                           exclude=exclude, read=read, listener=listener)
        budget = self.budget_for(pool)
        budget.active_requests += 1
        try:
            try:
                # Most requests succeed at once: the first attempt runs without
                # building a retry loop (tenacity's costs tens of microseconds).
                return await self._attempt(request)
            except AttemptFailed as failed:
                if not self._retryable(failed):
                    raise
                return await self._retry(request, budget, failed)
        except AttemptFailed as failed:
            failed.attempts = len(request.tried)
            failed.retry_record = request.record
            raise
        finally:
            budget.active_requests -= 1

    async def _retry(self, request: _Request, budget: RetryBudget,
                     first: AttemptFailed) -> Dispatched:
        """The tenacity loop, entered with the first attempt's failure as its attempt 1."""
        retrying = self.policy.retrying(deadline=request.deadline, budget=budget,
                                        record=request.record, retryable=self._retryable,
                                        retry_after=self._retry_after, free=_put_no_load)
        replay: AttemptFailed | None = first
        async for attempt in retrying:
            with attempt:
                if replay is not None:
                    failure, replay = replay, None
                    raise failure
                try:
                    return await self._attempt(request)
                finally:
                    if request.record.holds_budget:
                        request.record.holds_budget = False
                        budget.end_retry()
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def _attempt(self, request: _Request) -> Dispatched:
        backend = await request.pool.admit(request.tried, request.deadline, request.exclude)
        permit = backend.breaker.acquire() if backend is not None else None
        if backend is None or permit is None:
            if backend is not None:
                backend.release()
            if request.last_failure is None:
                raise NoBackendAdmits(request.pool)
            request.record.stop_reason = "no_backend"
            request.last_failure.final = True
            raise request.last_failure
        headers = request.headers_for(backend)
        listener = request.listener
        if listener is not None:
            wait = request.record.waits[-1] if request.tried and request.record.waits else 0.0
            listener.attempt_started(backend.name, backend.breaker.state.value, wait, headers)
        request.tried.append(backend)
        try:
            response = await open_response(backend, request.path, request.body, headers,
                                           request.deadline, request.read)
            body = None
            if not request.stream or response.content_type != "text/event-stream":
                body = await read_whole_body(backend, response, backend.timeouts.stream_max)
        except AttemptFailed as failed:
            if listener is not None:
                listener.attempt_ended(backend.name, failed.failure.value, failed.status)
            _report(backend, permit, failed)
            backend.release()
            request.last_failure = failed
            raise
        except BaseException:
            permit.ignore()
            backend.release()
            raise
        if listener is not None:
            listener.attempt_ended(backend.name, None, response.status)
        if body is not None:
            settle(backend, permit, failed=False)
        return Dispatched(backend, response, body, permit, attempts=len(request.tried),
                          settled=body is not None)

    def _retryable(self, error: BaseException) -> bool:
        if not isinstance(error, AttemptFailed) or error.final:
            return False
        if error.failure is Failure.HTTP_STATUS:
            return error.status in self.policy.config.retry_on
        return error.failure is not Failure.DEADLINE

    def _retry_after(self, error: BaseException) -> float | None:
        if isinstance(error, AttemptFailed) and error.status in _HINTED_STATUSES:
            return retry_after_seconds(error.headers, self.policy.config.retry_after_cap)
        return None


def _put_no_load(error: BaseException) -> bool:
    """A refused connection: the backend never saw the request."""
    return isinstance(error, AttemptFailed) and error.failure is Failure.CONNECT_ERROR


def settle(backend: Backend, permit: Permit, *, failed: bool) -> None:
    """Report a call's outcome to the backend's breaker and to its routing health."""
    if failed:
        permit.failure()
    else:
        permit.success()
    backend.record_outcome(failed=failed)


def _report(backend: Backend, permit: Permit, failed: AttemptFailed) -> None:
    """Failures for a breaker: connection errors, timeouts, 5xx. Not 4xx, not 429."""
    if failed.failure is Failure.HTTP_STATUS and (failed.status or 500) < 500:
        permit.ignore()
    else:
        settle(backend, permit, failed=True)

