"""Progress of long commands on a terminal: ``flightstore verify`` and ``repair`` (buckets
checked), ``flightstore sql`` (rows received), the Spark tiering job (tables tiered).

Shown with rich on standard error, and only when standard output and standard error are both
terminals: piped or redirected, a command prints exactly what it prints without progress (no
escape codes, nothing more on stderr), so scripts and logs see no difference. The bar is
transient: it is erased when the work ends, leaving the command's own output.

Work reports through :class:`Steps` (``start``, ``advance``); :data:`QUIET` does nothing, so
library code (``maintenance.verify``) takes a ``Steps`` and costs nothing when nobody watches.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["QUIET", "Steps", "progress", "shown"]


class Steps:
    """What long work tells its watcher; this base class ignores it all (:data:`QUIET`)."""

    def start(self, total: int | None, description: str | None = None) -> None:
        """The work has ``total`` steps (None: unknown)."""

    def advance(self, amount: int = 1, description: str | None = None) -> None:
        """``amount`` more steps are done; ``description`` says what comes next."""


QUIET = Steps()


def shown() -> bool:
    """Whether progress is shown: standard output and standard error are both terminals."""
    return _isatty(sys.stdout) and _isatty(sys.stderr)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


class _Bar(Steps):
    def __init__(self, bar: Any, task: Any, unit: str) -> None:
        self._bar, self._task, self._unit = bar, task, unit
        self._total: int | None = None
        self._done = 0

    def _count(self) -> str:
        done = f"{self._done:,}" if self._total is None else f"{self._done:,}/{self._total:,}"
        return f"{done} {self._unit}".rstrip()

    def start(self, total: int | None, description: str | None = None) -> None:
        self._total = total
        fields = {} if description is None else {"description": description}
        self._bar.update(self._task, total=total, count=self._count(), **fields)
        self._bar.refresh()

    def advance(self, amount: int = 1, description: str | None = None) -> None:
        self._done += amount
        fields = {} if description is None else {"description": description}
        self._bar.update(self._task, advance=amount, count=self._count(), **fields)


@contextmanager
def progress(description: str, total: int | None = None, *, unit: str = "") -> Iterator[Steps]:
    """A progress bar on standard error for the work inside the ``with`` (:data:`QUIET` when
    :func:`shown` is false): ``total`` steps of ``unit`` (None: unknown, a pulsing bar)."""
    if not shown():
        yield QUIET
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                   TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    with bar:
        steps = _Bar(bar, bar.add_task(description, total=total, count=""), unit)
        steps.start(total)
        yield steps
