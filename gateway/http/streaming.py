"""Answering a streaming request: relay, and resume on another backend when it breaks.

The first leg comes from the proxy's dispatch (retries included). If it
breaks after the client's response started, and the policy allows, the same
generation is continued on a backend not yet used in this stream, and spliced
into the client's stream (:mod:`gateway.upstream.resume`). Each leg's outcome
goes to its backend's breaker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from gateway.resilience.deadline import Deadline
from gateway.upstream.attempt import AttemptFailed
from gateway.upstream.backend import Backend
from gateway.upstream.dispatch import Dispatched, Dispatcher, HeadersFor, NoBackendAdmits
from gateway.upstream.pool import Pool
from gateway.upstream.resume import Emitted, Splice, continuation_body, read_emitted
from gateway.upstream.stream_policy import RESUMABLE, StreamPolicy, Violation
from gateway.upstream.stream_relay import BeforeDone, ClientStream, EventsObserver, LegOutcome

_BACKEND_FAULTS = RESUMABLE
"""Violations a backend is blamed for (its breaker counts a failure)."""


@dataclass(frozen=True, slots=True)
class StreamJob:
    """What a streaming answer needs beyond the first leg."""

    pool: Pool
    path: str
    data: dict
    headers_for: HeadersFor
    policy: StreamPolicy
    total: float
    """Seconds a continuation may take to start (the request's ``total``)."""


@dataclass(slots=True)
class StreamResult:
    response: web.StreamResponse
    completed: bool
    resumes: int
    client_gone: bool
    error_code: str | None
    """The code of the error event that ended the stream (None when completed)."""
    resume_reasons: list[str]
    """Why each resumed leg broke (one per resume)."""


async def answer_stream(request: web.Request, headers: dict[str, str], first: Dispatched,
                        job: StreamJob, dispatcher: Dispatcher,
                        on_events: EventsObserver | None = None,
                        before_done: BeforeDone | None = None,
                        on_first: Callable[[], None] | None = None) -> StreamResult:
    """Relay ``first`` to the client, continuing elsewhere when it breaks.

    ``on_events`` sees every run of events sent; ``before_done`` is awaited
    before the final ``[DONE]`` goes out (a session stores its turn there, so
    a client's next turn always finds it).
    """
    stream = ClientStream(request, headers, keep_events=job.policy.max_resumes > 0,
                          on_events=on_events, before_done=before_done, on_first=on_first)
    if not await stream.open():
        first.response.release()
        first.finish(ignore=True)
        return StreamResult(stream.response, False, 0, True, None, [])
    leg, splice, used = first, None, [first.backend]
    reasons: list[str] = []
    while True:
        outcome = await stream.relay(leg.response, leg.backend.name, job.policy,
                                     _limits(leg.backend, job.policy), splice)
        _settle(leg, outcome)
        if outcome.completed or outcome.client_gone or not _may_resume(outcome, stream, job):
            break
        emitted = read_emitted([stream.emitted])
        if emitted.finished:  # the answer is whole; only [DONE] went missing
            outcome.completed = await stream.finish_done()
            break
        next_leg = await _continue(job, emitted, used, dispatcher)
        if next_leg is None:
            break
        stream.resumes += 1
        reasons.append(outcome.violation or "")
        # Nothing sent yet (a first-token timeout): the new leg stands as it is.
        leg, splice = next_leg, Splice(emitted) if emitted.identity else None
        used.append(leg.backend)
    if not outcome.completed:
        await stream.fail(outcome)
    await stream.close()
    return StreamResult(stream.response, outcome.completed, stream.resumes, stream.client_gone,
                        None if outcome.completed else outcome.violation, reasons)


def _limits(backend: Backend, policy: StreamPolicy) -> tuple[float, float]:
    return (policy.read or backend.timeouts.read,
            policy.max_duration or backend.timeouts.stream_max)


def _settle(leg: Dispatched, outcome: LegOutcome) -> None:
    ignore = outcome.client_gone or outcome.violation == Violation.MAX_DURATION
    leg.finish(backend_failed=outcome.violation in _BACKEND_FAULTS, ignore=ignore)


def _may_resume(outcome: LegOutcome, stream: ClientStream, job: StreamJob) -> bool:
    return outcome.violation in RESUMABLE and stream.resumes < job.policy.max_resumes


async def _continue(job: StreamJob, emitted: Emitted, used: list[Backend],
                    dispatcher: Dispatcher) -> Dispatched | None:
    body = continuation_body(job.data, job.path, emitted)
    if body is None:
        return None
    try:
        return await dispatcher.dispatch(job.pool, job.path, body, stream=True,
                                         headers_for=job.headers_for,
                                         deadline=Deadline.after(job.total),
                                         exclude=used, read=job.policy.read)
    except (NoBackendAdmits, AttemptFailed):
        return None

