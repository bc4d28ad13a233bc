"""Metrics across worker processes: prometheus-client's multiprocess mode.

``gateway serve --workers N`` runs N spawned processes behind one port, and a
scrape of ``GET /metrics`` lands on any one of them. Each process alone knows
only its own counts, so in multiprocess mode every process writes its values
to memory-mapped files in one shared directory, and whichever worker is
scraped reads and aggregates all of them (counters and histograms summed,
gauges by their ``multiprocess_mode``, see :mod:`gateway.telemetry.metrics`).

prometheus-client picks the mode when it is *imported*, from the environment
variable ``PROMETHEUS_MULTIPROC_DIR``. So the parent sets it (with
:func:`prepare_multiprocess_dir`) before it spawns the workers: a spawned
worker starts a fresh interpreter with the parent's environment and imports
prometheus-client only then. The parent itself records nothing.

Lifecycle, in the parent:

1. ``prepare_multiprocess_dir(path)`` before spawning: stale files from an
   earlier run would otherwise be summed into this one's counters;
2. ``mark_worker_dead(pid)`` whenever a worker exits: its live gauges
   (in-flight, backlogs, breaker state) leave the aggregate, while its
   counters stay, so totals never go backwards.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    generate_latest,
    multiprocess,
    values,
)

ENV = "PROMETHEUS_MULTIPROC_DIR"

# The files prometheus-client writes: counter_<pid>.db, gauge_<mode>_<pid>.db,
# histogram_<pid>.db, summary_<pid>.db. Only these are ever deleted here.
_FILE_KINDS = ("counter_", "gauge_", "histogram_", "summary_")


def multiprocess_dir() -> str | None:
    """The shared directory when this process runs in multiprocess mode, else None."""
    return os.environ.get(ENV) or None


def prepare_multiprocess_dir(path: str | os.PathLike[str]) -> Path:
    """Parent process, before spawning workers: an empty metrics directory, exported.

    Creates ``path`` if needed, deletes metric files left by an earlier run
    (nothing else in the directory is touched), and sets
    ``PROMETHEUS_MULTIPROC_DIR`` so that spawned workers inherit it.
    """
    directory = Path(path).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    for file in directory.glob("*.db"):
        if file.name.startswith(_FILE_KINDS):
            file.unlink(missing_ok=True)
    os.environ[ENV] = str(directory)
    return directory


def mark_worker_dead(pid: int, directory: str | os.PathLike[str] | None = None) -> None:
    """Parent process, when a worker exits: drop its live gauges from the aggregate.

    A no-op outside multiprocess mode, so the supervisor may call it always.
    """
    path = str(directory) if directory is not None else multiprocess_dir()
    if path:
        multiprocess.mark_process_dead(pid, path)


def aggregating_registry(directory: str | os.PathLike[str]) -> CollectorRegistry:
    """A registry whose collection reads and merges every process's files.

    Built once and reused: the collector rereads the directory on each scrape.
    """
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    return registry


def ensure_multiprocess_values() -> None:
    """Fail loudly when metrics would silently stay out of the shared files.

    That happens when ``PROMETHEUS_MULTIPROC_DIR`` was set after
    prometheus-client was imported in this process: values would live in this
    process's memory only and never reach a scrape served by another worker.
    """
    if not getattr(values.ValueClass, "_multiprocess", False):
        raise RuntimeError(
            f"{ENV} is set, but prometheus_client was imported before it was: set it "
            "before the process starts (prepare_multiprocess_dir() in the parent, "
            "before spawning workers)")


def render_multiprocess(directory: str | os.PathLike[str]) -> tuple[bytes, str]:
    """The aggregate of every process's files in ``directory``, and its Content-Type.

    For a process that records nothing itself (the supervising parent, a test);
    a worker uses :func:`gateway.telemetry.metrics.render_metrics`.
    """
    return generate_latest(aggregating_registry(directory)), CONTENT_TYPE_LATEST
