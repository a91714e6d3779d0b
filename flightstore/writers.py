"""Writer ids of one table: the last batch sequence each applied, when it last wrote, and expiry.

A write may carry ``(writer_id, sequence)``: a batch whose sequence the writer already applied is a
retry (applied once), a gap is refused. The state that makes this work lives in four places (this
registry, each bucket's log records and ``LogTablet`` writer state, each KV bucket's RocksDB meta,
column ownership); this registry is the table's view of it and decides when it expires.

Expiry (as Fluss's ``writer-id.expiration-time``): a writer that has not written for
``table.writer-id.expiration`` (default 7 days) is forgotten everywhere, so short-lived writers
(one per Spark micro-batch and partition) do not pile up. Afterwards its retries are no longer
recognized, so a batch with a sequence above 0 from an expired writer is refused with
:class:`~flightstore.errors.WriterExpired`, naming the expiration; sequence 0 starts it afresh.
Expired ids are remembered (bounded, in memory) only to say so precisely; after a restart an
unknown writer sending a sequence above 0 gets :class:`~flightstore.errors.OutOfOrderSequence`,
whose message names expiry as one cause.

Times are milliseconds of an injectable ``clock`` (tests move it instead of sleeping). A writer
whose last write time is unknown (state written before times were kept) counts as having written
when the table opened.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping

from flightstore.errors import OutOfOrderSequence, WriterExpired

__all__ = ["MAX_REMEMBERED_EXPIRED", "WriterRegistry", "system_clock_ms"]

MAX_REMEMBERED_EXPIRED = 10_000  # expired ids kept to name the expiry in refusals


def system_clock_ms() -> int:
    return int(time.time() * 1000)


class WriterRegistry:
    """``writer_id -> (last sequence, last write ms)`` of one table. Thread-safe."""

    def __init__(self, table: str, expiration_ms: int, clock: Callable[[], int] = system_clock_ms) -> None:
        self.table = table
        self.expiration_ms = expiration_ms
        self.clock = clock
        self._state: dict[str, tuple[int, int]] = {}
        self._expired: OrderedDict[str, int] = OrderedDict()  # id -> when it expired
        self._lock = threading.Lock()

    def load(self, states: Iterable[Mapping[str, tuple[int, int | None]]]) -> None:
        """Merge per-bucket states ``{writer: (sequence, last ms or None)}`` (max of each)."""
        opened = self.clock()
        with self._lock:
            for state in states:
                for writer, (sequence, last_ms) in state.items():
                    last_ms = opened if last_ms is None else last_ms
                    known = self._state.get(writer)
                    if known is not None:
                        sequence, last_ms = max(sequence, known[0]), max(last_ms, known[1])
                    self._state[writer] = (sequence, last_ms)

    def sequence(self, writer_id: str) -> int | None:
        with self._lock:
            known = self._state.get(writer_id)
            return None if known is None else known[0]

    def __contains__(self, writer_id: str) -> bool:
        with self._lock:
            return writer_id in self._state

    def __len__(self) -> int:
        with self._lock:
            return len(self._state)

    def is_expired(self, writer_id: str, now_ms: int | None = None) -> bool:
        """Whether ``writer_id`` has state that is past its expiration."""
        now = self.clock() if now_ms is None else now_ms
        with self._lock:
            known = self._state.get(writer_id)
            return known is not None and now - known[1] > self.expiration_ms

    def check(self, writer_id: str, sequence: int) -> None:
        """Refuse a batch that skips sequences (OutOfOrderSequence) or continues an expired
        writer (WriterExpired). Expired state must have been dropped (:meth:`forget`) first."""
        with self._lock:
            known = self._state.get(writer_id)
            expected = 0 if known is None else known[0] + 1
            if sequence <= expected:
                return
            if known is None and writer_id in self._expired:
                raise WriterExpired(
                    f"writer {writer_id!r} of {self.table} expired: it wrote nothing for "
                    f"'table.writer-id.expiration' = {_duration(self.expiration_ms)}, so its state "
                    f"was dropped and batch {sequence} cannot be checked against it; start the "
                    "writer again from batch 0 (or use a new writer id)")
            cause = " (its state expired after 'table.writer-id.expiration', or it never wrote)" \
                if known is None else ""
            raise OutOfOrderSequence(
                f"writer {writer_id!r} sent batch {sequence} of {self.table} but the next expected "
                f"batch is {expected}{cause}; batches in between were lost")

    def note(self, writer_id: str, sequence: int, now_ms: int) -> None:
        """Record an applied batch (sequences only move forward here; see :meth:`reset`)."""
        with self._lock:
            known = self._state.get(writer_id)
            self._state[writer_id] = (sequence if known is None else max(sequence, known[0]), now_ms)
            self._expired.pop(writer_id, None)

    def reset(self, writer_id: str, sequence: int) -> None:
        """Move a writer back to ``sequence`` (undo); below 0 forgets it."""
        with self._lock:
            known = self._state.get(writer_id)
            if known is None:
                return
            if sequence < 0:
                del self._state[writer_id]
            elif known[0] > sequence:
                self._state[writer_id] = (sequence, known[1])

    def expired(self, now_ms: int | None = None) -> list[str]:
        """Writers whose last write is older than the expiration at ``now_ms``."""
        now = self.clock() if now_ms is None else now_ms
        with self._lock:
            return [w for w, (_, last) in self._state.items() if now - last > self.expiration_ms]

    def forget(self, writer_ids: Iterable[str], now_ms: int) -> None:
        """Drop expired writers, remembering (boundedly) that they expired."""
        with self._lock:
            for writer in writer_ids:
                self._state.pop(writer, None)
                self._expired[writer] = now_ms
                self._expired.move_to_end(writer)
            while len(self._expired) > MAX_REMEMBERED_EXPIRED:
                self._expired.popitem(last=False)

    def state(self) -> dict[str, tuple[int, int]]:
        with self._lock:
            return dict(self._state)


def _duration(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
