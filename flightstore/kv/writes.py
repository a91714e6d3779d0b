"""The write path of a KV bucket, in two steps (mixed into :class:`~flightstore.kv.tablet.KvTablet`).

* :meth:`KvWrites.prepare` computes the bucket's part of a write and changes nothing: encode the
  keys, group the rows by key (groups in order of first occurrence), fetch the stored row of every
  group with ONE multi-get, let the table's merge engine compute the row each key holds afterwards
  (partial updates keep the unwritten columns), derive the changelog (``+I``; ``-U``/``+U``, no
  ``-U`` with ``table.changelog.image = WAL``; ``-D``) and encode the RocksDB puts. Every check that
  depends on stored values (an aggregate that overflows, a merge engine's refusal, a value the
  codec cannot store) fails here. The result is a :class:`PreparedWrite`.
* :meth:`KvWrites.commit` applies a prepared write: it appends the changelog to the bucket's log
  (the log is durable before the write is acknowledged), then writes the new rows to RocksDB in
  ONE WriteBatch that also stores the applied log offset, the row count and the writer's batch
  sequence. It can fail only on storage (a full disk, an I/O error).

A table write prepares every bucket it touches before it commits any (:mod:`flightstore.table.writes`);
a crash or a failed RocksDB write between the log append and the WriteBatch is repaired from the log
(:meth:`~flightstore.kv.tablet.KvTablet.recover` on open, :meth:`KvWrites.catch_up` before the next
write).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rocksdict import WriteBatch

from flightstore import changetype
from flightstore.errors import FlightstoreError, WriteIncomplete
from flightstore.kv.encoding import encode_key_array, encode_keys
from flightstore.kv.merge import MergeInput
from flightstore.kv.merge.base import take_or_null
from flightstore.kv.meta import _APPLIED, _INT, _ROWS, _WRITER, writer_value
from flightstore.schema import TableDescriptor

__all__ = ["ApplyResult", "KvWrites", "PreparedWrite", "changelog_schema", "merger_for_overwrite"]

_NO_KEYS = np.empty(0, dtype=object)


def changelog_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of a primary-key table's log: the table columns + int8 ``_change_type``."""
    return schema.append(pa.field(changetype.CHANGE_TYPE_COLUMN, pa.int8(), nullable=False))


@dataclass(frozen=True)
class ApplyResult:
    """What one ``apply`` did: the changelog's first offset (None if nothing changed)."""

    base_offset: int | None
    changes: int
    duplicate: bool = False


@dataclass(frozen=True)
class PreparedWrite:
    """One bucket's part of a write, computed by :meth:`KvTablet.prepare` (or rebuilt from its
    recorded changelog by :meth:`KvTablet.prepare_changelog`) and not applied yet.

    It holds what :meth:`KvTablet.commit` writes: the ``changelog`` to append (table columns plus
    ``_change_type``; empty when the write changes nothing here), the encoded RocksDB puts and
    deletes, the row count delta and the writer's batch. It was computed against the bucket at
    applied offset ``at``: it may be committed only while the bucket is still there (the table
    lock holds writes back in between), which :meth:`KvTablet.commit` checks.
    """

    changelog: pa.Table
    put_keys: np.ndarray
    put_values: list[bytes]
    delete_keys: np.ndarray
    row_delta: int
    at: int
    writer_id: str | None = None
    sequence: int | None = None
    timestamp_ms: int | None = None
    duplicate: bool = False


def _null_safe_equal(a: pa.ChunkedArray, b: pa.ChunkedArray) -> np.ndarray:
    eq = pc.fill_null(pc.equal(a, b), False)
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return pc.or_(eq, both_null).to_numpy(zero_copy_only=False)


