"""A table's write path: rows split by bucket and applied to the buckets' logs (log tables) or
KV tablets (primary-key tables), once per writer batch (writer ids and sequences: a retried batch is
applied once, a gap is refused); the table's delete behaviour; undo of a writer's batches.

A write is all or nothing: every bucket it touches is prepared (merged and checked, nothing
written: :meth:`TableWrites._prepare_buckets`) before any bucket commits; a write of several buckets
commits behind a write intent (:mod:`flightstore.table.pending`, :mod:`flightstore.intents`), so
that a crash or a storage failure between two buckets is completed, never left half applied.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from flightstore import changetype
from flightstore.bucketing import bucket_ids
from flightstore.errors import InvalidInput, SchemaMismatch, Unsupported
from flightstore.schema import as_table
from flightstore.table.pending import REPLAYING_INTENT, BucketWrite, PendingWrites

__all__ = ["PINNED_BUCKET", "REPLAYING_INTENT", "TABLE_WRITER", "TableWrites", "WriteResult"]

TABLE_WRITER = "__table__"  # writer id of multi-bucket writes whose caller gave none
# The bucket a batch of a log table without bucket key goes to, when the cluster chose it (from
# the batch's writer id and sequence, so a retry lands in the same bucket); None: round robin.
PINNED_BUCKET: ContextVar[int | None] = ContextVar("pinned_bucket", default=None)


class WriteResult(dict):
    """Per-bucket outcome of a write: ``{bucket: base_offset or None}``, plus ``duplicate`` flag
    and the buckets the write went to (``touched``: they are synced before it is acknowledged)."""

    duplicate: bool = False
    touched: Sequence[int] = ()


class TableWrites(PendingWrites):
    """The writes of :class:`~flightstore.store.Table` (mixed into it: ``self`` is the
    table, with its descriptor, logs, KV tablets, writers and locks)."""

    def _check_sequence(self, writer_id: str | None, sequence: int | None) -> None:
        """Refuse a gap in the writer's sequence, or a batch of a writer that expired (its state
        is dropped here first if it expired since the last check)."""
        if writer_id is None or sequence is None:
            return
        if self._writers.is_expired(writer_id):
            self._expire([writer_id], self._clock())
        self._writers.check(writer_id, sequence)

    def _note_sequence(self, writer_id: str | None, sequence: int | None, now_ms: int) -> None:
        if writer_id is not None and sequence is not None:
            self._writers.note(writer_id, sequence, now_ms)

    def undo(self, writer_id: str, after_sequence: int, buckets: Sequence[int] | None = None) -> int:
        """Undo every batch ``writer_id`` wrote after ``after_sequence`` (exactly-once restarts of
        jobs), leaving other writers' work; returns rows restored. A writer without state here
        (it never wrote, or expired) has nothing to undo. See :mod:`flightstore.kv.undo`.
        ``buckets``: only those (the ones a cluster leader leads; a follower's replicas only
        take what their leader's log says)."""
        from flightstore.kv.undo import check_undoable, undo_writer
        if not self.has_primary_key:
            raise Unsupported(f"undo needs a primary-key table; {self.path} is a log table")
        numbers = list(range(len(self.kvs))) if buckets is None else [b for b in range(len(self.kvs)) if b in buckets]
        kvs = [self.kvs[b] for b in numbers]
        check_undoable(kvs, writer_id)
        with self._lock:
            self._settle_pending()
            if writer_id not in self._writers:
                return 0
            for bucket in numbers:  # a replicated bucket: only at its leader, with enough in sync
                self.replicas[bucket].check_writable()
            restored = undo_writer(kvs, writer_id, after_sequence)
            self._writers.reset(writer_id, int(after_sequence))
            written = {b: (self.logs[b].end_offset, self.logs[b].truncations) for b in numbers
                       if self.replicas[b].leadership.is_leader}
        # The restore is in each changelog: like a write, it returns once every in-sync replica
        # holds it (reads show committed records only).
        self._acknowledge(written)
        self._notify()
        return restored

    def writer_sequence(self, writer_id: str) -> int | None:
        """The last batch sequence applied for ``writer_id`` (None if it never wrote or expired).
        A pending write is completed first (WriteIncomplete if it cannot be): its batch counts."""
        if self._pending is not None:
            with self._lock:
                self._settle_pending()
        return self._writers.sequence(writer_id)

    def expire_writers(self, now_ms: int | None = None) -> list[str]:
        """Forget writers that wrote nothing for ``table.writer-id.expiration``: in memory, in each
        bucket's log writer state and KV meta (sequence, undo fence) and their column claims.
        Returns their ids."""
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            pending = self._pending.writer_id if self._pending is not None else None
            expired = [w for w in self._writers.expired(now) if w != pending]  # it needs its state
            if expired:
                self._expire(expired, now)
        return expired

    def _forget_stale_log_writers(self) -> None:
        """On open: a log rebuilds its writer state from every record header, expired writers
        included (a primary-key table's registry comes from the KV, which dropped them)."""
        now, expiration = self._clock(), self.descriptor.option("table.writer-id.expiration")
        for log in self.logs:
            log.forget_writers([writer for writer, (_, last_ms) in log.writer_activity().items()
                                if now - last_ms > expiration])

    def _expire(self, writer_ids: list[str], now_ms: int) -> None:
        with self._lock:
            for kv in self.kvs:
                kv.drop_writers(writer_ids)
            for log in self.logs:
                log.forget_writers(writer_ids)
            for writer in writer_ids:
                self.ownership.release(writer)
            self._writers.forget(writer_ids, now_ms)

    def buckets_of(self, data: pa.Table) -> np.ndarray:
        key = self.descriptor.bucket_key
        if key:
            return bucket_ids(data, key, self.num_buckets)
        pinned = PINNED_BUCKET.get()
        if pinned is not None:
            return np.full(data.num_rows, int(pinned) % self.num_buckets, dtype=np.int32)
        choices = self.round_robin_buckets
        if choices:
            return np.full(data.num_rows, choices[next(self._round_robin) % len(choices)], dtype=np.int32)
        return np.full(data.num_rows, next(self._round_robin) % self.num_buckets, dtype=np.int32)

    # ---- writes -------------------------------------------------------------------------------
    def append(self, data: Any, *, writer_id: str | None = None, sequence: int | None = None) -> WriteResult:
        """Append rows to a log table (all columns; missing nullable columns are null)."""
        if self.has_primary_key:
            raise Unsupported(f"{self.path} is a primary-key table: use upsert/delete")
        table, _ = self.conform(data)
        return self._apply_buckets(table, None, None, writer_id, sequence)

    def upsert(self, data: Any, columns: Sequence[str] | None = None, *, writer_id: str | None = None,
               sequence: int | None = None) -> WriteResult:
        """Insert or update rows of a primary-key table; ``columns`` makes it a partial update."""
        table, target = self._conform_pk(data, columns)
        kinds = np.full(table.num_rows, changetype.UPDATE_AFTER, dtype=np.int8)
        return self.write(table, kinds, target, writer_id=writer_id, sequence=sequence, conformed=True)

    def delete(self, keys: Any, columns: Sequence[str] | None = None, *, writer_id: str | None = None,
               sequence: int | None = None) -> WriteResult:
        """Delete rows by primary key; with ``columns`` only those columns are nulled (partial delete)."""
        table, target = self._conform_pk(keys, columns, keys_only=columns is None)
        kinds = np.full(table.num_rows, changetype.DELETE, dtype=np.int8)
        return self.write(table, kinds, target, writer_id=writer_id, sequence=sequence, conformed=True)

    def _conform_pk(self, data: Any, columns: Sequence[str] | None,
                    keys_only: bool = False) -> tuple[pa.Table, tuple | None]:
        if not self.has_primary_key:
            raise Unsupported(f"{self.path} is a log table (append-only): use append")
        table = self._known_columns(as_table(data))
        if keys_only:
            missing = [c for c in self.descriptor.primary_key if c not in table.column_names]
            if missing:
                raise SchemaMismatch(f"delete from {self.path} needs the primary key column(s) {missing}")
            table = table.select(list(self.descriptor.primary_key))
            conformed, _ = self.conform(table, self.descriptor.primary_key)
            return conformed, None
        if columns is None and set(table.column_names) != set(self.schema.names):
            missing = [c for c in self.schema.names if c not in table.column_names]
            if any(set(table.column_names) == set(old.names) for old in self.descriptor.past_schemas):
                missing = []  # a whole row of an older schema version (a writer that did not refresh)
            if missing and not any(c in self.descriptor.primary_key for c in missing):
                raise SchemaMismatch(
                    f"data written to {self.path} lacks column(s) {missing}; pass columns=[...] for a "
                    "partial update")
        return self.conform(table, columns)

    def write(self, data: Any, kinds: np.ndarray | pa.Array | None = None,
              columns: Sequence[str] | None = None, *, writer_id: str | None = None,
              sequence: int | None = None, overwrite: bool = False, conformed: bool = False) -> WriteResult:
        """Write changelog rows (int8 change type per row) into a primary-key table.

        Validates everything first (schema, null keys, the merge engine's and delete behavior's
        rules), then applies bucket by bucket.
        """
        if not self.has_primary_key:
            return self.append(data, writer_id=writer_id, sequence=sequence)
        if conformed:
            table, target = data, (tuple(columns) if columns is not None else None)
        else:
            table, target = self.conform(data, columns)
        if kinds is None:
            kinds = np.full(table.num_rows, changetype.UPDATE_AFTER, dtype=np.int8)
        kinds = np.asarray(kinds.to_numpy(zero_copy_only=False) if isinstance(kinds, (pa.Array, pa.ChunkedArray))
                           else kinds, dtype=np.int8)
        if len(kinds) != table.num_rows:
            raise InvalidInput("one change type per row is required")
        if ((kinds < 0) | (kinds > changetype.APPEND_ONLY)).any():
            raise InvalidInput("unknown change type code in the write")
        if not overwrite:
            table, kinds = self._apply_delete_behavior(table, kinds)
            self.merger.check_write(kinds, target, table)
        if writer_id is not None and target is not None:
            # Writers of partial updates own their columns while they live (see kv/ownership.py).
            self.ownership.claim(writer_id, [c for c in target if c not in self.descriptor.primary_key])
        return self._apply_buckets(table, kinds, target, writer_id, sequence, overwrite)

    def _apply_buckets(self, table: pa.Table, kinds: np.ndarray | None, target: tuple | None,
                       writer_id: str | None, sequence: int | None, overwrite: bool = False,
                       recovering: bool = False) -> WriteResult:
        """Apply a validated write to its buckets (KV tablets, or logs when ``kinds`` is None), all
        or nothing (see the module doc); ``recovering``: a recorded write replayed on open, whose
        sequence was checked when it was first sent.

        Returns once the write is durable (logs that fsync): the fsync happens after the table lock
        is released, so concurrent writers of the table share it (group commit).
        """
        with self._lock:
            # Each log's truncations before the append: a cut racing the write is seen by its ack.
            cuts = [log.truncations for log in self.logs]
            result = self._apply_locked(table, kinds, target, writer_id, sequence, overwrite, recovering)
            # Every bucket written awaits its commit, even one whose replica stopped leading since
            # the append (a view change landing now): acknowledged only if its records survive.
            # A recorded write replayed on open is acknowledged by no one: followers' need not wait.
            written = {int(b): (self.logs[b].end_offset, cuts[b]) for b in result.touched
                       if not recovering or self.replicas[b].leadership.is_leader}
        self._acknowledge(written)
        self._notify()
        return result

    def _acknowledge(self, written: dict[int, tuple[int, int]]) -> None:
        """Return once what was appended to ``written``'s buckets ({bucket: (log end, truncations)
        when appended}) is durable and held by every in-sync replica; called outside the table
        lock, so concurrent writers share fsyncs."""
        for bucket in written:  # followers fetch while this server syncs
            self.replicas[bucket].appended()
        for bucket, (end, _) in written.items():
            self.logs[bucket].sync(end)
        for bucket, (end, cuts) in written.items():  # acks = all: every in-sync replica has it
            self.replicas[bucket].await_commit(end, cuts)

    def _apply_locked(self, table: pa.Table, kinds: np.ndarray | None, target: tuple | None,
                      writer_id: str | None, sequence: int | None, overwrite: bool,
                      recovering: bool) -> WriteResult:
        """The write itself, under the table lock; its logs are synced by the caller, except a
        multi-bucket write's, which must be on disk before its intent is cleared."""
        self._settle_pending()
        if not recovering:  # a rolled-forward write was checked when it was first sent
            self._check_sequence(writer_id, sequence)
        now = self._clock()
        result = WriteResult()
        last = self._writers.sequence(writer_id) if writer_id is not None else None
        if kinds is None and not self.descriptor.bucket_key and sequence is not None \
                and last is not None and sequence <= last:
            # Without a bucket key a whole batch lands in one (round-robin) bucket and a retry
            # may be routed to another one: the table-level sequence decides.
            result.duplicate = True
            result.touched = list(range(self.num_buckets))  # acknowledged once durable
            return result
        buckets = self.buckets_of(table)
        several = len(np.unique(buckets)) > 1
        if several:
            writer_id, sequence = self._intent_writer(writer_id, sequence)
        parts = self._prepare_buckets(table, kinds, target, writer_id, sequence, overwrite, now, buckets)
        result.touched = [p.bucket for p in parts]
        if several:
            self._commit_all_or_nothing(parts, kinds is not None, writer_id, sequence, now, result)
        else:
            for part in parts:
                result.duplicate |= part.duplicate
                if not part.duplicate:
                    result[part.bucket] = self._commit_bucket(part, writer_id, sequence, now)
        self._note_sequence(writer_id, sequence, now)
        return result

    def _prepare_buckets(self, table: pa.Table, kinds: np.ndarray | None, target: tuple | None,
                         writer_id: str | None, sequence: int | None, overwrite: bool, now_ms: int,
                         buckets: np.ndarray | None = None) -> list[BucketWrite]:
        """Every bucket's part of a write, prepared and checked, nothing applied (see
        :meth:`~flightstore.kv.tablet.KvTablet.prepare`): a value-dependent failure in any bucket
        raises here, before any bucket commits. ``buckets``: each row's bucket, if computed."""
        buckets = self.buckets_of(table) if buckets is None else buckets
        parts = []
        if not REPLAYING_INTENT.get():  # a replica that does not lead (or lacks in-sync copies) writes nothing
            for bucket in np.unique(buckets):
                self.replicas[int(bucket)].check_writable()
        for bucket in np.unique(buckets):
            bucket = int(bucket)
            mask = buckets == bucket
            part = table.filter(pa.array(mask))
            if kinds is None:
                # Without a bucket key a retry may be routed to another bucket than the batch was.
                logs = [self.logs[bucket]] if self.descriptor.bucket_key else self.logs
                held = [log.writer_state().get(writer_id) for log in logs] if writer_id else []
                last = max((h for h in held if h is not None), default=None)
                duplicate = sequence is not None and last is not None and sequence <= last
                parts.append(BucketWrite(bucket, part, duplicate=duplicate))
                continue
            prepared = self.kvs[bucket].prepare(part, kinds[mask], target, writer_id=writer_id,
                                                sequence=sequence, overwrite=overwrite, now_ms=now_ms)
            parts.append(BucketWrite(bucket, prepared.changelog, prepared, prepared.duplicate))
        return parts

    def _commit_bucket(self, part: BucketWrite, writer_id: str | None, sequence: int | None,
                       now_ms: int) -> int | None:
        """Commit one prepared bucket (log append, then RocksDB); returns the first offset written
        (None: nothing changed). Fails only on storage."""
        if not self.has_primary_key:
            return self.logs[part.bucket].append(part.record, writer_id=writer_id, sequence=sequence,
                                                 durable=False, timestamp_ms=now_ms)
        kv = self.kvs[part.bucket]
        prepared = part.prepared if part.prepared is not None else kv.prepare_changelog(
            part.record, writer_id=writer_id, sequence=sequence, timestamp_ms=now_ms)
        return kv.commit(prepared).base_offset

    def _bucket_has(self, bucket: int, writer_id: str, sequence: int) -> bool:
        """Whether ``bucket`` applied the writer's batch ``sequence`` (or a later one)."""
        if self.has_primary_key:
            kv = self.kvs[bucket]
            kv.catch_up()
            last = kv.writer_sequence(writer_id)
        else:
            last = self.logs[bucket].writer_state().get(writer_id)
        return last is not None and last >= sequence

    def _intent_writer(self, writer_id: str | None, sequence: int | None) -> tuple[str, int]:
        """The writer id and sequence a multi-bucket write goes under: the caller's, or the table
        writer's next sequence (a write needs one to be recognized in the buckets that have it)."""
        if writer_id is not None and sequence is not None:
            return writer_id, sequence
        last_table = self._writers.sequence(TABLE_WRITER)
        return TABLE_WRITER, 0 if last_table is None else last_table + 1

    def _apply_delete_behavior(self, table: pa.Table, kinds: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        retracting = (kinds == changetype.DELETE) | (kinds == changetype.UPDATE_BEFORE)
        if not retracting.any():
            return table, kinds
        behavior = self.delete_behavior
        engine = self.descriptor.merge_engine
        if behavior == "disable":
            raise InvalidInput(f"table {self.path} disables deletes ('table.delete.behavior' = 'disable')")
        if behavior == "ignore" or (engine in ("first_row", "versioned")):
            keep = ~retracting
            return table.filter(pa.array(keep)), kinds[keep]
        if engine != "aggregation":
            keep = kinds != changetype.UPDATE_BEFORE  # a -U is followed by its +U
            return table.filter(pa.array(keep)), kinds[keep]
        return table, kinds

    @property
    def delete_behavior(self) -> str:
        if "table.delete.behavior" in self.descriptor.options:
            return self.descriptor.option("table.delete.behavior")
        return "ignore" if self.descriptor.merge_engine in ("first_row", "versioned") else "allow"
