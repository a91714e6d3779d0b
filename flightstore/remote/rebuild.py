"""Rebuilding a bucket from remote storage into an empty local directory.

:func:`rebuild_bucket` is pure storage (no cluster code): given remote storage, the table's
descriptor, the partition, the bucket and an empty bucket directory, it lays out what the bucket's
tablets open from:

* ``snapshots/<id>/``: the newest uploaded KV snapshot (primary-key tables), every file checked
  against its checksum, and ``kv/`` restored from its checkpoint (at the snapshot's offset ``S``);
* ``log/``: the log's schema epochs and an empty segment starting at ``E``, the end of the last
  uploaded segment, so the log continues there and reads every offset below it from the uploaded
  segments (through the bucket's :class:`~flightstore.remote.bucket.RemoteBucket`, which must be
  attached when the log opens). When ``S > E`` (the snapshot covers changes whose segment was never
  uploaded), offsets ``[E, S)`` are recorded as lost (a hole: reading them is DataLoss, never a
  short answer) and the log continues at ``S``.

The bucket is rebuilt up to ``max(E, S)``, the offset returned with what was restored and logged:
never silent. A primary-key table with no uploaded snapshot is rebuilt only when the uploaded log
starts at offset 0 (its KV is then replayed from the whole log when the bucket opens); otherwise
the rows before the log's start are gone and :class:`~flightstore.errors.DataLoss` says so.
Remote segments are not downloaded here: reads fetch them when they need them (and find a missing
one then, as DataLoss naming it).

:func:`restore_missing_bucket` is what a table opening on a server with remote storage does for a
bucket directory that does not exist: rebuild it when remote storage holds anything of it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from flightstore.errors import DataLoss, InvalidInput
from flightstore.kv.snapshot import KvSnapshots
from flightstore.log.index import fsync_directory
from flightstore.log.schemas import EPOCHS_FILE
from flightstore.log.segment import Segment
from flightstore.partitioning import Partition
from flightstore.remote.bucket import MARKER, RemoteBucket, write_marker
from flightstore.remote.manifest import SnapshotEntry
from flightstore.remote.storage import RemoteStorage
from flightstore.schema import TableDescriptor

__all__ = ["RebuiltBucket", "rebuild_bucket", "restore_missing_bucket"]

log = logging.getLogger("flightstore.remote")


@dataclass(frozen=True)
class RebuiltBucket:
    """What :func:`rebuild_bucket` restored.

    ``offset``: the bucket holds every change below it (it continues there); ``log_start`` ..
    ``log_end``: the offsets the uploaded segments hold (``segments`` of them); ``from_snapshot``
    and ``snapshot_id``: the KV snapshot restored (None for a log table or without one);
    ``lost``: changelog offsets ``[start, end)`` that are nowhere (the KV snapshot covers them).
    """

    offset: int
    log_start: int
    log_end: int
    segments: int
    from_snapshot: int | None = None
    snapshot_id: int | None = None
    lost: tuple[int, int] | None = None


def rebuild_bucket(remote: RemoteStorage, descriptor: TableDescriptor, partition: Partition | None,
                   bucket: int, directory: str | os.PathLike, *, table_id: str,
                   fsync: bool = True) -> RebuiltBucket:
    """Rebuild bucket ``bucket`` (of ``partition``, for a partitioned table) of the table with id
    ``table_id`` (its local directory's name) from ``remote`` into ``directory``, which must be
    empty or absent (:class:`InvalidInput` otherwise, nothing changed). See the module doc."""
    label = f"table {descriptor.path} bucket {bucket}"
    table = remote.table(descriptor, table_id)
    if partition is not None:
        table = table.partition(partition.id)
        label = f"table {descriptor.path} partition {partition.name} bucket {bucket}"
    return _rebuild(table.bucket(bucket, label), descriptor, Path(directory), fsync)


def restore_missing_bucket(remote: RemoteBucket, descriptor: TableDescriptor,
                           directory: Path, *, fsync: bool = True) -> RebuiltBucket | None:
    """Rebuild ``directory`` from ``remote`` when it does not exist and remote storage holds
    something of the bucket (a lost bucket directory); None otherwise (a new bucket)."""
    if directory.exists() or not remote.stored():
        return None
    log.warning("%s: the bucket directory %s is missing and remote storage holds the bucket; "
                "rebuilding it from there", remote.label, directory)
    return _rebuild(remote, descriptor, directory, fsync)


def _rebuild(remote: RemoteBucket, descriptor: TableDescriptor, directory: Path,
             fsync: bool) -> RebuiltBucket:
    if directory.exists() and any(directory.iterdir()):
        raise InvalidInput(f"{remote.label}: cannot rebuild into {directory}: it is not empty")
    manifest = remote.log_manifest()
    log_end = manifest.end_offset or 0
    chain = manifest.chain(log_end)
    log_start = chain[0].base_offset if chain else log_end
    snapshot = remote.kv_manifest().newest if descriptor.has_primary_key else None
    if descriptor.has_primary_key and snapshot is None and log_start > 0:
        raise DataLoss(f"{remote.label}: remote storage holds no KV snapshot and its log starts at "
                       f"offset {log_start}: the rows changed before it cannot be rebuilt")
    offset = max(log_end, snapshot.offset if snapshot is not None else 0)
    lost = (log_end, offset) if offset > log_end else None
    # Built aside and renamed into place: a crash meanwhile leaves no half bucket (the directory
    # is still missing, so the next open rebuilds it again).
    staging = directory.with_name(f".{directory.name}.rebuild")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        if snapshot is not None:
            _restore_snapshot(remote, descriptor, snapshot, staging, fsync)
        _lay_out_log(staging / "log", manifest.schema_epochs, log_end, offset, remote.label, fsync)
        write_marker(staging / MARKER, {"log": manifest.version, "kv": remote.kv_manifest().version})
        if directory.exists():
            directory.rmdir()  # empty (checked above)
        os.rename(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if fsync:
        fsync_directory(directory.parent)
    rebuilt = RebuiltBucket(offset, log_start, log_end, len(chain),
                            None if snapshot is None else snapshot.offset,
                            None if snapshot is None else snapshot.id, lost)
    log.warning("%s: rebuilt from remote storage %s up to offset %d: log offsets %d..%d in %d "
                "remote segment(s)%s%s", remote.label, remote.storage.uri_of(remote.path), offset,
                log_start, log_end - 1, len(chain),
                "" if snapshot is None else f", KV snapshot {snapshot.id} at offset {snapshot.offset}",
                "" if lost is None else f"; changelog offsets {lost[0]}..{lost[1] - 1} were never "
                "uploaded and are lost (the KV snapshot holds their effect)")
    return rebuilt


def _restore_snapshot(remote: RemoteBucket, descriptor: TableDescriptor, entry: SnapshotEntry,
                      directory: Path, fsync: bool) -> None:
    """Download ``entry`` into ``directory/snapshots/<id>/`` (checked), then restore ``kv/``."""
    snapshots_dir = directory / "snapshots"
    final = snapshots_dir / f"{entry.id:020d}"
    staging = snapshots_dir / f"{entry.id:020d}.download"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    folder = f"{remote.path}/{entry.folder}"
    where = f"{remote.label}: remote KV snapshot {remote.storage.uri_of(folder)}"
    try:
        for file in entry.files:
            remote.storage.get_file(f"{folder}/{file.name}", staging / file.name, file, where)
    except FileNotFoundError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise DataLoss(f"{where} is incomplete in remote storage ({exc})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    staging.rename(final)
    snapshots = KvSnapshots(snapshots_dir, descriptor.option("kv.snapshot.num-retained"), fsync=fsync)
    restored = [s for s in snapshots.list() if s.id == entry.id]
    if not restored or restored[0].offset != entry.offset:
        raise DataLoss(f"{where} does not open as a KV snapshot at offset {entry.offset}")
    snapshots.restore(restored[0], directory / "kv")


def _lay_out_log(log_dir: Path, epochs, log_end: int, offset: int, label: str, fsync: bool) -> None:
    """An empty log continuing at ``offset``, whose offsets ``[log_end, offset)`` are a hole."""
    log_dir.mkdir(parents=True, exist_ok=True)
    if epochs is not None:
        with open(log_dir / EPOCHS_FILE, "w", encoding="utf-8") as handle:
            json.dump([list(e) for e in epochs], handle)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
    if offset == 0:
        return  # the log opens empty at 0
    Segment.create(log_dir, log_end, label, fsync)
    if offset > log_end:
        segment = Segment.open_active(log_dir, log_end, label, fsync)
        segment.skip_to(offset)
        segment.checkpoint(fsync)
        segment.close()
