"""The per-backend circuit breaker: tiered trip rule on top of pybreaker's state machine.

pybreaker holds the state (closed / open / half-open) and announces every
transition through its listeners. It does not fit an asyncio gateway as it is
(see NOTES.md, "pybreaker"): it counts consecutive failures only, moves to
half-open lazily inside ``call()``, lets every concurrent caller through while
half-open, and cannot wrap an ``async def``. So we never hand it a call. We
drive it with ``open()``, ``half_open()`` and ``close()`` and build the rest
here:

- the trip rule: a tier trips when it has seen enough failures in a row AND the
  error rate over a sliding window is high enough (with at least ``min_calls``
  calls in the window); tiers are tried most severe first;
- time: the open period runs on our injectable clock (pybreaker stamps
  ``datetime.now()``), and open becomes half-open as soon as anyone looks after
  ``open_seconds``, not only on the next call;
- the half-open probe limit, and the three outcomes a caller reports: success,
  failure, or ignored (4xx, 429, client went away: counts neither way).

A caller asks :meth:`CircuitBreaker.acquire` for a :class:`Permit` and reports
the outcome on it exactly once. Everything is synchronous and O(1) amortised,
for one asyncio event loop: no awaits, no locks.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import Enum, StrEnum
from types import TracebackType

import pybreaker

from gateway.resilience.breaker_config import BreakerConfig, BreakerTier

__all__ = ["BreakerState", "CircuitBreaker", "Permit"]

log = logging.getLogger(__name__)

TransitionCallback = Callable[[str, "BreakerState", "BreakerState"], None]


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


_FROM_PYBREAKER = {
    pybreaker.STATE_CLOSED: BreakerState.CLOSED,
    pybreaker.STATE_OPEN: BreakerState.OPEN,
    pybreaker.STATE_HALF_OPEN: BreakerState.HALF_OPEN,
}


class _Outcome(Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    IGNORED = "ignored"


class Permit:
    """One admitted call; report its outcome exactly once.

    A second report is a no-op, so an ``except`` branch and a ``finally`` may
    both report without double counting. As a context manager, leaving the
    block without a report counts as ignored: a call abandoned half way (the
    client went away, a cancellation) says nothing about the backend, and a
    half-open probe slot must not leak.
    """

    __slots__ = ("_epoch", "_probe", "_reported", "_settle")

    def __init__(self, settle: Callable[[int, bool, _Outcome], None], epoch: int,
                 probe: bool) -> None:
        self._settle = settle
        self._epoch = epoch
        self._probe = probe
        self._reported = False

    def success(self) -> None:
        self._report(_Outcome.SUCCESS)

    def failure(self) -> None:
        """Connection error, timeout or 5xx."""
        self._report(_Outcome.FAILURE)

    def ignore(self) -> None:
        """4xx, 429 back-pressure, client went away: counts neither way."""
        self._report(_Outcome.IGNORED)

    def _report(self, outcome: _Outcome) -> None:
        if not self._reported:
            self._reported = True
            self._settle(self._epoch, self._probe, outcome)

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.ignore()


# One bucket per second, but at least 10 buckets for a short window (so calls
# leave it smoothly) and at most 600 for a long one (so memory stays bounded).
_MIN_BUCKETS = 10
_MAX_BUCKETS = 600


@dataclass(slots=True)
class _Bucket:
    index: int
    calls: int = 0
    failures: int = 0


class _Window:
    """Calls and failures over the last ``seconds``, counted in time buckets.

    Buckets rather than one entry per call keep memory and work per call
    constant on a busy backend. A bucket leaves the window whole, once its
    start is ``seconds`` old: a call never stays in the window longer than
    ``seconds``, and may leave up to one bucket width early.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._width = seconds / min(max(round(seconds), _MIN_BUCKETS), _MAX_BUCKETS)
        self._buckets: deque[_Bucket] = deque()
        self._calls = 0
        self._failures = 0

    def add(self, now: float, failed: bool) -> None:
        self._expire(now)
        self._add(math.floor(now / self._width), 1, int(failed))

    def counts(self, now: float) -> tuple[int, int]:
        """``(calls, failures)`` in the window that ends at ``now``."""
        self._expire(now)
        return self._calls, self._failures

    def clear(self) -> None:
        self._buckets.clear()
        self._calls = self._failures = 0

    def resized(self, seconds: float) -> _Window:
        """A window of a new length that keeps the history (for a config reload)."""
        window = _Window(seconds)
        for bucket in self._buckets:
            index = math.floor(bucket.index * self._width / window._width)
            window._add(index, bucket.calls, bucket.failures)
        return window

    def _add(self, index: int, calls: int, failures: int) -> None:
        if not self._buckets or self._buckets[-1].index != index:
            self._buckets.append(_Bucket(index))
        bucket = self._buckets[-1]
        bucket.calls += calls
        bucket.failures += failures
        self._calls += calls
        self._failures += failures

    def _expire(self, now: float) -> None:
        horizon = now - self.seconds
        while self._buckets and self._buckets[0].index * self._width <= horizon:
            old = self._buckets.popleft()
            self._calls -= old.calls
            self._failures -= old.failures


