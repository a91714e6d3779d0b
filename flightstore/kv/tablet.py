"""One bucket of a primary-key table: RocksDB rows kept equal to the fold of the bucket's changelog.

Applying a write (``apply``):

1. encode the keys, group the rows by key (groups in order of first occurrence) and fetch the stored
   row of every group with ONE multi-get;
2. let the table's merge engine compute the row each key holds afterwards (partial updates keep the
   unwritten columns);
3. derive the changelog (``+I``; ``-U``/``+U``, no ``-U`` with ``table.changelog.image = WAL``;
   ``-D``) and append it to the bucket's log: the log is durable before the write is acknowledged;
4. write the new rows to RocksDB in ONE WriteBatch that also stores the applied log offset, the row
   count and the writer's batch sequence.

A crash between 3 and 4 is repaired by :meth:`recover` (run on open), which replays the changelog
after the applied offset. :meth:`snapshot` takes a KV snapshot (:mod:`flightstore.kv.snapshot`); a
missing, unopenable or hopelessly stale KV directory is rebuilt on open from the newest usable
snapshot plus the log after it (or from the whole log while it starts at offset 0), with a log line
saying so; :meth:`rebuild` does the same on request.
"""

from __future__ import annotations

import logging
import shutil
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rocksdict import BlockBasedOptions, Checkpoint, Options, Rdict, WriteBatch

from flightstore import changetype
from flightstore.errors import CorruptData, DataLoss, FlightstoreError
from flightstore.expressions import Predicate
from flightstore.kv.encoding import encode_keys
from flightstore.kv.merge import MergeInput, merger_for
from flightstore.kv.merge.base import take_or_null
from flightstore.kv.snapshot import KvSnapshots, SnapshotInfo
from flightstore.kv.snapshot_read import read_at
from flightstore.kv.versions import VersionedRowCodec
from flightstore.log import LogTablet
from flightstore.log.held import require_held
from flightstore.schema import TableDescriptor

__all__ = ["KvTablet", "ApplyResult", "changelog_schema"]

log = logging.getLogger("flightstore.kv")

_APPLIED = b"applied_offset"
_ROWS = b"row_count"
_WRITER = b"writer:"
_VALUE_FORMAT = b"value_format"  # present: every value leads with its schema version
_INT = struct.Struct(">q")
SCAN_CHUNK_ROWS = 65_536
# A full scan reads the newest snapshot image plus the changelog after it unless that tail holds
# more than this many rows per image row (then iterating RocksDB is cheaper).
IMAGE_TAIL_FACTOR = 4
IMAGE_TAIL_MIN_ROWS = 65_536


def changelog_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of a primary-key table's log: the table columns + int8 ``_change_type``."""
    return schema.append(pa.field(changetype.CHANGE_TYPE_COLUMN, pa.int8(), nullable=False))


@dataclass(frozen=True)
class ApplyResult:
    """What one ``apply`` did: the changelog's first offset (None if nothing changed)."""

    base_offset: int | None
    changes: int
    duplicate: bool = False


def _null_safe_equal(a: pa.ChunkedArray, b: pa.ChunkedArray) -> np.ndarray:
    eq = pc.fill_null(pc.equal(a, b), False)
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return pc.or_(eq, both_null).to_numpy(zero_copy_only=False)


