"""The server's auto-partition manager (Fluss's ``AutoPartitionManager``): a background thread that
creates time partitions ahead and drops expired ones for every table with
``table.auto-partition.enabled``, once at start-up and then every ``auto-partition.check.interval``.

The decisions are :mod:`flightstore.autopartition`'s; each table's changes are one catalog change
(:meth:`Store.auto_partition`), so a crash mid-check leaves every table as it was or as decided.
A table that cannot be changed now (a partition limit, a table being dropped) is retried at the
next check; the thread never stops the server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from flightstore.config import server_option
from flightstore.store import Store

__all__ = ["AutoPartitionManager"]

log = logging.getLogger("flightstore.server")


class AutoPartitionManager:
    """Runs :meth:`Store.auto_partition` now and every ``auto-partition.check.interval``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # Told the tables partitions were dropped from (the lake's tierer drops their rows at once).
        self.on_dropped: Callable[[str], None] | None = None
        self.interval_s = server_option(store.options, "auto-partition.check.interval") / 1000
        self.checks = 0  # completed checks (tests wait on it)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="auto-partition", daemon=True)

    def start(self) -> AutoPartitionManager:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def check(self, now_ms: int | None = None) -> dict[str, tuple[int, int]]:
        """One check of every table (as of ``now_ms``, default now); ``{table: (created, dropped)}``
        of those that changed."""
        changed = self.store.auto_partition(now_ms)
        for table, (created, dropped) in changed.items():
            log.info("auto-partition: %s created %d and dropped %d partition(s)", table, created, dropped)
            if dropped and self.on_dropped is not None:
                self.on_dropped(table)
        self.checks += 1
        return changed

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception:
                log.exception("auto-partition check failed")
            self._stop.wait(self.interval_s)
