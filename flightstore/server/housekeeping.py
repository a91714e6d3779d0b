"""The server's background upkeep: KV snapshots on their interval and log retention.

One daemon thread per server. It takes the KV snapshots that ``kv.snapshot.interval`` makes due in
every open primary-key table (then applies ``table.log.ttl`` to those tables, since a snapshot lets
their changelog shrink), and every ``log.retention.check-interval`` applies ``table.log.ttl`` to
every table. It sleeps until the next snapshot is due (at most :data:`MAX_SLEEP_S`, so newly opened
tables are noticed) and stops with the server: :meth:`Housekeeping.stop` wakes it, abandons a
snapshot in progress (its partial files are removed; the previous snapshots stay) and joins it.
"""

from __future__ import annotations

import logging
import threading
import time

from flightstore.store import Store

__all__ = ["MAX_SLEEP_S", "Housekeeping"]

log = logging.getLogger("flightstore.server")

MAX_SLEEP_S = 1.0
MIN_SLEEP_S = 0.01


class Housekeeping:
    """The background thread of one server over ``store``."""

    def __init__(self, store: Store, retention_interval_s: float) -> None:
        self.store = store
        self.retention_interval_s = retention_interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flightstore-housekeeping", daemon=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> Housekeeping:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread and wait for it (up to ``timeout`` seconds)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        next_retention = time.monotonic() + self.retention_interval_s
        while not self._stop.is_set():
            try:
                taken = self.store.take_due_snapshots(stop=self._stop.is_set)
                if taken:
                    log.info("took %d KV snapshot(s)", taken)
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + self.retention_interval_s
                    dropped = self.store.enforce_retention()
                    if dropped:
                        log.info("retention dropped %d expired log rows", dropped)
            except Exception:
                if not self._stop.is_set():
                    log.exception("housekeeping failed")
            self._stop.wait(self._sleep_s(next_retention))

    def _sleep_s(self, next_retention: float) -> float:
        due_ms = self.store.next_snapshot_due_ms()
        wait = min(MAX_SLEEP_S, max(0.0, next_retention - time.monotonic()))
        if due_ms is not None:
            wait = min(wait, due_ms / 1000 - time.time())
        return max(MIN_SLEEP_S, wait)
