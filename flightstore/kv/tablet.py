"""One bucket of a primary-key table: RocksDB rows kept equal to the fold of the bucket's changelog.

Writes go through two steps (:mod:`flightstore.kv.writes`, mixed in here): :meth:`KvTablet.prepare`
merges a write against the stored rows and derives its changelog, changing nothing (every
value-dependent failure happens there), and :meth:`KvTablet.commit` appends that changelog to the
bucket's log, then writes the rows, the applied log offset, the row count and the writer's batch
sequence to RocksDB in ONE WriteBatch. What the bucket keeps besides rows is in :mod:`.meta`.

A crash (or a failed RocksDB write) between the log append and the WriteBatch is repaired by
:meth:`recover` (run on open, and by :meth:`catch_up` before the next write), which replays the
changelog after the applied offset. :meth:`snapshot` takes a KV snapshot
(:mod:`flightstore.kv.snapshot`); a missing, unopenable or hopelessly stale KV directory is rebuilt
on open from the newest usable snapshot plus the log after it (or from the whole log while it
starts at offset 0), with a log line saying so; :meth:`rebuild` does the same on request.

Opening a bucket whose KV needs nothing (its applied offset is the log's end, its values carry
schema versions) reads the meta column family with a read-only RocksDB open
(:func:`~flightstore.kv.meta.read_meta`) and opens RocksDB for writing only when rows are read or
written (a lookup, a scan, a write, a replay, a checkpoint, a meta write): a read-write open costs
about seven fsyncs and a new MANIFEST, and a table opened for its figures (the console's table
page, ``COUNT(*)``, offsets, writer state) or scanned from its KV snapshot images never needs one.
The deferred open is the same open, run later under the tablet lock, so it restores or rebuilds
exactly as an open would; nothing writes RocksDB before it.

Reads (point lookups, prefix lookups, scans and key ranges) go through :mod:`flightstore.kv.scan`:
chunked, from one RocksDB snapshot, decoded with the vectorized row codec, and checked so that a
corrupt file is a :class:`~flightstore.errors.DataLoss` naming the table and bucket, never a short
answer. :meth:`full_scan` reads the newest KV snapshot image plus the changelog instead when one
serves (:mod:`flightstore.kv.snapshot_read`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import shutil
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
from rocksdict import BlockBasedOptions, Checkpoint, Options, Rdict, WriteBatch

from flightstore import memory
from flightstore.batches import limited
from flightstore.errors import CorruptData, DataLoss, FlightstoreError, NotLeader
from flightstore.expressions import Predicate
from flightstore.kv.encoding import encode_keys
from flightstore.kv.merge import merger_for
from flightstore.kv.meta import (
    _APPLIED,
    _INT,
    _ROWS,
    _VALUE_FORMAT,
    _WRITER,
    _WRITER_STATE,
    UNDO_FENCE_PREFIX,
    WRITER_META_PREFIXES,
    read_meta,
    writer_value,
)
from flightstore.kv.ranges import KeyRange, encode_range, prefix_successor
from flightstore.kv.scan import (
    FIRST_CHUNK_ROWS,
    RangeReader,
    data_loss,
    is_rocksdb_error,
    prefix_values,
    storage_errors,
)
from flightstore.kv.snapshot import KvSnapshots, SnapshotInfo
from flightstore.kv.snapshot_read import TailTooLong, read_at
from flightstore.kv.versions import VersionedRowCodec
from flightstore.kv.writes import ApplyResult, KvWrites, PreparedWrite, changelog_schema
from flightstore.log import LogTablet
from flightstore.log.held import require_held
from flightstore.schema import TableDescriptor

__all__ = ["UNDO_FENCE_PREFIX", "WRITER_META_PREFIXES", "ApplyResult", "KvTablet", "PreparedWrite",
           "changelog_schema"]  # the write path's names are re-exported from kv/writes.py

log = logging.getLogger("flightstore.kv")

LOOKUP_CHUNK_KEYS = 4096  # keys per multi-get of a lookup (its rows are checked against the budget)
_FOUND, _NOT_FOUND = np.ones(1, bool), np.zeros(1, bool)  # found masks of one key (read-only)
_FOUND.setflags(write=False)
_NOT_FOUND.setflags(write=False)


class KvTablet(KvWrites):
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
        # True while RocksDB is not open yet and _meta is a read-only copy (see the module
        # docstring); cleared under the lock by the deferred open (or by close).
        self._deferred = False
        self._open_failure: BaseException | None = None  # what the deferred open raised
        if not self._defer():
            self._open()

    def _defer(self) -> bool:
        """Leave RocksDB closed when a read-only look shows the open would change nothing: the
        values carry schema versions and the applied offset is the log's end (no replay, no
        restore). Its meta column family answers meanwhile."""
        meta = read_meta(self.directory)
        if meta is None or meta.get(_VALUE_FORMAT) is None:
            return False
        raw = meta.get(_APPLIED)
        if (0 if raw is None else _INT.unpack(raw)[0]) != self.log.end_offset:
            return False
        self._meta, self._deferred, self.recovered_from = meta, True, "kv"
        return True

    def _open(self) -> None:
        """Open RocksDB for writing, restoring or rebuilding it when it cannot serve, and replay
        the log after its applied offset."""
        self.recovered_from = self._open_or_restore()
        self._upgrade_values()
        self._recover()

    def _open_now(self) -> None:
        """Open a deferred KV for writing. Every RocksDB read or write of rows calls this first
        when ``_db`` is None (callers on hot paths check that attribute themselves); a closed KV
        raises, and so does every call after a deferred open that failed (its error again)."""
        if self._db is not None:
            return
        with self._lock:
            if self._deferred:
                try:
                    self._open()
                except BaseException as exc:
                    self._open_failure = exc
                    raise
                finally:
                    self._deferred = False
            if self._db is None:
                if self._open_failure is not None:
                    raise self._open_failure
                raise FlightstoreError(f"{self.where}: the KV is closed")

    @property
    def opened(self) -> bool:
        """Whether RocksDB is open for writing (False while deferred, see the module docstring)."""
        return self._db is not None

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
            self._open_now()
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
                write.put(key, writer_value(sequence, last_ms), self._meta_cf)
            self._db.write(write)

    def drop_writers(self, writer_ids: Sequence[str]) -> None:
        """Forget expired writers: every meta key they keep (sequence, undo fence), in one write."""
        self.write_meta({prefix + w.encode(): None for w in writer_ids for prefix in WRITER_META_PREFIXES})

    def close(self) -> None:
        """Close RocksDB. A RocksDB error while closing (it reports a corrupt file it met again)
        is logged, not raised: the store must still release every other table."""
        with self._lock:
            self.snapshots.release_images()
            if self._deferred and self._db is None:  # nothing open: the read-only copy goes
                del self._meta
            self._deferred = False
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
                if self._db is None and not self._deferred:
                    raise FlightstoreError(f"{self.name}: the KV is closed")
                applied = self.applied_offset
                newest = self.snapshots.newest
                if not force and (applied == 0 or (newest is not None and newest.offset == applied)):
                    return None
                if self.log.replicated and applied > 0 and not self.log.wait_for(
                        applied - 1, self.log.commit_timeout_s):
                    return None  # a snapshot holds committed changes only: the next round tries again
                self._open_now()
                Checkpoint(self._db).create_checkpoint(str(path))
                return applied, self.row_count

        return self.snapshots.create(checkpoint, self.codec, self.primary_key,
                                     self.descriptor.statistics_columns, stop=stop)

    def _multi_get(self, keys: list[bytes] | np.ndarray, columns: Sequence[str] | None = None
                   ) -> tuple[np.ndarray, pa.Table]:
        """One RocksDB multi-get of encoded ``keys``: (found mask, decoded rows of the found ones).
        A RocksDB error (a corrupt block...) is DataLoss naming the table and bucket."""
        if self._db is None:
            self._open_now()
        keys = keys if isinstance(keys, list) else keys.tolist()
        if len(keys) == 1:  # a point lookup: one get, no multi-get set-up
            with storage_errors(self.where, "RocksDB read failed", str(self.directory)):
                value = self._db.get(keys[0])
            if value is None:
                return _NOT_FOUND, self.codec.decode([], columns)
            return _FOUND, self.codec.decode([value], columns)
        values = self._get_many(keys)
        if len(values) <= 16:  # point lookups: a few Python checks beat building an array
            found = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
            return found, self.codec.decode([v for v in values if v is not None], columns)
        array = pa.array(values, pa.large_binary())
        found = array.is_valid().to_numpy(zero_copy_only=False)
        return found, self.codec.decode(array.drop_null() if array.null_count else array, columns)

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
        A deferred KV opens for writing only when there is something to replay.
        """
        with self._lock:
            if self._deferred and self.applied_offset < self.log.end_offset:
                self._open_now()  # (its open replays the log)
            return self._recover(uncommitted)

    def _recover(self, uncommitted: bool = False) -> int:
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
        keys, (puts, values), removed, delta = self._changes(batch)
        write = WriteBatch(raw_mode=True)
        collections.deque(map(write.put, keys[puts], values), maxlen=0)
        collections.deque(map(write.delete, keys[removed]), maxlen=0)
        write.put(_APPLIED, _INT.pack(record.next_offset), self._meta_cf)
        write.put(_ROWS, _INT.pack(self.row_count + delta), self._meta_cf)
        if record.writer_id is not None and record.sequence is not None:
            write.put(_WRITER + record.writer_id.encode(),
                      writer_value(record.sequence, record.timestamp_ms), self._meta_cf)
        self._db.write(write)
        return batch.num_rows

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold reads off while the log under this KV is cut and the KV rebuilt (a follower's
        truncation): a read starts by noting the log's truncation count under this lock, so it
        either sees the KV after the rebuild or finds the count changed (:meth:`_committed`)."""
        with self._lock:
            yield

    def rebuild(self) -> int:
        """Throw the RocksDB state away and rebuild it from the newest usable snapshot and the log
        after it (the whole log while it starts at 0); returns the log rows replayed."""
        with self._lock:
            self.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            self.recovered_from = self._restore("was thrown away on request")
            self._upgrade_values()
            return self._recover()

    # ---- reads --------------------------------------------------------------------------------
    def lookup(self, keys: pa.Table, columns: Sequence[str] | None = None) -> tuple[np.ndarray, pa.Table]:
        """Rows of ``keys`` (PK columns): (found mask, rows of the found keys). One multi-get per
        :data:`LOOKUP_CHUNK_KEYS` keys (fewer when rows are wide: within
        :func:`flightstore.memory.batch_bytes`); a lookup whose rows pass what a query may hold
        (:func:`flightstore.memory.work_bytes`) is refused with ResourceExhausted. On a replicated
        leader it returns once what it read is committed (:meth:`_committed`)."""
        encoded = encode_keys(keys, self.primary_key)
        if len(encoded) == 1:  # a point lookup
            rows = self.lookup_key(encoded[0], columns)
            return (_FOUND if rows.num_rows else _NOT_FOUND), rows
        with self._lock:  # not while a truncation cuts the log and rebuilds this KV (see exclusive)
            cuts = self.log.truncations
        step = memory.batch_rows(self.schema, LOOKUP_CHUNK_KEYS)
        if len(encoded) <= step:
            found, rows = self._multi_get(encoded, columns)
            memory.require(rows.nbytes, f"{self.where}: a lookup of {len(encoded)} keys")
        else:
            masks, parts, held = [], [], 0
            for start in range(0, len(encoded), step):
                part_found, part_rows = self._multi_get(encoded[start:start + step], columns)
                held += part_rows.nbytes
                memory.require(held, f"{self.where}: a lookup of {len(encoded)} keys")
                masks.append(part_found)
                parts.append(part_rows)
            found, rows = np.concatenate(masks), pa.concat_tables(parts)
        self._committed(cuts)
        return found, rows

    def stored_values(self, keys: list[bytes]) -> list[bytes | None]:
        """The stored values of encoded primary ``keys`` (None for a missing key), undecoded: one
        multi-get, with :meth:`lookup`'s checks (commit, DataLoss for a RocksDB failure), for a
        table that reads several buckets and decodes all their values at once (a row codec's
        fixed cost per call dwarfs its cost per row in a lookup of a few hundred keys)."""
        with self._lock:  # not while a truncation cuts the log and rebuilds this KV (see exclusive)
            cuts = self.log.truncations
        if self._db is None:
            self._open_now()
        values = self._get_many(keys)
        self._committed(cuts)
        return values

    def _get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """One RocksDB multi-get of encoded ``keys`` (the KV open); a RocksDB error is DataLoss."""
        with storage_errors(self.where, "RocksDB read failed", str(self.directory)):
            return self._db.get(keys) if keys else []

    def lookup_key(self, key: bytes, columns: Sequence[str] | None = None) -> pa.Table:
        """The row of one encoded primary key (:func:`~flightstore.kv.encoding.encode_keys`):
        a table of ``columns`` with that row, or none. :meth:`lookup` of one key, without a key
        table to encode: one get (:meth:`stored_value`, with its checks and errors), the row's
        buffers its own."""
        value = self.stored_value(key)
        if value is None:
            return self.codec.decode([], columns)
        return self.codec.decode_value(value, columns)

    def stored_value(self, key: bytes) -> bytes | None:
        """The stored value of one encoded primary ``key`` (None: no such row), undecoded, with
        :meth:`lookup_key`'s checks (memory, commit) and errors (DataLoss for a RocksDB failure):
        for a caller that writes the row's answer from the value's bytes
        (:mod:`flightstore.kv.row_message`)."""
        with self._lock:  # not while a truncation cuts the log and rebuilds this KV (see exclusive)
            cuts = self.log.truncations
        if self._db is None:
            self._open_now()
        try:
            value = self._db.get(key)
        except Exception as exc:  # noqa: BLE001 - storage_errors' contract, without its generator
            if not is_rocksdb_error(exc):
                raise
            raise data_loss(self.where, "RocksDB read failed", exc, str(self.directory)) from None
        if value is not None:
            memory.require(len(value), f"{self.where}: a lookup of 1 key")
        self._committed(cuts)
        return value

    def committed_row_count(self) -> int:
        """:attr:`row_count` once the changes it counts are committed (see :meth:`_committed`)."""
        with self._lock:
            cuts = self.log.truncations
            count = self.row_count
        self._committed(cuts)
        return count

    def _committed(self, cuts: int) -> None:
        """Return once what a read just saw is committed: a replicated leader's RocksDB may hold
        changes its in-sync replicas do not have yet; they are at most what its log holds, so the
        read waits (normally one replication round trip) until the high watermark covers the log
        end read *after* the data. Never an uncommitted row: NotEnoughReplicas past the timeout,
        NotLeader when the log was cut since the read began (``cuts``: its
        :attr:`~flightstore.log.LogTablet.truncations` then): this server was deposed, and what
        the read saw may be gone although the high watermark passes its offsets."""
        log_ = self.log
        if log_.replicated:
            log_.await_committed(log_.end_offset)
            if log_.truncations != cuts:
                raise NotLeader(f"{self.name}: this server stopped leading the bucket during the read (its "
                                "log was cut to follow a new leader); retry at the leader")

    def prefix_lookup(self, prefixes: Sequence[bytes], columns: Sequence[str] | None = None,
                      limit: int | None = None) -> pa.Table:
        """Rows whose encoded key starts with one of ``prefixes``, in key order per prefix."""
        if limit is None:
            return self.prefix_rows(prefixes, columns)[0]
        wanted = list(columns) if columns is not None else self.schema.names
        parts = []
        remaining = limit
        held = 0
        with self._lock:
            cuts = self.log.truncations
        for prefix in prefixes:
            for table in self._read(prefix, prefix_successor(prefix), wanted, None, remaining):
                parts.append(table)
                held += table.nbytes
                memory.require(held, f"{self.where}: a prefix lookup")  # its answer is held whole
                remaining -= table.num_rows
            if remaining <= 0:
                break
        self._committed(cuts)
        if not parts:
            return self.codec.decode([], wanted)
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def prefix_rows(self, prefixes: Sequence[bytes], columns: Sequence[str] | None = None
                    ) -> tuple[pa.Table, np.ndarray]:
        """Every row of each of ``prefixes`` (prefix order, key order within a prefix), read from
        one RocksDB snapshot and decoded at once, and how many rows each prefix has."""
        wanted = list(columns) if columns is not None else self.schema.names
        if self._db is None:
            self._open_now()
        with self._lock:
            cuts = self.log.truncations
            snapshot = self._db.snapshot()
        self._committed(cuts)
        values, counts = prefix_values(
            snapshot, prefixes, where=self.where, directory=str(self.directory),
            held_at_most=lambda held: memory.require(held, f"{self.where}: a prefix lookup"))
        with self._io_lock:
            self._io["rows_read"] += len(values)
            self._io["chunks_read"] += 1
        table = self.codec.decode(values, wanted)
        self._committed(cuts)
        return table, np.asarray(counts, dtype=np.int64)

    def full_scan(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
                  limit: int | None = None, *, exact: bool = True) -> Iterator[pa.RecordBatch]:
        """Every current row, filtered exactly, at most ``limit``, consistent at the log end when
        called: the newest snapshot image plus the changelog after it, or without a usable image
        the whole changelog while the log still holds it from offset 0 with no lost range (the
        image of offset 0 is empty), folded vectorized (:mod:`flightstore.kv.snapshot_read`):
        columnar reads, no RocksDB iteration, whatever the snapshot state. RocksDB (:meth:`scan`)
        answers when neither serves, when the changelog cannot be read, or when folding the
        changes (updates and deletes; inserts cost nothing) would hold more memory than a query
        may (:func:`flightstore.memory.work_bytes`): RocksDB is read in bounded chunks (the next
        KV snapshot makes the tail short again).

        Rows come image batches first (key order), then the changed rows; ``exact=False`` is for
        analytic callers that apply ``filter`` again: rows come unfiltered (batches are still
        skipped by statistics)."""
        snapshot = self.snapshots.newest
        at = self.log.high_watermark
        wanted = columns or self.schema.names
        try:  # read_at reads the changelog part before it returns: damage found there is found here
            if snapshot is not None and snapshot.offset >= self.log.local_start_offset:  # its tail is on local disk
                image = self.snapshots.image(snapshot, self.schema)
                if image is not None:
                    return read_at(image, snapshot.offset, self.log, at, self.primary_key, wanted, filter,
                                   limit, where=self.name, exact=exact, max_bytes=memory.work_bytes())
            if self._replayable():
                return read_at(None, 0, self.log, at, self.primary_key, wanted, filter, limit,
                               where=self.name, exact=exact, max_bytes=memory.work_bytes())
        except TailTooLong as reason:
            log.info("%s: %s; scanning RocksDB instead", self.name, reason)
        except (DataLoss, CorruptData) as error:
            # RocksDB holds the current rows whatever the changelog lost: answer from it.
            log.warning("%s: the changelog cannot be read (%s); scanning RocksDB instead", self.name, error)
        return self.scan(columns, filter, limit)

    def _replayable(self) -> bool:
        """Whether the whole changelog (from offset 0) is held on local disk, with no lost range."""
        log_ = self.log
        return log_.local_start_offset == 0 and log_.lost_rows == 0 and not log_.damage()

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
        self._open_now()
        with self._lock:  # the snapshot and the row count that goes with it
            cuts = self.log.truncations
            snapshot = self._db.snapshot()
            expected = self.row_count if lower is None and upper is None else None
        self._committed(cuts)
        reader = RangeReader(snapshot, lower, upper, where=self.where, directory=str(self.directory),
                             expected_rows=expected)

        def decoded() -> Iterator[pa.Table]:
            # With a LIMIT the first chunk is just big enough; chunks grow when the filter drops rows
            # (never past the batch bytes: wide rows make short chunks).
            first = memory.batch_rows(self.schema, FIRST_CHUNK_ROWS if limit is None else limit)
            for values in reader.chunks(first):
                with self._io_lock:
                    self._io["rows_read"] += len(values)
                    self._io["chunks_read"] += 1
                table = self.codec.decode(values, needed)
                if expression is not None:
                    table = table.filter(expression)
                yield table if needed is wanted else table.select(wanted)

        yield from limited(decoded(), limit)