class KvWrites:
    """Prepare and commit of :class:`~flightstore.kv.tablet.KvTablet` (mixed into it: ``self`` is the
    tablet, with its RocksDB, log, codec, merger and lock)."""

    def apply(self, batch: pa.Table, kinds: np.ndarray, target_columns: tuple[str, ...] | None = None,
              *, writer_id: str | None = None, sequence: int | None = None,
              overwrite: bool = False, durable: bool = True, now_ms: int | None = None) -> ApplyResult:
        """Prepare and commit a write of this bucket alone (see :meth:`prepare`, :meth:`commit`).

        ``durable``: the changelog is on disk when this returns (if the log fsyncs); a caller
        holding locks passes False and calls ``log.sync()`` after releasing them, so concurrent
        writers share the fsync.
        """
        with self._lock:
            prepared = self.prepare(batch, kinds, target_columns, writer_id=writer_id, sequence=sequence,
                                    overwrite=overwrite, now_ms=now_ms)
            return self.commit(prepared, durable=durable)

    def prepare(self, batch: pa.Table, kinds: np.ndarray, target_columns: tuple[str, ...] | None = None,
                *, writer_id: str | None = None, sequence: int | None = None,
                overwrite: bool = False, now_ms: int | None = None) -> PreparedWrite:
        """This bucket's part of a write (rows of every table column, conformed by the caller, with
        per-row change types), merged against the stored rows and encoded, changing nothing.

        Every failure that depends on stored values is raised here (InvalidInput: an aggregate
        overflows its type, a merge engine refuses a value...). ``overwrite`` bypasses the merge
        engine: rows replace (+I/+U) or remove (-D) stored rows as they are (restoring
        before-images). A batch whose ``sequence`` this writer already applied is a ``duplicate``.
        ``now_ms`` (default: the wall clock) becomes the changelog record's timestamp and the
        writer's last write time. Commit the result with :meth:`commit` before any other write of
        this bucket (callers hold the table lock across both).
        """
        with self._lock:
            self.catch_up()
            at = self.applied_offset
            timestamp = int(time.time() * 1000) if now_ms is None else int(now_ms)
            if writer_id is not None and sequence is not None:
                last = self.writer_sequence(writer_id)
                if last is not None and sequence <= last:
                    return PreparedWrite(changelog_schema(self.schema).empty_table(), _NO_KEYS, [], _NO_KEYS, 0, at,
                                         writer_id, sequence, timestamp, duplicate=True)
            encoded = encode_key_array(batch, self.primary_key).dictionary_encode()
            group = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            # RocksDB reads and writes keys faster in key order (about 2x for a batch of 50k
            # random keys): groups stay numbered by first occurrence, I/O goes in sorted order.
            order = pc.sort_indices(encoded.dictionary).to_numpy(zero_copy_only=False)
            sorted_keys = np.array(encoded.dictionary.take(order).to_pylist(), dtype=object)
            num_groups = len(order)
            old, found = self._fetch(sorted_keys, order)
            merger = merger_for_overwrite(self.descriptor) if overwrite else self.merger
            result = merger.merge(MergeInput(batch, kinds, group, num_groups, old, found,
                                             None if overwrite else target_columns))
            new, exists = result.new, result.exists
            same = np.ones(num_groups, dtype=bool)
            both = found & exists
            if both.any():
                for name in self.schema.names:
                    same &= _null_safe_equal(old.column(name), new.column(name))
            inserted = ~found & exists
            updated = both & ~same
            deleted = found & ~exists
            changelog = self._changelog(old, new, inserted, updated, deleted)
            puts = np.flatnonzero((inserted | updated)[order])  # positions in key order
            values = self.codec.encode(new.take(pa.array(order[puts]))) if len(puts) else []
            return PreparedWrite(changelog, sorted_keys[puts], values,
                                 sorted_keys[np.flatnonzero(deleted[order])],
                                 int(inserted.sum()) - int(deleted.sum()), at, writer_id, sequence,
                                 timestamp)

    def prepare_changelog(self, changelog: pa.Table, *, writer_id: str | None = None,
                          sequence: int | None = None, timestamp_ms: int | None = None) -> PreparedWrite:
        """A prepared write from a changelog :meth:`prepare` computed before (a write intent rolled
        forward, :mod:`flightstore.intents`): no merge, so nothing here depends on stored values.
        Valid only against the bucket state that changelog was computed from."""
        with self._lock:
            self.catch_up()
            keys, values, removed, delta = self._changes(changelog)
            return PreparedWrite(changelog, keys[values[0]], values[1], keys[removed], delta,
                                 self.applied_offset, writer_id, sequence, timestamp_ms)

    def commit(self, prepared: PreparedWrite, *, durable: bool = False) -> ApplyResult:
        """Apply a :class:`PreparedWrite`: append its changelog to the bucket's log, then write its
        rows, the applied offset, the row count and the writer's sequence to RocksDB in one
        WriteBatch. Nothing here depends on values: it fails only on storage: an OSError from the
        log append leaves the log as it was (nothing written); a RocksDB error after the append is
        WriteIncomplete (the write is in the log, the source of truth: :meth:`catch_up` applies it
        before the bucket's next write, :meth:`recover` at the next open). A duplicate commits
        nothing.

        Raises FlightstoreError when the bucket moved since ``prepared`` was computed (a caller
        that did not hold the table lock across prepare and commit). ``durable`` as in
        :meth:`apply`.
        """
        with self._lock:
            if prepared.duplicate:
                return ApplyResult(None, 0, duplicate=True)
            self._open_now()  # (a prepared changelog read no row: a deferred KV may be closed)
            if self.applied_offset != prepared.at or self.log.end_offset != prepared.at:
                raise FlightstoreError(f"{self.where}: a write prepared at offset {prepared.at} cannot "
                                       f"be committed at offset {self.log.end_offset}")
            changelog = prepared.changelog
            base_offset = None
            if changelog.num_rows:
                base_offset = self.log.append(changelog, writer_id=prepared.writer_id,
                                              sequence=prepared.sequence,
                                              timestamp_ms=prepared.timestamp_ms, durable=False)
            write = WriteBatch(raw_mode=True)
            collections.deque(map(write.put, prepared.put_keys, prepared.put_values), maxlen=0)
            collections.deque(map(write.delete, prepared.delete_keys), maxlen=0)
            write.put(_APPLIED, _INT.pack(self.log.end_offset), self._meta_cf)
            write.put(_ROWS, _INT.pack(self.row_count + prepared.row_delta), self._meta_cf)
            if prepared.writer_id is not None and prepared.sequence is not None:
                write.put(_WRITER + prepared.writer_id.encode(),
                          writer_value(prepared.sequence, prepared.timestamp_ms), self._meta_cf)
            try:
                self._db.write(write)
            except Exception as exc:  # noqa: BLE001 - rocksdict raises RocksDB errors as Exception
                if base_offset is None:
                    raise  # nothing reached the log: nothing was written
                raise WriteIncomplete(f"{self.where}: the write is in the log but RocksDB failed "
                                      f"({exc}); the bucket applies it from the log before its next "
                                      "write or at the next open") from exc
        if durable:
            self.log.sync()
        return ApplyResult(base_offset, changelog.num_rows)

    def catch_up(self) -> int:
        """Replay the changelog the log holds beyond the applied offset (a RocksDB write that
        failed after its log append); returns rows replayed. Repairs committed state only."""
        with self._lock:
            if self.applied_offset >= self.log.end_offset:
                return 0
            return self.recover(uncommitted=True)  # this replica's own appends (it leads)

    def _changes(self, changelog: pa.Table) -> tuple[np.ndarray, tuple[np.ndarray, list[bytes]],
                                                      np.ndarray, int]:
        """What a changelog does to RocksDB: encoded keys, (put positions, encoded values),
        delete positions and the row count delta (+I adds a row, -D removes one, -U/+U
        neither). A changelog holds one change per key (plus the -U of a +U)."""
        kinds = changelog.column(changetype.CHANGE_TYPE_COLUMN).to_numpy(zero_copy_only=False)
        rows = changelog.drop_columns([changetype.CHANGE_TYPE_COLUMN])
        keys = np.array(encode_keys(rows, self.primary_key), dtype=object)
        upsert = np.flatnonzero((kinds == changetype.INSERT) | (kinds == changetype.UPDATE_AFTER))
        values = self.codec.encode(rows.take(pa.array(upsert))) if len(upsert) else []
        removed = np.flatnonzero(kinds == changetype.DELETE)
        delta = int((kinds == changetype.INSERT).sum()) - len(removed)
        return keys, (upsert, values), removed, delta

    def _fetch(self, sorted_keys: np.ndarray, order: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """Stored rows of the key groups (one multi-get of their keys in key order:
        ``sorted_keys[i]`` is group ``order[i]``'s key), aligned to group order, with a found mask.

        A bucket that holds no row finds none without asking RocksDB: a multi-get of keys that are
        all missing cost 3-6 us a key (about a third of the first upsert into a fresh table, the
        lake backfill's sink write); the row count is kept in the same WriteBatch as the rows."""
        if self.row_count == 0:  # an empty bucket (a fresh table's first write, a bulk load): no reads
            nulls = [pa.nulls(len(order), field.type) for field in self.schema]
            return pa.Table.from_arrays(nulls, schema=self.schema), np.zeros(len(order), dtype=bool)
        found_sorted, present = self._multi_get(sorted_keys)
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        positions = np.cumsum(found_sorted) - 1
        positions[~found_sorted] = -1
        positions = positions[rank]
        columns = [take_or_null(present.column(name), positions) for name in self.schema.names]
        return pa.Table.from_arrays(columns, schema=self.schema), found_sorted[rank]

    def _changelog(self, old: pa.Table, new: pa.Table, inserted: np.ndarray, updated: np.ndarray,
                   deleted: np.ndarray) -> pa.Table:
        """Changelog rows in key-group order: +I new | -U old, +U new | -D old."""
        num_groups = len(inserted)
        groups = np.arange(num_groups, dtype=np.int64)
        parts = [  # (group, position within group, change type, row index into old+new)
            (groups[inserted], 0, changetype.INSERT, groups[inserted] + num_groups),
            (groups[updated], 1, changetype.UPDATE_AFTER, groups[updated] + num_groups),
            (groups[deleted], 0, changetype.DELETE, groups[deleted]),
        ]
        if self.full_image:
            parts.append((groups[updated], 0, changetype.UPDATE_BEFORE, groups[updated]))
        group_ids = np.concatenate([p[0] for p in parts])
        sub = np.concatenate([np.full(len(p[0]), p[1], dtype=np.int8) for p in parts])
        kinds = np.concatenate([np.full(len(p[0]), p[2], dtype=np.int8) for p in parts])
        rows = np.concatenate([p[3] for p in parts])
        order = np.lexsort((sub, group_ids))
        both = pa.concat_tables([old, new])
        table = both.take(pa.array(rows[order]))
        return table.append_column(
            pa.field(changetype.CHANGE_TYPE_COLUMN, pa.int8(), nullable=False),
            pa.array(kinds[order], pa.int8()))


def merger_for_overwrite(descriptor: TableDescriptor):
    """A last-row merger regardless of the table's engine: overwrite mode restores rows as given."""
    from flightstore.kv.merge.last_row import LastRowMerger
    return LastRowMerger(descriptor)

