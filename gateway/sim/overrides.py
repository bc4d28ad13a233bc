"""Overrides of the settings: per request (``X-Sim-*`` headers) and per process (control API).

A test drives the simulator in two ways: a header changes one request (useful
when it talks to the simulator directly), and ``PUT /sim/faults`` changes the
defaults of one server (useful when requests reach it through a gateway that
chooses the backend). Both go through the same table of fields, so a value
means the same thing whichever way it arrives, and a bad value is rejected
with a message that names the header or field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gateway.sim.settings import Faults, SimSettings


class OverrideError(ValueError):
    """A header or control field has a bad value; the message names it (answered as 400)."""


@dataclass(frozen=True)
class RequestOptions:
    """Everything that shapes one answer: the defaults, overridden by the request's headers."""

    ttft_ms: float
    itl_ms: float
    tokens: int
    seed: int
    faults: Faults
    echo: bool = False
    """Answer with the received texts instead of the generated words (to check forwarding)."""

    @classmethod
    def from_settings(cls, settings: SimSettings) -> RequestOptions:
        """The options of a request that sends no ``X-Sim-*`` header."""
        return cls(
            ttft_ms=settings.ttft_ms,
            itl_ms=settings.itl_ms,
            tokens=settings.tokens,
            seed=settings.seed,
            faults=settings.faults,
        )


@dataclass(frozen=True)
class _Field:
    """One overridable value: its type, its range, and the words a header may use for it."""

    name: str
    kind: type
    low: float | None = None
    high: float | None = None
    in_faults: bool = False
    words: Mapping[str, object] = field(default_factory=dict)

    def expected(self, in_header: bool) -> str:
        """What a valid value looks like, for error messages."""
        words = " or ".join(repr(word) for word in self.words) if in_header else ""
        if self.kind is bool:
            return words or "true or false"
        text = "an integer" if self.kind is int else "a number"
        if self.low is not None:
            text += f" >= {self.low:g}"
        if self.high is not None:
            text += f" and <= {self.high:g}"
        return f"{text} or {words}" if words else text

    def in_range(self, value: float) -> bool:
        """Whether a number is finite and inside the bounds."""
        if not math.isfinite(value):
            return False
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)


_NONE = {"none": None}
_FLAG = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}

_FIELDS: tuple[_Field, ...] = (
    _Field("ttft_ms", float, low=0),
    _Field("itl_ms", float, low=0),
    _Field("tokens", int, low=0, high=100_000),
    _Field("seed", int),
    _Field("status", int, low=400, high=599, in_faults=True, words=_NONE),
    _Field("status_rate", float, low=0, high=1, in_faults=True),
    _Field("retry_after", float, low=0, in_faults=True, words=_NONE),
    _Field("hang_headers", bool, in_faults=True, words={"headers": True, "none": False}),
    _Field("stall_after", int, low=0, in_faults=True, words=_NONE),
    _Field("drop_after", int, low=0, in_faults=True, words=_NONE),
    _Field("refuse", bool, in_faults=True),
    _Field("echo", bool, words=_FLAG),
)
_BY_NAME = {spec.name: spec for spec in _FIELDS}

HEADERS: tuple[tuple[str, _Field], ...] = tuple(
    (header, _BY_NAME[name])
    for header, name in (
        ("X-Sim-TTFT-Ms", "ttft_ms"),
        ("X-Sim-ITL-Ms", "itl_ms"),
        ("X-Sim-Tokens", "tokens"),
        ("X-Sim-Seed", "seed"),
        ("X-Sim-Status", "status"),
        ("X-Sim-Status-Rate", "status_rate"),
        ("X-Sim-Retry-After", "retry_after"),
        ("X-Sim-Hang", "hang_headers"),
        ("X-Sim-Stall-After", "stall_after"),
        ("X-Sim-Drop-After", "drop_after"),
        ("X-Sim-Echo", "echo"),
    )
)
"""Per-request headers and the field each overrides (looked up case-insensitively)."""

CONTROL_FIELDS: frozenset[str] = frozenset(
    {"ttft_ms", "itl_ms", "tokens"} | {spec.name for spec in _FIELDS if spec.in_faults}
)
"""Fields that ``PUT /sim/faults`` accepts."""


def _parse_header(header: str, spec: _Field, raw: str) -> object:
    """Turn a header's text into a checked value of the field's type."""
    text = raw.strip().lower()
    if text in spec.words:
        return spec.words[text]
    try:
        value = spec.kind(text) if spec.kind is not bool else None
    except ValueError:
        value = None
    if value is None or not spec.in_range(value):
        raise OverrideError(f"invalid {header} header {raw!r}: expected {spec.expected(True)}")
    return value


def request_options(headers: Mapping[str, str], defaults: RequestOptions) -> RequestOptions:
    """The defaults overridden by the request's ``X-Sim-*`` headers.

    ``headers`` must look names up case-insensitively (aiohttp's headers do).
    Most requests send no such header and get ``defaults`` back unchanged.
    """
    top: dict[str, object] = {}
    faults: dict[str, object] = {}
    for header, spec in HEADERS:
        raw = headers.get(header)
        if raw is not None:
            target = faults if spec.in_faults else top
            target[spec.name] = _parse_header(header, spec, raw)
    if not top and not faults:
        return defaults
    if faults:
        top["faults"] = replace(defaults.faults, **faults)
    return replace(defaults, **top)  # type: ignore[arg-type]


def _check_json(name: str, value: object) -> object:
    """Check one control field's JSON value against its type and range."""
    spec = _BY_NAME[name]
    if spec.kind is bool:
        valid = isinstance(value, bool)
    elif spec.kind is int:
        valid = isinstance(value, int) and not isinstance(value, bool) and spec.in_range(value)
    else:
        valid = (
            isinstance(value, int | float) and not isinstance(value, bool) and spec.in_range(value)
        )
        value = float(value) if valid else value  # type: ignore[arg-type]
    if not valid:
        raise OverrideError(f"invalid field {name!r}: {value!r}, expected {spec.expected(False)}")
    return value


def apply_update(current: SimSettings, startup: SimSettings, update: object) -> SimSettings:
    """New defaults after a ``PUT /sim/faults`` body.

    Fields present replace the current value; ``null`` restores the startup
    value, so a test can undo exactly what it changed.
    """
    if not isinstance(update, dict):
        raise OverrideError("the body must be a JSON object")
    unknown = sorted(set(update) - CONTROL_FIELDS)
    if unknown:
        raise OverrideError(f"unknown field(s) {unknown}; known: {sorted(CONTROL_FIELDS)}")
    top: dict[str, object] = {}
    faults: dict[str, object] = {}
    for name, value in update.items():
        spec = _BY_NAME[name]
        target, origin = (faults, startup.faults) if spec.in_faults else (top, startup)
        target[name] = getattr(origin, name) if value is None else _check_json(name, value)
    return replace(current, faults=replace(current.faults, **faults), **top)  # type: ignore[arg-type]
