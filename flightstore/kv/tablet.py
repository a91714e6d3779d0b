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

Reads (point lookups, prefix lookups, scans and key ranges) go through :mod:`flightstore.kv.scan`:
chunked, from one RocksDB snapshot, decoded with the vectorized row codec, and checked so that a
corrupt file is a :class:`~flightstore.errors.DataLoss` naming the table and bucket, never a short
answer. :meth:`full_scan` reads the newest KV snapshot image plus the changelog instead when one
serves (:mod:`flightstore.kv.snapshot_read`).
"""

from __future__ import annotations

import collections
import logging
import shutil
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rocksdict import BlockBasedOptions, Checkpoint, Options, Rdict, WriteBatch

from flightstore import changetype
from flightstore.batches import limited
from flightstore.errors import CorruptData, DataLoss, FlightstoreError
from flightstore.expressions import Predicate
from flightstore.kv.encoding import encode_key_array, encode_keys
from flightstore.kv.merge import MergeInput, merger_for
from flightstore.kv.merge.base import take_or_null
from flightstore.kv.ranges import KeyRange, encode_range, prefix_successor
from flightstore.kv.scan import FIRST_CHUNK_ROWS, RangeReader, storage_errors
from flightstore.kv.snapshot import KvSnapshots, SnapshotInfo
from flightstore.kv.snapshot_read import read_at
from flightstore.kv.versions import VersionedRowCodec
from flightstore.log import LogTablet
from flightstore.log.held import require_held
from flightstore.schema import TableDescriptor

__all__ = ["UNDO_FENCE_PREFIX", "WRITER_META_PREFIXES", "ApplyResult", "KvTablet", "changelog_schema"]

log = logging.getLogger("flightstore.kv")

_APPLIED = b"applied_offset"
_ROWS = b"row_count"
_WRITER = b"writer:"  # + writer id: (last sequence, last write ms); 8-byte values predate the time
UNDO_FENCE_PREFIX = b"undo:"  # + writer id: its last undo (kv/undo.py)
WRITER_META_PREFIXES = (_WRITER, UNDO_FENCE_PREFIX)  # what a writer keeps in the meta column family
_VALUE_FORMAT = b"value_format"  # present: every value leads with its schema version
_INT = struct.Struct(">q")
_WRITER_STATE = struct.Struct(">qq")
_FOUND, _NOT_FOUND = np.ones(1, bool), np.zeros(1, bool)  # found masks of one key (read-only)
_FOUND.setflags(write=False)
_NOT_FOUND.setflags(write=False)
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
                 fsync: bool = True, bucket: int | None = None) -> None:
        self.directory = Path(directory)
        self.descriptor = descriptor
        self.bucket = bucket
        self.schema = descriptor.schema
        self.primary_key = descriptor.primary_key
        self.log = log
        self.codec = VersionedRowCodec(descriptor.schemas, descriptor.version)
        self.merger = merger_for(descriptor)
        self.full_image = descriptor.option("table.changelog.image") == "FULL"
        self.name = f"table {descriptor.path} {self.directory.parent.name}"
        # How errors name the bucket: "table db.t bucket 3" (DataLoss messages).
        self.where = self.name if bucket is None else f"table {descriptor.path} bucket {bucket}"
        self.snapshots = KvSnapshots(self.directory.parent / "snapshots",
                                     descriptor.option("kv.snapshot.num-retained"), fsync=fsync)
        self._lock = threading.RLock()
        self._io_lock = threading.Lock()
        self._io = {"rows_read": 0, "chunks_read": 0}
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
            applied = self.applied_offset
            # (the local start first: what remote storage holds is then not needed to open)
            if applied >= self.log.local_start_offset or applied >= (start := self.log.start_offset):
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
        return None if raw is None else _INT.unpack_from(raw)[0]

    def writer_state(self) -> dict[str, int]:
        """The last batch sequence applied per writer id."""
        return {writer: sequence for writer, (sequence, _) in self.writer_activity().items()}

    def writer_activity(self) -> dict[str, tuple[int, int | None]]:
        """``{writer: (last sequence, ms of its last write, or None when not recorded)}``."""
        state = {}
        for key, value in self._meta.items(from_key=_WRITER):
            if not key.startswith(_WRITER):
                break
            last_ms = _WRITER_STATE.unpack(value)[1] if len(value) == _WRITER_STATE.size else None
            state[key[len(_WRITER):].decode()] = (_INT.unpack_from(value)[0], last_ms)
        return state

    # ---- the meta column family: per-writer state and what other modules keep there -------------
    def meta(self, key: bytes) -> bytes | None:
        """A value of the meta column family (undo fences: :mod:`flightstore.kv.undo`)."""
        return self._meta.get(key)

    def write_meta(self, puts: Mapping[bytes, bytes | None],
                   writers: Mapping[str, int | None] | None = None) -> None:
        """One atomic RocksDB write of meta ``puts`` (None deletes) and of writers' sequences
        (``writers``: a new last sequence, keeping the last write time, or None to forget it)."""
        with self._lock:
            write = WriteBatch(raw_mode=True)
            for key, value in puts.items():
                if value is None:
                    write.delete(key, self._meta_cf)
                else:
                    write.put(key, value, self._meta_cf)
            for writer, sequence in (writers or {}).items():
                key = _WRITER + writer.encode()
                if sequence is None:
                    write.delete(key, self._meta_cf)
                    continue
                raw = self._meta.get(key)
                last_ms = _WRITER_STATE.unpack(raw)[1] if raw and len(raw) == _WRITER_STATE.size \
                    else None
                write.put(key, _writer_value(sequence, last_ms), self._meta_cf)
            self._db.write(write)

    def drop_writers(self, writer_ids: Sequence[str]) -> None:
        """Forget expired writers: every meta key they keep (sequence, undo fence), in one write."""
        self.write_meta({prefix + w.encode(): None for w in writer_ids for prefix in WRITER_META_PREFIXES})

    def close(self) -> None:
        """Close RocksDB. A RocksDB error while closing (it reports a corrupt file it met again)
        is logged, not raised: the store must still release every other table."""
        with self._lock:
            self.snapshots.release_images()
            if self._db is not None:
                del self._meta, self._meta_cf
                db, self._db = self._db, None
                try:
                    db.close()
                except Exception as exc:
                    if type(exc) is not Exception:  # rocksdict raises RocksDB errors as Exception
                        raise
                    log.error("%s: closing RocksDB failed: %s", self.where, exc)

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
                if self.log.replicated and applied > 0 and not self.log.wait_for(
                        applied - 1, self.log.commit_timeout_s):
                    return None  # a snapshot holds committed changes only: the next round tries again
                Checkpoint(self._db).create_checkpoint(str(path))
                return applied, self.row_count

        return self.snapshots.create(checkpoint, self.codec, self.primary_key,
                                     self.descriptor.statistics_columns, stop=stop)

    # ---- writes -------------------------------------------------------------------------------
    def apply(self, batch: pa.Table, kinds: np.ndarray, target_columns: tuple[str, ...] | None = None,
              *, writer_id: str | None = None, sequence: int | None = None,
              overwrite: bool = False, durable: bool = True, now_ms: int | None = None) -> ApplyResult:
        """Apply rows (every table column, conformed by the caller) with per-row change types.

        ``overwrite`` bypasses the merge engine: rows replace (+I/+U) or remove (-D) stored rows as
        they are (used to restore before-images). A batch whose ``sequence`` this writer already
        applied is skipped and reported as ``duplicate``. With ``durable`` the changelog is on disk
        when this returns (if the log fsyncs); a caller holding locks passes False and calls
        ``log.sync()`` after releasing them, so concurrent writers share the fsync. ``now_ms``
        (default: the wall clock) is the changelog record's timestamp and the writer's last write
        time.
        """
        result = self._apply(batch, kinds, target_columns, writer_id, sequence, overwrite, now_ms)
        if durable:
            self.log.sync()
        return result

    def _apply(self, batch: pa.Table, kinds: np.ndarray, target_columns: tuple[str, ...] | None,
               writer_id: str | None, sequence: int | None, overwrite: bool,
               now_ms: int | None) -> ApplyResult:
        with self._lock:
            if writer_id is not None and sequence is not None:
                last = self.writer_sequence(writer_id)
                if last is not None and sequence <= last:
                    return ApplyResult(None, 0, duplicate=True)
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
            base_offset = None
            if changelog.num_rows:
                base_offset = self.log.append(changelog, writer_id=writer_id, sequence=sequence,
                                              timestamp_ms=now_ms, durable=False)
            write = WriteBatch(raw_mode=True)
            puts = np.flatnonzero((inserted | updated)[order])  # positions in key order
            if len(puts):
                values = self.codec.encode(new.take(pa.array(order[puts])))
                collections.deque(map(write.put, sorted_keys[puts], values), maxlen=0)
            removed = np.flatnonzero(deleted[order])
            if len(removed):
                collections.deque(map(write.delete, sorted_keys[removed]), maxlen=0)
            write.put(_APPLIED, _INT.pack(self.log.end_offset), self._meta_cf)
            write.put(_ROWS, _INT.pack(self.row_count + int(inserted.sum()) - int(deleted.sum())),
                      self._meta_cf)
            if writer_id is not None and sequence is not None:
                last_ms = int(time.time() * 1000) if now_ms is None else now_ms
                write.put(_WRITER + writer_id.encode(), _writer_value(sequence, last_ms), self._meta_cf)
            self._db.write(write)
            return ApplyResult(base_offset, changelog.num_rows)

    def _multi_get(self, keys: list[bytes] | np.ndarray, columns: Sequence[str] | None = None
                   ) -> tuple[np.ndarray, pa.Table]:
        """One RocksDB multi-get of encoded ``keys``: (found mask, decoded rows of the found ones).
        A RocksDB error (a corrupt block...) is DataLoss naming the table and bucket."""
        keys = keys if isinstance(keys, list) else keys.tolist()
        if len(keys) == 1:  # a point lookup: one get, no multi-get set-up
            with storage_errors(self.where, "RocksDB read failed", str(self.directory)):
                value = self._db.get(keys[0])
            if value is None:
                return _NOT_FOUND, self.codec.decode([], columns)
            return _FOUND, self.codec.decode([value], columns)
        with storage_errors(self.where, "RocksDB read failed", str(self.directory)):
            values = self._db.get(keys) if keys else []
        if len(values) <= 16:  # point lookups: a few Python checks beat building an array
            found = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
            return found, self.codec.decode([v for v in values if v is not None], columns)
        array = pa.array(values, pa.large_binary())
        found = array.is_valid().to_numpy(zero_copy_only=False)
        return found, self.codec.decode(array.drop_null() if array.null_count else array, columns)

    def _fetch(self, sorted_keys: np.ndarray, order: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """Stored rows of the key groups (one multi-get of their keys in key order:
        ``sorted_keys[i]`` is group ``order[i]``'s key), aligned to group order, with a found mask."""
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

    # ---- recovery -----------------------------------------------------------------------------
    def recover(self, uncommitted: bool = False) -> int:
        """Replay the changelog after the applied offset into RocksDB; returns rows replayed.

        A replicated log is replayed up to its high watermark (a follower's KV holds committed
        changes only); ``uncommitted`` replays to its end (a new leader takes its whole log).

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
            if applied < self.log.local_start_offset and applied < self.log.start_offset:
                raise CorruptData(f"{self.log.label}: the log no longer holds offsets {applied}.."
                                  f"{self.log.start_offset}; cannot catch up the KV")
            replayed = 0
            for record in self.log.read(applied, uncommitted=uncommitted):
                replayed += self._replay(record)
            return replayed

    def _replay(self, record) -> int:
        batch = pa.Table.from_batches([record.batch])
        kinds = batch.column(changetype.CHANGE_TYPE_COLUMN).to_numpy(zero_copy_only=False)
        rows = batch.drop_columns([changetype.CHANGE_TYPE_COLUMN])
        keys = np.array(encode_keys(rows, self.primary_key), dtype=object)
        upsert = (kinds == changetype.INSERT) | (kinds == changetype.UPDATE_AFTER)
        write = WriteBatch(raw_mode=True)
        if upsert.any():  # one change per key and record: puts and deletes do not interleave
            values = self.codec.encode(rows.filter(pa.array(upsert)))
            collections.deque(map(write.put, keys[upsert], values), maxlen=0)
        removed = kinds == changetype.DELETE
        if removed.any():
            collections.deque(map(write.delete, keys[removed]), maxlen=0)
        delta = int((kinds == changetype.INSERT).sum()) - int((kinds == changetype.DELETE).sum())
        write.put(_APPLIED, _INT.pack(record.next_offset), self._meta_cf)
        write.put(_ROWS, _INT.pack(self.row_count + delta), self._meta_cf)
        if record.writer_id is not None and record.sequence is not None:
            write.put(_WRITER + record.writer_id.encode(),
                      _writer_value(record.sequence, record.timestamp_ms), self._meta_cf)
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
        found = self._multi_get(encode_keys(keys, self.primary_key), columns)
        self._committed()
        return found

    def committed_row_count(self) -> int:
        """:attr:`row_count` once the changes it counts are committed (see :meth:`_committed`)."""
        count = self.row_count
        self._committed()
        return count

    def _committed(self) -> None:
        """Return once what a read just saw is committed: a replicated leader's RocksDB may hold
        changes its in-sync replicas do not have yet; they are at most what its log holds, so the
        read waits (normally one replication round trip) until the high watermark covers the log
        end read *after* the data. Never an uncommitted row: NotEnoughReplicas past the timeout."""
        log_ = self.log
        if log_.replicated:
            log_.await_committed(log_.end_offset)

    def prefix_lookup(self, prefixes: Sequence[bytes], columns: Sequence[str] | None = None,
                      limit: int | None = None) -> pa.Table:
        """Rows whose encoded key starts with one of ``prefixes``, in key order per prefix."""
        wanted = list(columns) if columns is not None else self.schema.names
        parts = []
        remaining = limit
        for prefix in prefixes:
            for table in self._read(prefix, prefix_successor(prefix), wanted, None, remaining):
                parts.append(table)
                if remaining is not None:
                    remaining -= table.num_rows
            if remaining is not None and remaining <= 0:
                break
        self._committed()
        if not parts:
            return self.codec.decode([], wanted)
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def full_scan(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
                  limit: int | None = None, *, exact: bool = True) -> Iterator[pa.RecordBatch]:
        """Every current row, filtered exactly, at most ``limit``: the newest snapshot image plus
        the changelog after it (:mod:`flightstore.kv.snapshot_read`, consistent at the log end
        when called), or RocksDB (:meth:`scan`) when there is no usable image or the changelog
        since it is much longer than the image.

        ``exact=False`` is for analytic callers that apply ``filter`` again and need no key order
        (residual SQL): rows come unfiltered (batches are still skipped by statistics), and a
        bucket without a usable image is read from its whole changelog (the image of offset 0 is
        empty) when the log still starts at 0, has no declared-lost range and is not much longer
        than the bucket: columnar reads instead of a RocksDB iteration."""
        snapshot = self.snapshots.newest
        at = self.log.high_watermark
        wanted = columns or self.schema.names
        try:  # read_at reads the changelog part before it returns: damage found there is found here
            if snapshot is not None and self._tail_is_short(at - snapshot.offset, snapshot.rows) \
                    and snapshot.offset >= self.log.local_start_offset:  # its tail is on local disk
                image = self.snapshots.image(snapshot, self.schema)
                if image is not None:
                    return read_at(image, snapshot.offset, self.log, at, self.primary_key, wanted, filter,
                                   limit, where=self.name, exact=exact)
            if not exact and self._replayable(at):
                return read_at(None, 0, self.log, at, self.primary_key, wanted, filter, limit,
                               where=self.name, exact=False)
        except (DataLoss, CorruptData) as error:
            # RocksDB holds the current rows whatever the changelog lost: answer from it.
            log.warning("%s: the changelog cannot be read (%s); scanning RocksDB instead", self.name, error)
        return self.scan(columns, filter, limit)

    @staticmethod
    def _tail_is_short(tail_rows: int, image_rows: int) -> bool:
        return tail_rows <= IMAGE_TAIL_FACTOR * max(image_rows, IMAGE_TAIL_MIN_ROWS)

    def _replayable(self, at: int) -> bool:
        """Whether the changelog ``[0, at)`` is held whole on local disk and short enough to read
        instead of RocksDB."""
        log_ = self.log
        return (log_.local_start_offset == 0 and log_.lost_rows == 0 and not log_.damage()
                and self._tail_is_short(at, self.row_count))

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

    def io_stats(self) -> dict:
        """Rows and chunks read from RocksDB by scans and prefix lookups since open."""
        with self._io_lock:
            return dict(self._io)

    def scan(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
             limit: int | None = None, key_range: KeyRange | None = None) -> Iterator[pa.RecordBatch]:
        """Stored rows in key order as record batches, filtered exactly, stopping at ``limit``.

        ``key_range`` (see :mod:`flightstore.kv.ranges`) restricts the read to one RocksDB seek
        range; ``filter`` is still applied to every row read. Memory is bounded by one chunk of
        rows whatever the bucket's size. Corruption met on the way raises DataLoss.
        """
        wanted = list(columns) if columns is not None else self.schema.names
        lower = upper = None
        if key_range is not None:
            lower, upper = encode_range(key_range, self.schema)
        for table in self._read(lower, upper, wanted, filter, limit):
            yield from table.to_batches()

    def _read(self, lower: bytes | None, upper: bytes | None, wanted: list[str],
              filter: Predicate | None, limit: int | None) -> Iterator[pa.Table]:
        """Decoded, filtered, projected chunks of the keys in ``[lower, upper)``, up to ``limit``
        rows, all from one RocksDB snapshot."""
        needed = wanted + [c for c in sorted(filter.columns()) if c not in wanted] if filter else wanted
        expression = filter.to_arrow() if filter is not None else None
        with self._lock:  # the snapshot and the row count that goes with it
            snapshot = self._db.snapshot()
            expected = self.row_count if lower is None and upper is None else None
        self._committed()
        reader = RangeReader(snapshot, lower, upper, where=self.where, directory=str(self.directory),
                             expected_rows=expected)

        def decoded() -> Iterator[pa.Table]:
            # With a LIMIT the first chunk is just big enough; chunks grow when the filter drops rows.
            for values in reader.chunks(FIRST_CHUNK_ROWS if limit is None else limit):
                with self._io_lock:
                    self._io["rows_read"] += len(values)
                    self._io["chunks_read"] += 1
                table = self.codec.decode(values, needed)
                if expression is not None:
                    table = table.filter(expression)
                yield table if needed is wanted else table.select(wanted)

        yield from limited(decoded(), limit)


def _writer_value(sequence: int, last_ms: int | None) -> bytes:
    return _INT.pack(sequence) if last_ms is None else _WRITER_STATE.pack(sequence, last_ms)


def merger_for_overwrite(descriptor: TableDescriptor):
    """A last-row merger regardless of the table's engine: overwrite mode restores rows as given."""
    from flightstore.kv.merge.last_row import LastRowMerger
    return LastRowMerger(descriptor)
