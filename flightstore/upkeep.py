"""What keeps a table's disk use bounded: log retention and KV snapshots.

A log table drops log segments older than ``table.log.ttl``. A primary-key table must keep enough
log to rebuild its KV, so it first takes KV snapshots (every ``kv.snapshot.interval``, or on request):
once a snapshot covers an offset, the log below the *oldest retained* snapshot may go by
``table.log.ttl`` like a log table's, and every retained snapshot stays usable for recovery.
Never above the newest snapshot's offset, so the changelog a reader or a recovery needs is held.

:class:`TableUpkeep` holds one table's part; the server's background thread
(:mod:`flightstore.server.housekeeping`) calls :meth:`flightstore.store.Store.take_due_snapshots`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flightstore.kv.snapshot import SnapshotInfo, SnapshotSchedule, directory_bytes
from flightstore.kv.tablet import KvTablet
from flightstore.log import LogTablet

__all__ = ["TableUpkeep"]


def _now_ms() -> int:
    return int(time.time() * 1000)


class TableUpkeep:
    """Retention and KV snapshots of one table's buckets (``kvs`` is empty for a log table)."""

    def __init__(self, directory: Path, logs: Sequence[LogTablet], kvs: Sequence[KvTablet],
                 snapshot_interval_ms: int) -> None:
        self.directory = directory
        self.logs = logs
        self.kvs = kvs
        newest = [kv.snapshots.newest for kv in kvs]
        self.schedule = SnapshotSchedule(snapshot_interval_ms,
                                         [s.created_ms if s else None for s in newest], _now_ms())

    def enforce_retention(self, now_ms: int | None = None,
                          lake_floor: dict[int, int] | None = None) -> int:
        """Delete log segments older than ``table.log.ttl``; returns the rows dropped. On a
        primary-key table, only segments wholly below the bucket's oldest retained KV snapshot
        (none before its first snapshot); with ``lake_floor`` (per bucket: the lake's tiered
        offset of a datalake-enabled table), also only below that."""
        dropped = 0
        for bucket, log in enumerate(self.logs):
            before = log.start_offset
            floors = []
            if self.kvs:
                floors.append(self.kvs[bucket].snapshots.retention_floor())
            if lake_floor is not None:
                floors.append(lake_floor.get(bucket, before))
            floor = min(floors) if floors else None
            log.enforce_retention(now_ms, floor=floor)
            if log.remote is not None:  # uploaded segments expire by the same rule
                log.remote.expire(now_ms, log.ttl_ms, floor)
            dropped += log.start_offset - before
        return dropped

    def snapshot(self, *, force: bool = False, stop: Any = None,
                 buckets: Sequence[int] | None = None) -> dict[int, SnapshotInfo | None]:
        """Take a KV snapshot of every bucket (or of ``buckets``) now (the deterministic trigger
        behind the server's interval). Returns each bucket's newest snapshot: the one just taken,
        or the previous one when the bucket did not change since (unless ``force``); None for a
        bucket never written."""
        newest: dict[int, SnapshotInfo | None] = {}
        for bucket, kv in enumerate(self.kvs):
            if buckets is not None and bucket not in buckets:
                continue
            newest[bucket] = kv.snapshot(force=force, stop=stop) or kv.snapshots.newest
            self.schedule.done(bucket, _now_ms())
        return newest

    def take_due_snapshots(self, now_ms: int | None = None, stop: Any = None) -> int:
        """Snapshot the buckets whose ``kv.snapshot.interval`` has passed and that changed since
        their last snapshot; returns the number taken (the caller then applies retention, which
        the new snapshots may let delete more)."""
        if not self.kvs:
            return 0
        taken = 0
        for bucket in self.schedule.due(_now_ms() if now_ms is None else now_ms):
            if stop is not None and stop():
                break
            try:
                taken += self.kvs[bucket].snapshot(stop=stop) is not None
            finally:  # a failing bucket is retried at its next interval, not in a tight loop
                self.schedule.done(bucket, _now_ms())
        return taken

    def next_due_ms(self) -> int | None:
        """Wall-clock ms when a bucket is next due for a snapshot (None for a log table)."""
        return self.schedule.next_due_ms() if self.kvs else None

    def disk_usage(self, buckets: Sequence[int] | None = None) -> dict[str, int]:
        """Bytes the table (or its ``buckets``) occupies on disk: ``kv`` (RocksDB), ``snapshots``
        (beyond the files they share with the KV), ``log`` (the retained log or changelog) and
        ``total``."""
        seen: set = set()
        usage = {"kv": 0, "snapshots": 0, "log": 0}
        for bucket in range(len(self.logs)):
            if buckets is not None and bucket not in buckets:
                continue
            base = self.directory / f"bucket-{bucket}"
            usage["kv"] += directory_bytes(base / "kv", seen)
            usage["snapshots"] += directory_bytes(base / "snapshots", seen)
            usage["log"] += directory_bytes(base / "log", seen)
        usage["total"] = sum(usage.values())
        return usage
