"""The history of a Jepsen-style run: one JSON object per line, one file per process (writers,
readers, the nemesis), merged by the checker. Lines are flushed as they are written so a process
that dies leaves every completed event on disk.

Events (``ev``):

* ``invoke`` / ``complete``: a write of ``writer`` at ``seq`` (``op``: :class:`workload.Op`), then
  its ``outcome``: ``ok`` (acknowledged), ``fail`` (never reached a server: every attempt was
  refused at connect) or ``unknown`` (sent, not acknowledged before the deadline). An ``invoke``
  without ``complete`` is unknown.
* ``read``: rows a reader got (``table``, ``via`` server, ``rows``).
* ``sub``: rows a subscription delivered (``table``, ``rows`` as ``[bucket, offset, change, ...]``).
* ``nemesis``: a fault or a heal (``what``, ``server``).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator

__all__ = ["HistoryWriter", "read_history"]


class HistoryWriter:
    """Appends events to one file (thread-safe), each stamped with wall time ``t``."""

    def __init__(self, path: Path, source: str) -> None:
        self.path = Path(path)
        self.source = source
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, event: dict[str, Any]) -> None:
        line = json.dumps({"t": round(time.time(), 4), "src": self.source, **event}, separators=(",", ":"),
                          default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_history(directory: Path) -> Iterator[dict[str, Any]]:
    """Every event of every ``*.jsonl`` file under ``directory`` (a torn last line is skipped)."""
    for path in sorted(Path(directory).glob("*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue  # the last line of a process killed while writing it
