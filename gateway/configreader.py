"""A small typed reader over a parsed TOML table that remembers where it is.

Every configuration error must name the file, the key path and what was
expected (``config.toml: timeouts.read: expected seconds > 0, got "fast"``), so
the loader never indexes the raw dict itself: it asks a :class:`Table` for a
typed value, and the table builds that message. Unknown keys are reported by
:meth:`Table.finish` once a section has been read.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(ValueError):
    """The configuration is invalid; the message says where and why."""


def _show(value: Any) -> str:
    """Render a bad value the way the user wrote it in TOML."""
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return repr(value)


class Table:
    """One TOML table, read key by key with types and ranges checked."""

    def __init__(self, source: str, path: str, data: dict[str, Any]) -> None:
        self.source = source
        self.path = path
        self._data = data
        self._read: set[str] = set()

    def _key_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, expected: str, got: Any) -> ConfigError:
        where = f"{self.source}: {self._key_path(key)}"
        return ConfigError(f"{where}: expected {expected}, got {_show(got)}")

    def has(self, key: str) -> bool:
        return key in self._data

    def _get(self, key: str, default: Any) -> Any:
        self._read.add(key)
        return self._data.get(key, default)

    def number(self, key: str, default: float, *, minimum: float = 0.0,
               allow_equal: bool = False, maximum: float | None = None,
               what: str = "a number") -> float:
        value = self._get(key, default)
        bound = f">= {minimum:g}" if allow_equal else f"> {minimum:g}"
        expected = f"{what} {bound}" + (f" and <= {maximum:g}" if maximum is not None else "")
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise self.error(key, expected, value)
        too_small = value < minimum if allow_equal else value <= minimum
        if too_small or (maximum is not None and value > maximum):
            raise self.error(key, expected, value)
        return float(value)

    def seconds(self, key: str, default: float, *, allow_zero: bool = False) -> float:
        return self.number(key, default, allow_equal=allow_zero, what="seconds")

    def integer(self, key: str, default: int, *, minimum: int = 0,
                maximum: int | None = None) -> int:
        value = self._get(key, default)
        expected = f"an integer >= {minimum}"
        if maximum is not None:
            expected += f" and <= {maximum}"
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, expected, value)
        if value < minimum or (maximum is not None and value > maximum):
            raise self.error(key, expected, value)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, "true or false", value)
        return value

    def string(self, key: str, default: str | None = None, *,
               choices: tuple[str, ...] | None = None, non_empty: bool = True) -> str:
        value = self._get(key, default)
        if value is None:
            raise self.error(key, "a string (this key is required)", "nothing")
        if not isinstance(value, str) or (non_empty and not value):
            raise self.error(key, "a non-empty string", value)
        if choices is not None and value not in choices:
            raise self.error(key, "one of " + ", ".join(f'"{c}"' for c in choices), value)
        return value

    def env_name(self, key: str) -> str | None:
        """The name of an environment variable that holds a secret (never the secret)."""
        value = self._get(key, None)
        if value is None or value == "":
            return None
        if not isinstance(value, str) or not _ENV_NAME.match(value):
            raise self.error(key, "the name of an environment variable", value)
        return value

    def strings(self, key: str, default: list[str] | None = None, *,
                non_empty: bool = False) -> tuple[str, ...]:
        value = self._get(key, default if default is not None else [])
        expected = "a non-empty list of strings" if non_empty else "a list of strings"
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.error(key, expected, value)
        if non_empty and not value:
            raise self.error(key, expected, value)
        return tuple(value)

    def integers(self, key: str, default: list[int], *, minimum: int,
                 maximum: int) -> tuple[int, ...]:
        value = self._get(key, default)
        expected = f"a list of integers in [{minimum}, {maximum}]"

        def fits(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= maximum

        if not isinstance(value, list) or not all(fits(v) for v in value):
            raise self.error(key, expected, value)
        return tuple(value)

    def table(self, key: str) -> Table:
        value = self._get(key, {})
        if not isinstance(value, dict):
            raise self.error(key, "a table", value)
        return Table(self.source, self._key_path(key), value)

    def tables(self, key: str) -> Iterator[Table]:
        """An array of tables, ``[[key]]`` in TOML."""
        value = self._get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.error(key, f"an array of tables ([[{self._key_path(key)}]])", value)
        for index, item in enumerate(value):
            yield Table(self.source, f"{self._key_path(key)}[{index}]", item)

    def finish(self) -> None:
        """Reject keys nobody asked for: a typo must not be silently ignored."""
        unknown = sorted(set(self._data) - self._read)
        if unknown:
            key = unknown[0]
            raise ConfigError(f"{self.source}: {self._key_path(key)}: unknown key")
