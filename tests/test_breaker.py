"""The per-backend circuit breaker: tier thresholds, window, half-open probes, config.

Time is an injected fake clock (the breaker's clock seam), so every test runs in
microseconds and each assertion can sit exactly on a threshold: one call
earlier the breaker is still closed, that call opens it.
"""

from __future__ import annotations

import tomllib

import pytest

from gateway.configreader import ConfigError, Table
from gateway.resilience.breaker import BreakerState, CircuitBreaker, Permit
from gateway.resilience.breaker_config import BreakerConfig, BreakerTier, parse_breaker

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN
SEVERE = BreakerTier(consecutive_failures=10, error_rate=0.40, open_seconds=180.0)
MILD = BreakerTier(consecutive_failures=5, error_rate=0.60, open_seconds=60.0)


class FakeClock:
    """A monotonic clock that moves only when a test advances it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def parse(text: str = "") -> BreakerConfig:
    data = tomllib.loads("[breaker]\n" + text)["breaker"]
    return parse_breaker(Table("config.toml", "breaker", data))


def make(text: str = "", **kwargs) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker("gpu-1", parse(text), clock=clock, **kwargs), clock


def record(breaker: CircuitBreaker, outcomes: str) -> None:
    """One admitted call per letter: S success, F failure, I ignored."""
    for letter in outcomes:
        permit = breaker.acquire()
        assert permit is not None, f"refused while {breaker.state}"
        {"S": permit.success, "F": permit.failure, "I": permit.ignore}[letter]()


def trip(breaker: CircuitBreaker) -> None:
    record(breaker, "F" * 10)  # rate 100 %, 10 in a row: the severe tier
    assert breaker.state is OPEN


# -- the default tiers trip exactly at their thresholds ----------------------------

@pytest.mark.parametrize("before,tier", [
    # mild tier, consecutive threshold: 4 in a row at 86 % does not trip, the 5th does
    ("FFFFS" * 2 + "FFFF", MILD),
    # mild tier, rate threshold: 8 in a row at 8/14 = 57 % does not trip, 9/15 = 60 % does
    ("S" * 6 + "F" * 8, MILD),
    # severe tier, consecutive threshold: 9 in a row at 9/19 = 47 % (below the mild
    # tier's 60 %) does not trip; the 10th at 10/20 = 50 % does
    ("S" * 10 + "F" * 9, SEVERE),
    # severe tier, rate threshold: 13 in a row at 13/33 = 39 % does not trip, 14/34 = 41 % does
    ("S" * 20 + "F" * 13, SEVERE),
    # severe first: below min_calls nothing trips; at the 10th call both tiers
    # hold (10 in a row, 100 %) and the severe one wins
    ("F" * 9, SEVERE),
    # ignored outcomes count neither way: they neither add calls nor break the run
    ("S" * 6 + "F" * 4 + "I" * 5 + "F" * 4, MILD),
])
def test_each_tier_trips_exactly_at_its_thresholds(before, tier):
    breaker, _ = make()
    record(breaker, before)
    assert breaker.state is CLOSED
    record(breaker, "F")
    assert breaker.state is OPEN
    assert breaker.tier == tier
    assert breaker.seconds_until_half_open() == tier.open_seconds


def test_below_min_calls_nothing_trips():
    breaker, _ = make("min_calls = 20\n")
    record(breaker, "F" * 19)
    assert breaker.state is CLOSED
    record(breaker, "F")
    assert breaker.tier == SEVERE


@pytest.mark.parametrize("gap,opens", [(59.0, True), (60.0, False)])
def test_failures_older_than_the_window_leave_it(gap, opens):
    breaker, clock = make()
    record(breaker, "F" * 5)  # 5 calls: below min_calls
    clock.advance(gap)
    record(breaker, "F" * 5)  # 10 in a row; 10 calls in the window only if the first 5 stayed
    assert (breaker.state is OPEN) is opens
    assert breaker.snapshot()["window"]["calls"] == (10 if opens else 5)


def test_a_different_tier_table_changes_when_it_trips():
    table = ("[[breaker.tiers]]\nconsecutive_failures = 3\nerror_rate = 0.25\n"
             "open_seconds = 30\n")
    default, _ = make()
    custom, _ = make(table)
    for breaker in (default, custom):
        record(breaker, "S" * 7 + "FF")
        assert breaker.state is CLOSED
        record(breaker, "F")  # 3 in a row at 30 %
    assert default.state is CLOSED
    assert custom.state is OPEN
    assert custom.seconds_until_half_open() == 30.0


# -- open and half-open ----------------------------------------------------------

def test_open_refuses_and_counts_down_to_half_open():
    breaker, clock = make()
    trip(breaker)
    assert not breaker.admits()
    assert breaker.acquire() is None
    clock.advance(100.0)
    assert breaker.seconds_until_half_open() == 80.0
    clock.advance(79.5)
    assert breaker.state is OPEN
    clock.advance(0.5)
    assert breaker.state is HALF_OPEN  # by time alone, no call needed
    assert breaker.seconds_until_half_open() == 0.0
    assert breaker.tier == SEVERE  # kept for a re-open


def test_half_open_admits_a_limited_number_of_probes():
    breaker, clock = make("half_open_max_calls = 2\n")
    trip(breaker)
    clock.advance(180.0)
    permits = [breaker.acquire() for _ in range(5)]
    probes = [p for p in permits if p is not None]
    assert len(probes) == 2
    assert not breaker.admits()
    probes[0].ignore()  # releases its slot, counts neither way
    assert breaker.admits()
    third = breaker.acquire()
    assert third is not None
    with third:
        pass  # leaving without a report counts as ignored: the slot comes back
    assert breaker.admits()
    assert breaker.state is HALF_OPEN


def test_half_open_successes_close_it_with_a_clean_history():
    breaker, clock = make()
    trip(breaker)
    clock.advance(180.0)
    record(breaker, "S")
    assert breaker.state is HALF_OPEN
    record(breaker, "S")
    assert breaker.state is CLOSED
    assert breaker.tier is None
    snapshot = breaker.snapshot()
    assert snapshot["window"]["calls"] == 0
    assert snapshot["consecutive_failures"] == 0
    record(breaker, "F")  # the old failures are gone: one failure does not re-open it
    assert breaker.state is CLOSED


@pytest.mark.parametrize("before,tier", [("F" * 10, SEVERE), ("FFFFS" * 2 + "F" * 5, MILD)])
def test_a_failed_probe_reopens_for_the_same_tier(before, tier):
    breaker, clock = make()
    record(breaker, before)
    assert breaker.tier == tier
    clock.advance(tier.open_seconds)
    record(breaker, "S")  # one success is not enough (half_open_successes = 2)
    record(breaker, "F")
    assert breaker.state is OPEN
    assert breaker.tier == tier
    assert breaker.seconds_until_half_open() == tier.open_seconds


def test_a_permit_from_an_earlier_state_is_not_counted():
    breaker, clock = make("window_seconds = 600\n")  # the trip's failures stay in the window
    early = breaker.acquire()
    assert early is not None
    trip(breaker)
    clock.advance(180.0)
    old_probe = breaker.acquire()
    assert old_probe is not None
    early.failure()  # started while closed, not a probe: must not re-open it
    assert breaker.state is HALF_OPEN and not breaker.admits()
    breaker.force_open(1.0)
    clock.advance(1.0)
    record(breaker, "S")
    old_probe.success()  # a probe of the previous half-open period: not counted
    assert breaker.state is HALF_OPEN
    probe = breaker.acquire()
    assert probe is not None
    probe.success()
    probe.failure()  # a second report is a no-op
    assert breaker.state is CLOSED


def test_on_transition_sees_every_change_with_the_new_state_in_place():
    seen: list[tuple[str, BreakerState, BreakerState, BreakerState]] = []
    breaker: CircuitBreaker

    def on_transition(name: str, old: BreakerState, new: BreakerState) -> None:
        seen.append((name, old, new, breaker.state))

    breaker, clock = make(on_transition=on_transition)
    trip(breaker)
    clock.advance(180.0)
    record(breaker, "SS")
    assert seen == [("gpu-1", CLOSED, OPEN, OPEN), ("gpu-1", OPEN, HALF_OPEN, HALF_OPEN),
                    ("gpu-1", HALF_OPEN, CLOSED, CLOSED)]


def test_a_failing_on_transition_does_not_break_the_breaker(caplog):
    def on_transition(name: str, old: BreakerState, new: BreakerState) -> None:
        raise RuntimeError("metrics down")

    breaker, _ = make(on_transition=on_transition)
    trip(breaker)
    assert breaker.state is OPEN
    assert "on_transition" in caplog.text


# -- reload and admin ------------------------------------------------------------

def test_reconfigure_applies_to_the_next_trip_and_keeps_the_current_state():
    breaker, clock = make()
    trip(breaker)
    clock.advance(100.0)
    breaker.reconfigure(parse("[[breaker.tiers]]\nconsecutive_failures = 2\n"
                              "error_rate = 0.5\nopen_seconds = 5\n"))
    assert breaker.state is OPEN
    assert breaker.seconds_until_half_open() == 80.0
    clock.advance(80.0)
    record(breaker, "F")  # a failed probe re-opens for the tier that opened it
    assert breaker.tier == SEVERE
    assert breaker.seconds_until_half_open() == 180.0
    clock.advance(180.0)
    record(breaker, "SS")
    assert breaker.state is CLOSED
    record(breaker, "S" * 8 + "F" * 7)  # 7 in a row at 7/15 = 47 %: not yet
    assert breaker.state is CLOSED
    record(breaker, "F")  # 8/16 = 50 %: the new tier (the old ones would need 60 %)
    assert breaker.state is OPEN
    assert breaker.seconds_until_half_open() == 5.0


def test_reconfigure_keeps_the_history_when_the_window_changes():
    breaker, clock = make()
    record(breaker, "S" * 3)
    clock.advance(30.0)
    record(breaker, "F" * 4)
    breaker.reconfigure(parse("window_seconds = 20\n"))
    assert breaker.snapshot()["window"]["calls"] == 4
    clock.advance(20.0)
    assert breaker.snapshot()["window"]["calls"] == 0


def test_force_open_force_close_and_reset():
    breaker, _ = make()
    breaker.force_open()
    assert breaker.state is OPEN and breaker.tier == SEVERE
    assert breaker.seconds_until_half_open() == 180.0
    breaker.force_open(5.0)
    assert breaker.tier is None and breaker.seconds_until_half_open() == 5.0
    breaker.force_close()
    assert breaker.state is CLOSED
    record(breaker, "FFS")
    breaker.reset()
    assert breaker.snapshot()["window"]["calls"] == 0
    with pytest.raises(ValueError, match="seconds must be > 0"):
        breaker.force_open(0)


def test_snapshot():
    breaker, clock = make()
    record(breaker, "S" * 7 + "FFF")
    assert breaker.snapshot() == {
        "name": "gpu-1",
        "state": "closed",
        "tier": None,
        "open_until": None,
        "window": {"seconds": 60.0, "calls": 10, "failures": 3, "error_rate": 0.3},
        "consecutive_failures": 3,
        "half_open": {"probes_in_flight": 0, "successes": 0},
    }
    record(breaker, "F" * 7)  # 10 in a row at 10/17 = 59 %: the severe tier
    clock.advance(10.0)
    snapshot = breaker.snapshot()
    assert snapshot["state"] == "open"
    assert snapshot["tier"] == {"consecutive_failures": 10, "error_rate": 0.4,
                                "open_seconds": 180.0}
    assert snapshot["open_until"] == 170.0
    assert snapshot["window"]["error_rate"] == 10 / 17
    assert snapshot["consecutive_failures"] == 10


def test_snapshot_has_no_error_rate_below_min_calls():
    breaker, _ = make()
    record(breaker, "SF")
    assert breaker.snapshot()["window"]["error_rate"] is None


def test_permit_is_a_context_manager():
    breaker, _ = make()
    with breaker.acquire() as permit:
        assert isinstance(permit, Permit)
        permit.failure()
    assert breaker.snapshot()["window"]["failures"] == 1


# -- parse_breaker ---------------------------------------------------------------

def test_parse_defaults():
    assert parse() == BreakerConfig()
    assert parse().tiers == (SEVERE, MILD)


def test_parse_every_key():
    config = parse("window_seconds = 30\nmin_calls = 4\nhalf_open_max_calls = 3\n"
                   "half_open_successes = 1\nshared = true\n"
                   'redis_url = "redis://127.0.0.1:7000/0"\n'
                   "[[breaker.tiers]]\nconsecutive_failures = 8\nerror_rate = 1\n"
                   "open_seconds = 300\n"
                   "[[breaker.tiers]]\nconsecutive_failures = 2\nerror_rate = 0.9\n"
                   "open_seconds = 0.5\n")
    assert config == BreakerConfig(
        window_seconds=30.0, min_calls=4, half_open_max_calls=3, half_open_successes=1,
        shared=True, redis_url="redis://127.0.0.1:7000/0",
        tiers=(BreakerTier(8, 1.0, 300.0), BreakerTier(2, 0.9, 0.5)))


def tier(consecutive: object = 5, rate: object = 0.5, seconds: object = 10) -> str:
    return (f"[[breaker.tiers]]\nconsecutive_failures = {consecutive}\n"
            f"error_rate = {rate}\nopen_seconds = {seconds}\n")


@pytest.mark.parametrize("text,message", [
    ("window_seconds = 0\n", "breaker.window_seconds: expected seconds > 0, got 0"),
    ("min_calls = 0\n", "breaker.min_calls: expected an integer >= 1, got 0"),
    ("half_open_max_calls = 0\n", "breaker.half_open_max_calls: expected an integer >= 1"),
    ("half_open_successes = 1.5\n", "breaker.half_open_successes: expected an integer >= 1"),
    ('shared = "yes"\n', 'breaker.shared: expected true or false, got "yes"'),
    ("min_cals = 3\n", "breaker.min_cals: unknown key"),
    ("shared = true\n", 'breaker.redis_url: expected a redis:// URL when shared = true, got ""'),
    ("tiers = []\n", "breaker.tiers: expected at least one [[breaker.tiers]] table, got []"),
    ("tiers = 3\n", "breaker.tiers: expected an array of tables"),
    (tier(consecutive=0), "breaker.tiers[0].consecutive_failures: expected an integer >= 1"),
    (tier(rate=0), "breaker.tiers[0].error_rate: expected an error rate > 0 and <= 1, got 0"),
    (tier(rate=1.5), "breaker.tiers[0].error_rate: expected an error rate > 0 and <= 1"),
    (tier(rate='"40%"'), 'breaker.tiers[0].error_rate: expected an error rate > 0 and <= 1'),
    (tier(seconds=0), "breaker.tiers[0].open_seconds: expected seconds > 0, got 0"),
    (tier() + "[[breaker.tiers]]\nconsecutive_failures = 2\nerror_rate = 0.5\n",
     "breaker.tiers[1].open_seconds: expected a value (this key is required"),
    (tier() + "open_secs = 3\n", "breaker.tiers[0].open_secs: unknown key"),
    (tier(consecutive=5) + tier(consecutive=10),
     "breaker.tiers: expected the tiers ordered most severe first, by strictly decreasing"
     " consecutive_failures (no two equal): reorder the [[breaker.tiers]] tables, got [5, 10]"),
    (tier(consecutive=5) + tier(consecutive=5), "got [5, 5]"),
])
def test_parse_errors_name_the_key(text, message):
    with pytest.raises(ConfigError) as error:
        parse(text)
    assert str(error.value).startswith("config.toml: ")
    assert message in str(error.value)