class _TransitionRecorder(pybreaker.CircuitBreakerListener):
    """Collects pybreaker's state changes so they are announced after the fact.

    pybreaker calls ``state_change`` *before* it stores the new state, so a
    callback that looked at the breaker from inside the listener would see
    the old state. We queue the change here and deliver it once pybreaker is
    consistent (:meth:`CircuitBreaker._move`).
    """

    def __init__(self) -> None:
        self.pending: list[tuple[BreakerState, BreakerState]] = []

    def state_change(self, cb: pybreaker.CircuitBreaker,
                     old_state: pybreaker.CircuitBreakerState | None,
                     new_state: pybreaker.CircuitBreakerState) -> None:
        old = _FROM_PYBREAKER[old_state.name] if old_state else BreakerState.CLOSED
        self.pending.append((old, _FROM_PYBREAKER[new_state.name]))


class CircuitBreaker:
    """The breaker of one backend. See the module docstring for the rule."""

    def __init__(self, name: str, config: BreakerConfig, *,
                 clock: Callable[[], float] = time.monotonic,
                 on_transition: TransitionCallback | None = None) -> None:
        self.name = name
        self._config = config
        self._clock = clock
        self._on_transition = on_transition
        self._window = _Window(config.window_seconds)
        self._consecutive_failures = 0
        self._tier: BreakerTier | None = None
        self._opened_at = 0.0  # on self._clock; the duration is pybreaker's reset_timeout
        self._probes_in_flight = 0
        self._probe_successes = 0
        # Bumped on every transition: a permit from an earlier state is stale.
        self._epoch = 0
        self._recorder = _TransitionRecorder()
        # Its fail_max and success_threshold are never consulted: no call goes through it.
        self._machine = pybreaker.CircuitBreaker(
            name=name, listeners=[self._recorder], throw_new_error_on_trip=False)

    # -- reading the state ------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """The state now; an open breaker whose time is up reads (and becomes) half-open."""
        if (self._machine.current_state == pybreaker.STATE_OPEN
                and self._clock() >= self._opened_at + self._machine.reset_timeout):
            self._move(self._machine.half_open)
        return _FROM_PYBREAKER[self._machine.current_state]

    @property
    def tier(self) -> BreakerTier | None:
        """The tier that opened the breaker; ``None`` when closed or forced open for a set time."""
        return self._tier

    def seconds_until_half_open(self) -> float:
        """0 when not open; the 503's Retry-After when every backend is open."""
        if self.state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._opened_at + self._machine.reset_timeout - self._clock())

    def admits(self) -> bool:
        """Would :meth:`acquire` give a permit now? Takes nothing (used to pick a backend)."""
        state = self.state
        if state is BreakerState.HALF_OPEN:
            return self._probes_in_flight < self._config.half_open_max_calls
        return state is BreakerState.CLOSED

    # -- calls --------------------------------------------------------------

    def acquire(self) -> Permit | None:
        """Take admission for one call (in half-open: a probe slot); ``None`` when refused."""
        state = self.state
        if state is BreakerState.CLOSED:
            return Permit(self._settle, self._epoch, probe=False)
        if (state is BreakerState.HALF_OPEN
                and self._probes_in_flight < self._config.half_open_max_calls):
            self._probes_in_flight += 1
            return Permit(self._settle, self._epoch, probe=True)
        return None

    def _settle(self, epoch: int, probe: bool, outcome: _Outcome) -> None:
        """Apply one reported outcome.

        A permit from an earlier state is dropped: it describes the backend as
        it was before the breaker moved, so counting it could re-open a breaker
        that just closed, or close a half-open one on a call that was never a
        probe. (Its probe slot was already reclaimed by the transition.)
        """
        if epoch != self._epoch:
            return
        if probe:
            self._probes_in_flight -= 1
            self._settle_probe(outcome)
        elif outcome is not _Outcome.IGNORED:
            self._settle_call(failed=outcome is _Outcome.FAILURE)

    def _settle_call(self, *, failed: bool) -> None:
        now = self._clock()
        self._window.add(now, failed)
        if not failed:
            self._consecutive_failures = 0
            return
        self._consecutive_failures += 1
        tier = self._tripped_tier(now)
        if tier is not None:
            self._open(tier, tier.open_seconds)

    def _tripped_tier(self, now: float) -> BreakerTier | None:
        """The most severe tier whose two conditions both hold, if any."""
        calls, failures = self._window.counts(now)
        if calls < self._config.min_calls:
            return None  # too few calls for an error rate
        rate = failures / calls
        for tier in self._config.tiers:
            if (self._consecutive_failures >= tier.consecutive_failures
                    and rate >= tier.error_rate):
                return tier
        return None

    def _settle_probe(self, outcome: _Outcome) -> None:
        if outcome is _Outcome.FAILURE:
            # Same tier, same duration (reset_timeout still holds it).
            self._open(self._tier, self._machine.reset_timeout)
        elif outcome is _Outcome.SUCCESS:
            self._probe_successes += 1
            if self._probe_successes >= self._config.half_open_successes:
                self._close()

    # -- transitions ----------------------------------------------------------

    def _open(self, tier: BreakerTier | None, seconds: float) -> None:
        self._tier = tier
        self._machine.reset_timeout = seconds
        self._opened_at = self._clock()
        self._move(self._machine.open)

    def _close(self) -> None:
        """Close with a clean history, so old failures cannot trip it again at once."""
        self._tier = None
        self._window.clear()
        self._consecutive_failures = 0
        self._move(self._machine.close)

    def _move(self, transition: Callable[[], object]) -> None:
        """Run one pybreaker transition, then reset per-state counters and announce it."""
        transition()
        self._epoch += 1
        self._probes_in_flight = 0
        self._probe_successes = 0
        pending, self._recorder.pending = self._recorder.pending, []
        for old, new in pending:
            if old is not new:
                self._announce(old, new)

    def _announce(self, old: BreakerState, new: BreakerState) -> None:
        """Call ``on_transition``; a broken hook (metrics, logs) must not break routing."""
        callback = self._on_transition
        if callback is None:
            return
        try:
            callback(self.name, old, new)
        except Exception:
            log.exception("breaker %s: on_transition(%s -> %s) failed", self.name, old, new)

    # -- admin and reload -----------------------------------------------------

    def force_open(self, seconds: float | None = None) -> None:
        """Open now: for ``seconds``, or else as the most severe tier would."""
        if seconds is None:
            tier = self._config.tiers[0]
            self._open(tier, tier.open_seconds)
        elif seconds > 0:
            self._open(None, seconds)
        else:
            raise ValueError(f"force_open: seconds must be > 0, got {seconds!r}")

    def force_close(self) -> None:
        """Close now if not closed (as after successful probes: history cleared)."""
        if self.state is not BreakerState.CLOSED:
            self._close()

    def reset(self) -> None:
        """Back to a fresh breaker: closed, empty window, in-flight outcomes dropped."""
        self._close()

    def reconfigure(self, config: BreakerConfig) -> None:
        """Hot reload: new settings apply from now on; the current state and its
        tier stay (an open breaker keeps its deadline, a re-open from half-open
        keeps the tier that opened it)."""
        if config.window_seconds != self._config.window_seconds:
            self._window = self._window.resized(config.window_seconds)
        self._config = config

    def snapshot(self) -> dict[str, object]:
        """JSON-ready view for the admin API and logs."""
        state = self.state
        calls, failures = self._window.counts(self._clock())
        has_rate = calls >= self._config.min_calls  # below min_calls there is no rate
        tier = self._tier
        return {
            "name": self.name,
            "state": state.value,
            "tier": None if tier is None else asdict(tier),
            "open_until": self.seconds_until_half_open() if state is BreakerState.OPEN else None,
            "window": {
                "seconds": self._window.seconds,
                "calls": calls,
                "failures": failures,
                "error_rate": failures / calls if has_rate else None,
            },
            "consecutive_failures": self._consecutive_failures,
            "half_open": {
                "probes_in_flight": self._probes_in_flight,
                "successes": self._probe_successes,
            },
        }
