"""Gateway configuration files for benchmark runs, derived from the default ``config.toml``.

The issue measures the gateway "with the default features on", so the
benchmark does not write a configuration of its own: it takes the repository's
``config.toml`` as it is (its timeouts, retry policy, breaker tiers, shedding
and whatever later issues add there) and replaces only the ``[[backends]]``
tables, which must point at this run's simulators. Other settings (``[sessions]``)
are set key by key in the file's own table (``with_keys``), so the
defaults of the other keys stay. The result is checked with
``gateway check-config`` by the caller.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.procs import ROOT

DEFAULT_CONFIG = ROOT / "config.toml"


@dataclass(frozen=True)
class Backend:
    """One ``[[backends]]`` table of a benchmark configuration."""

    name: str
    url: str
    max_concurrency: int = 256
    """The default; the 1,000-stream scenario raises it so the gateway does not shed."""


def without_backends(text: str) -> str:
    """``text`` minus its ``[[backends]]`` tables and their ``[backends.*]`` sub-tables.

    Works on lines: a backends table runs from its header to the next header
    that is neither another backends table nor one of its sub-tables. Comment
    lines directly above a removed table go with it (they describe it).
    """
    kept: list[str] = []
    skipping = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            skipping = stripped == "[[backends]]" or stripped.startswith("[backends.")
            if skipping:
                while kept and kept[-1].lstrip().startswith("#"):
                    kept.pop()
        if not skipping:
            kept.append(line)
    return "\n".join(kept) + "\n"


def backends_toml(backends: Sequence[Backend]) -> str:
    """The ``[[backends]]`` tables, serving the simulator's model ``sim-model``."""
    parts = []
    for backend in backends:
        parts.append("\n".join([
            "[[backends]]",
            f'name = "{backend.name}"',
            f'url = "{backend.url}"',
            'models = ["sim-model"]',
            f"max_concurrency = {backend.max_concurrency}",
        ]))
    return "\n\n".join(parts) + "\n"


Overrides = Mapping[str, Mapping[str, str]]
"""table name -> key -> TOML literal, e.g. ``{"sessions": {"store": '"redis"'}}``."""


def with_keys(text: str, table: str, values: Mapping[str, str]) -> str:
    """``text`` with ``values`` set in ``[table]``: its own lines for those keys dropped, the
    new ones put right under the header; a table the file lacks is appended. Other keys of
    the table keep the file's values (the defaults stay on)."""
    lines = text.splitlines()
    header = f"[{table}]"
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == header)
    except StopIteration:
        body = "\n".join(f"{key} = {value}" for key, value in values.items())
        return f"{text.rstrip()}\n\n{header}\n{body}\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")),
               len(lines))
    kept = [line for line in lines[start + 1:end]
            if line.split("=", 1)[0].strip() not in values or line.lstrip().startswith("#")]
    new = [f"{key} = {value}" for key, value in values.items()]
    return "\n".join([*lines[:start + 1], *new, *kept, *lines[end:]]) + "\n"


def config_text(backends: Sequence[Backend], overrides: Overrides | None = None,
                base: Path = DEFAULT_CONFIG) -> str:
    """The default configuration with ``backends`` in place of its own and ``overrides`` set."""
    text = without_backends(base.read_text())
    # The embedded archive writes SQLite in the working directory: not the repository's.
    archive = Path(tempfile.gettempdir()) / "gateway-bench-archive.db"
    overrides = {"archive": {"url": f'"sqlite+aiosqlite:///{archive}"'}, **(overrides or {})}
    for table, values in (overrides or {}).items():
        text = with_keys(text, table, values)
    return f"{text}\n{backends_toml(backends)}"


def sessions_overrides(redis_url: str) -> dict[str, dict[str, str]]:
    """The session scenario's store: issue 4's Redis store on ``redis_url``."""
    return {"sessions": {"enabled": "true", "store": '"redis"', "url": f'"{redis_url}"'}}


def parse_override(text: str) -> tuple[str, str, str]:
    """``TABLE.KEY=VALUE`` (VALUE a TOML literal) as (table, key, value)."""
    name, sep, value = text.partition("=")
    table, dot, key = name.strip().rpartition(".")
    if not sep or not dot or not table or not key:
        raise ValueError(f"expected TABLE.KEY=VALUE, got {text!r}")
    return table, key, value.strip()


def write_config(text: str, directory: Path | None = None, name: str = "gateway.toml") -> Path:
    """Write ``text`` into ``directory`` (a fresh temp dir by default); returns the path."""
    folder = directory or Path(tempfile.mkdtemp(prefix="gw-bench-"))
    path = folder / name
    path.write_text(text)
    return path