class KvTablet:
    """The RocksDB state of one bucket of a primary-key table, fed through its changelog."""

    def __init__(self, directory: str | Path, descriptor: TableDescriptor, log: LogTablet, *,
                 fsync: bool = True) -> None:
        self.directory = Path(directory)
        self.descriptor = descriptor
        self.schema = descriptor.schema
        self.primary_key = descriptor.primary_key
        self.log = log
        self.codec = VersionedRowCodec(descriptor.schemas, descriptor.version)
        self.merger = merger_for(descriptor)
        self.full_image = descriptor.option("table.changelog.image") == "FULL"
        self.name = f"table {descriptor.path} {self.directory.parent.name}"
        self.snapshots = KvSnapshots(self.directory.parent / "snapshots",
                                     descriptor.option("kv.snapshot.num-retained"), fsync=fsync)
        self._lock = threading.RLock()
        self._db: Rdict | None = None
        self.recovered_from = self._open_or_restore()
        self._upgrade_values()
        self.recover()

    def evolve(self, descriptor: TableDescriptor) -> None:
        """Follow ALTER TABLE: write values of the new schema version from now on (stored values
        keep theirs and read back conformed), merge with the new options. Nothing is rewritten."""
        with self._lock:
            self.descriptor = descriptor
            self.schema = descriptor.schema
            self.codec = VersionedRowCodec(descriptor.schemas, descriptor.version)
            self.merger = merger_for(descriptor)
            self.full_image = descriptor.option("table.changelog.image") == "FULL"
            self.snapshots.release_images()  # reopened under the new schema (older images conform)

    def _upgrade_values(self) -> None:
        """Values written before they carried a schema version (a KV, or a snapshot restored into
        it, from before schema evolution) are rebuilt once, from the whole log: recover() replays
        it into the emptied KV."""
        if self._meta.get(_VALUE_FORMAT) is not None:
            return
        if next(iter(self._db.keys()), None) is not None:
            start = self.log.start_offset
            if start > 0:
                raise CorruptData(f"{self.name}: the KV holds values of an older format and the log no "
                                  f"longer starts at 0 (offset {start}), so it cannot be rewritten")
            log.warning("%s: the KV holds values without schema versions; rebuilding it from the "
                        "whole log", self.name)
            self.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            self._open_db()
        self._mark_versioned()

    def _mark_versioned(self) -> None:
        write = WriteBatch(raw_mode=True)
        write.put(_VALUE_FORMAT, b"\x01", self._meta_cf)
        self._db.write(write)

    # ---- RocksDB plumbing ---------------------------------------------------------------------
    def _open_db(self) -> None:
        options = Options(raw_mode=True)
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)  # misses (new keys on upsert) skip SST files
        options.set_block_based_table_factory(table)
        options.set_memtable_whole_key_filtering(True)
        options.set_memtable_prefix_bloom_ratio(0.1)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        # Every KV snapshot flushes the memtable, and RocksDB logs each flush: bound its info log
        # and MANIFEST, or a steady load with frequent snapshots grows them without end.
        options.set_max_log_file_size(256 << 10)
        options.set_keep_log_file_num(2)
        options.set_max_manifest_file_size(1 << 20)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._db = Rdict(str(self.directory), options=options,
                         column_families={"meta": Options(raw_mode=True)})
        self._meta_cf = self._db.get_column_family_handle("meta")
        self._meta = self._db.get_column_family("meta")

    def _open_or_restore(self) -> str:
        """Open the live KV; when it is missing, cannot be opened or lags behind the log start,
        rebuild it (see :meth:`_restore`). Returns where the state came from: ``"kv"``, ``"new"``,
        ``"snapshot <id>"`` or ``"log"``."""
        if (self.directory / "CURRENT").exists():
            try:
                self._open_db()
            except Exception as exc:  # noqa: BLE001 - rocksdict raises plain Exception("Corruption: ...")
                return self._restore(f"cannot be opened ({exc})")
            applied, start = self.applied_offset, self.log.start_offset
            if applied >= start:
                return "kv"
            self.close()
            return self._restore(f"lags behind the log (applied offset {applied}, the log starts at {start})")
        if self.log.end_offset == 0 and not self.snapshots.list():
            self._open_db()
            return "new"
        return self._restore("is missing")

    def _restore(self, reason: str) -> str:
        """Replace the KV directory by the newest snapshot the log can extend (its offset within
        the held log), trying older ones when one fails; or by nothing, to replay the whole log
        when it still starts at 0. Raises DataLoss when neither is possible."""
        start, end = self.log.start_offset, self.log.end_offset
        for snapshot in reversed(self.snapshots.list()):
            if not start <= snapshot.offset <= end:
                continue
            try:
                self.snapshots.restore(snapshot, self.directory)
                self._open_db()
                if self.applied_offset != snapshot.offset:
                    raise CorruptData(f"it holds offset {self.applied_offset}, its manifest says "
                                      f"{snapshot.offset}")
            except Exception as exc:  # noqa: BLE001 - a bad checkpoint: try an older one
                self.close()
                log.error("%s: KV snapshot %d is unusable (%s); trying an older one", self.name,
                          snapshot.id, exc)
                continue
            log.warning("%s: the KV directory %s; rebuilt it from KV snapshot %d (log offset %d) "
                        "and replaying the log from there to offset %d", self.name, reason, snapshot.id,
                        snapshot.offset, end)
            return f"snapshot {snapshot.id}"
        if start == 0:
            shutil.rmtree(self.directory, ignore_errors=True)
            self._open_db()
            log.warning("%s: the KV directory %s; rebuilding it from the whole log (offsets 0 to %d)",
                        self.name, reason, end)
            return "log"
        raise DataLoss(f"{self.name}: the KV directory {reason}, and no usable KV snapshot lies within "
                       f"the held log (offsets {start} to {end}): the changes below {start} are gone")

    def _meta_int(self, key: bytes, default: int = 0) -> int:
        raw = self._meta.get(key)
        return default if raw is None else _INT.unpack(raw)[0]

    @property
    def applied_offset(self) -> int:
        """Log offset up to which the changelog is reflected in RocksDB."""
        return self._meta_int(_APPLIED)

    @property
    def row_count(self) -> int:
        return self._meta_int(_ROWS)

    def writer_sequence(self, writer_id: str) -> int | None:
        raw = self._meta.get(_WRITER + writer_id.encode())
        return None if raw is None else _INT.unpack(raw)[0]

    def writer_state(self) -> dict[str, int]:
        state = {}
        for key, value in self._meta.items(from_key=_WRITER):
            if not key.startswith(_WRITER):
                break
            state[key[len(_WRITER):].decode()] = _INT.unpack(value)[0]
        return state

    def close(self) -> None:
        with self._lock:
            self.snapshots.release_images()
            if self._db is not None:
                del self._meta, self._meta_cf
                self._db.close()
                self._db = None

    # ---- snapshots ----------------------------------------------------------------------------
    def snapshot(self, *, force: bool = False, stop=None) -> SnapshotInfo | None:
        """Take a KV snapshot (checkpoint + image) at the applied offset and return it; None when
        nothing changed since the newest snapshot (unless ``force``) or the bucket is still empty.
        Writes wait only for the checkpoint itself (a flush and hard links), not for the image.
        ``stop()`` returning True abandons the image (the previous snapshots stay)."""
        def checkpoint(path: Path) -> tuple[int, int] | None:
            with self._lock:
                if self._db is None:
                    raise FlightstoreError(f"{self.name}: the KV is closed")
                applied = self.applied_offset
                newest = self.snapshots.newest
                if not force and (applied == 0 or (newest is not None and newest.offset == applied)):
                    return None
                Checkpoint(self._db).create_checkpoint(str(path))
                return applied, self.row_count

        return self.snapshots.create(checkpoint, self.codec, self.primary_key,
                                     self.descriptor.statistics_columns, stop=stop)

    # ---- writes -------------------------------------------------------------------------------
    def apply(self, batch: pa.Table, kinds: np.ndarray, target_columns: tuple[str, ...] | None = None,
              *, writer_id: str | None = None, sequence: int | None = None,
              overwrite: bool = False, durable: bool = True) -> ApplyResult:
        """Apply rows (every table column, conformed by the caller) with per-row change types.

        ``overwrite`` bypasses the merge engine: rows replace (+I/+U) or remove (-D) stored rows as
        they are (used to restore before-images). A batch whose ``sequence`` this writer already
        applied is skipped and reported as ``duplicate``. With ``durable`` the changelog is on disk
        when this returns (if the log fsyncs); a caller holding locks passes False and calls
        ``log.sync()`` after releasing them, so concurrent writers share the fsync.
        """
        result = self._apply(batch, kinds, target_columns, writer_id, sequence, overwrite)
        if durable:
            self.log.sync()
        return result

    def _apply(self, batch: pa.Table, kinds: np.ndarray, target_columns: tuple[str, ...] | None,
               writer_id: str | None, sequence: int | None, overwrite: bool) -> ApplyResult:
        with self._lock:
            if writer_id is not None and sequence is not None:
                last = self.writer_sequence(writer_id)
                if last is not None and sequence <= last:
                    return ApplyResult(None, 0, duplicate=True)
            keys = encode_keys(batch, self.primary_key)
            encoded = pa.array(keys, pa.binary()).dictionary_encode()
            group = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            unique_keys = encoded.dictionary.to_pylist()
            num_groups = len(unique_keys)
            old, found = self._fetch(unique_keys)
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
            base_offset = None
            if changelog.num_rows:
                base_offset = self.log.append(changelog, writer_id=writer_id, sequence=sequence,
                                              durable=False)
            write = WriteBatch(raw_mode=True)
            put_mask = inserted | updated
            key_array = np.asarray(unique_keys, dtype=object)
            if put_mask.any():
                put_keys = key_array[put_mask]
                values = self.codec.encode(new.filter(pa.array(put_mask)))
                for key, value in zip(put_keys, values):
                    write.put(key, value)
            if deleted.any():
                for key in key_array[deleted]:
                    write.delete(key)
            write.put(_APPLIED, _INT.pack(self.log.end_offset), self._meta_cf)
            write.put(_ROWS, _INT.pack(self.row_count + int(inserted.sum()) - int(deleted.sum())),
                      self._meta_cf)
            if writer_id is not None and sequence is not None:
                write.put(_WRITER + writer_id.encode(), _INT.pack(sequence), self._meta_cf)
            self._db.write(write)
            return ApplyResult(base_offset, changelog.num_rows)

    def _multi_get(self, keys: list[bytes], columns: Sequence[str] | None = None
                   ) -> tuple[np.ndarray, pa.Table]:
        """One RocksDB multi-get of encoded ``keys``: (found mask, decoded rows of the found ones)."""
        values = self._db.get(keys) if keys else []
        found = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
        return found, self.codec.decode([v for v in values if v is not None], columns)

    def _fetch(self, unique_keys: list[bytes]) -> tuple[pa.Table, np.ndarray]:
        """Stored rows of ``unique_keys`` (one multi-get), aligned, with a found mask."""
        found, present = self._multi_get(unique_keys)
        positions = np.cumsum(found) - 1
        positions[~found] = -1
        columns = [take_or_null(present.column(name), positions) for name in self.schema.names]
        return pa.Table.from_arrays(columns, schema=self.schema), found

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

    # ---- recovery -----------------------------------------------------------------------------
    def recover(self) -> int:
        """Replay the changelog after the applied offset into RocksDB; returns rows replayed.

        A KV that applied more than the log holds (the log lost its tail) is still the table's
        state: it keeps serving, the log continues at the applied offset (new changes never reuse
        the lost offsets), and the lost changelog range is reported (logged, and
        :class:`~flightstore.errors.DataLoss` for reads of it) until ``flightstore repair``
        declares it. A hole in the part still to replay raises DataLoss: the KV would miss changes.
        """
        with self._lock:
            applied = self.applied_offset
            end = self.log.end_offset
            if applied > end:
                log.error("%s: the KV applied the changelog up to offset %d but the log ends at %d: "
                          "changelog offsets %d..%d are lost; the KV still holds the table's state. "
                          "Run `flightstore repair` to declare the loss", self.log.label, applied,
                          end, end, applied - 1)
                self.log.skip_to(applied)
                return 0
            if applied < self.log.start_offset:
                raise CorruptData(f"{self.log.label}: the log no longer holds offsets {applied}.."
                                  f"{self.log.start_offset}; cannot catch up the KV")
            replayed = 0
            for record in self.log.read(applied):
                replayed += self._replay(record)
            return replayed

    def _replay(self, record) -> int:
        batch = pa.Table.from_batches([record.batch])
        kinds = batch.column(changetype.CHANGE_TYPE_COLUMN).to_numpy(zero_copy_only=False)
        rows = batch.drop_columns([changetype.CHANGE_TYPE_COLUMN])
        keys = encode_keys(rows, self.primary_key)
        upsert = (kinds == changetype.INSERT) | (kinds == changetype.UPDATE_AFTER)
        values = iter(self.codec.encode(rows.filter(pa.array(upsert)))) if upsert.any() else iter(())
        write = WriteBatch(raw_mode=True)
        for key, kind in zip(keys, kinds):
            if kind == changetype.INSERT or kind == changetype.UPDATE_AFTER:
                write.put(key, next(values))
            elif kind == changetype.DELETE:
                write.delete(key)
        delta = int((kinds == changetype.INSERT).sum()) - int((kinds == changetype.DELETE).sum())
        write.put(_APPLIED, _INT.pack(record.next_offset), self._meta_cf)
        write.put(_ROWS, _INT.pack(self.row_count + delta), self._meta_cf)
        if record.writer_id is not None and record.sequence is not None:
            write.put(_WRITER + record.writer_id.encode(), _INT.pack(record.sequence), self._meta_cf)
        self._db.write(write)
        return batch.num_rows

    def rebuild(self) -> int:
        """Throw the RocksDB state away and rebuild it from the newest usable snapshot and the log
        after it (the whole log while it starts at 0); returns the log rows replayed."""
        with self._lock:
            self.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            self.recovered_from = self._restore("was thrown away on request")
            self._upgrade_values()
            return self.recover()

    # ---- reads --------------------------------------------------------------------------------
    def lookup(self, keys: pa.Table, columns: Sequence[str] | None = None) -> tuple[np.ndarray, pa.Table]:
        """Rows of ``keys`` (PK columns) with one multi-get: (found mask, rows of the found keys)."""
        return self._multi_get(encode_keys(keys, self.primary_key), columns)

    def prefix_lookup(self, prefixes: Sequence[bytes], columns: Sequence[str] | None = None,
                      limit: int | None = None) -> pa.Table:
        """Rows whose encoded key starts with one of ``prefixes``, in key order per prefix."""
        values: list[bytes] = []
        for prefix in prefixes:
            for key, value in self._db.items(from_key=prefix):
                if not key.startswith(prefix) or (limit is not None and len(values) >= limit):
                    break
                values.append(value)
        return self.codec.decode(values, columns)

    def full_scan(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
                  limit: int | None = None) -> Iterator[pa.RecordBatch]:
        """Every current row, filtered exactly, at most ``limit``: the newest snapshot image plus
        the changelog after it (:mod:`flightstore.kv.snapshot_read`, consistent at the log end
        when called), or RocksDB (:meth:`scan`) when there is no usable image or the changelog
        since it is much longer than the image."""
        snapshot = self.snapshots.newest
        at = self.log.end_offset
        if snapshot is not None and at - snapshot.offset <= \
                IMAGE_TAIL_FACTOR * max(snapshot.rows, IMAGE_TAIL_MIN_ROWS):
            image = self.snapshots.image(snapshot, self.schema)
            if image is not None:
                return read_at(image, snapshot.offset, self.log, at, self.primary_key,
                               columns or self.schema.names, filter, limit, where=self.name)
        return self.scan(columns, filter, limit)

    def rows_at(self, at: int, columns: Sequence[str] | None = None, filter: Predicate | None = None,
                limit: int | None = None) -> Iterator[pa.RecordBatch]:
        """The rows exactly at log offset ``at`` (``start_offset <= at <= end_offset``): the newest
        snapshot at or below ``at`` plus the changelog up to ``at``; without one, the changelog
        from 0 while the log still starts there. Raises OffsetOutOfRange otherwise."""
        require_held(self.log, at, self.name)
        snapshot = self.snapshots.at_or_before(at)
        image = self.snapshots.image(snapshot, self.schema) if snapshot is not None else None
        if snapshot is not None and image is None:
            raise CorruptData(f"{self.name}: the image of KV snapshot {snapshot.id} is unusable")
        start = snapshot.offset if snapshot is not None else 0
        return read_at(image, start, self.log, at, self.primary_key, columns or self.schema.names,
                       filter, limit, where=self.name)

    def scan(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
             limit: int | None = None) -> Iterator[pa.RecordBatch]:
        """Every stored row in key order as record batches, filtered exactly, stopping at ``limit``."""
        wanted = list(columns) if columns is not None else self.schema.names
        needed = wanted + [c for c in sorted(filter.columns()) if c not in wanted] if filter else wanted
        remaining = limit
        chunk: list[bytes] = []

        def emit(values: list[bytes]) -> pa.Table:
            table = self.codec.decode(values, needed)
            if filter is not None:
                table = table.filter(filter.to_arrow())
            return table.select(wanted)

        for value in self._db.values():
            chunk.append(value)
            if len(chunk) >= SCAN_CHUNK_ROWS:
                table = emit(chunk)
                chunk = []
                if remaining is not None:
                    table = table.slice(0, remaining)
                    remaining -= table.num_rows
                yield from table.to_batches()
                if remaining is not None and remaining <= 0:
                    return
        if chunk:
            table = emit(chunk)
            if remaining is not None:
                table = table.slice(0, remaining)
            yield from table.to_batches()


def merger_for_overwrite(descriptor: TableDescriptor):
    """A last-row merger regardless of the table's engine: overwrite mode restores rows as given."""
    from flightstore.kv.merge.last_row import LastRowMerger
    return LastRowMerger(descriptor)
