"""The lake's own upkeep: expiring old snapshots and deleting the files nothing references any more.

Every tiering round commits a snapshot, so without upkeep a lake table's metadata (snapshot list,
manifest lists, manifests) and the data and delete files only old snapshots reference grow
forever. The server's tierer runs :func:`upkeep` on a table after a successful round, under the
table's lease, at most once per ``datalake.maintenance.interval``:

1. **Snapshot expiry** (:func:`expire_snapshots`): snapshots older than
   ``table.datalake.snapshot.retention`` are removed from the table's metadata (pyiceberg's
   ``expire_snapshots``), except the newest ``table.datalake.snapshot.num-retained`` ones, branch
   and tag heads, and every snapshot from the current one back to the newest tiering snapshot (the
   offsets every round and union read resume from are read by walking that chain). pyiceberg only
   drops metadata, so the files the expired snapshots referenced and no live snapshot does (their
   manifest lists, manifests, data and delete files) are deleted here, as Iceberg's expiry does.
2. **Orphan files** (:func:`remove_orphans`): files under the table's location that no live
   snapshot and no retained metadata file references - data files of a round that died before its
   commit, metadata files past ``write.metadata.previous-versions-max`` - older than
   ``table.datalake.orphan-files.older-than`` (a grace period: a round writing right now is never
   hit) are deleted.

Only files under the table's own location are ever deleted, and never one that any live snapshot
of any catalog table sharing that location references: a table dropped and created again keeps
its old lake table, renamed ``<table>__replaced_<id>``, at the same location. The recorded
checksums of deleted files (:mod:`flightstore.lake.integrity`) are dropped with them.

A read planned on a snapshot that expires meanwhile fails with
:class:`~flightstore.errors.LakeFileMissing` (a union read plans again on the current snapshot
when it has returned nothing yet), never with a short answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow.fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from flightstore.lake.catalog import lake_failures
from flightstore.lake.integrity import ChecksumStore
from flightstore.lake.offsets import snapshot_offsets

__all__ = ["UpkeepResult", "expirable", "expire_snapshots", "referenced_files", "remove_orphans", "upkeep"]


@dataclass(frozen=True)
class UpkeepResult:
    """What one upkeep of a lake table did: snapshots expired, files of expired snapshots deleted,
    orphan files deleted (full locations), when it ran (wall-clock ms)."""

    ran_at_ms: int
    expired_snapshots: tuple[int, ...] = ()
    files_removed: tuple[str, ...] = ()
    orphans_removed: tuple[str, ...] = field(default=())


def expirable(metadata: TableMetadata, now_ms: int, max_age_ms: int, num_retained: int) -> list[int]:
    """The ids of the snapshots of ``metadata`` to expire: older than ``max_age_ms`` at ``now_ms``,
    not among the newest ``num_retained``, not a branch or tag head, not on the chain from the
    current snapshot back to the newest tiering snapshot."""
    snapshots = sorted(metadata.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0),
                       reverse=True)
    keep = {s.snapshot_id for s in snapshots[:max(1, num_retained)]}
    keep |= {ref.snapshot_id for ref in metadata.refs.values()}
    for ancestor in ancestors_of(metadata.snapshot_by_id(metadata.current_snapshot_id)
                                 if metadata.current_snapshot_id is not None else None, metadata):
        keep.add(ancestor.snapshot_id)
        if snapshot_offsets(ancestor) is not None:
            break  # the newest tiering snapshot: what committed_offsets reads
    cutoff = now_ms - max_age_ms
    return [s.snapshot_id for s in snapshots if s.timestamp_ms < cutoff and s.snapshot_id not in keep]


def _path(io: PyArrowFileIO, location: str) -> str:
    """``location`` as a path of its file system (what listing it returns)."""
    return io.parse_location(location, io.properties)[2]


def referenced_files(lake_table: IcebergTable, snapshots: Iterable[Snapshot] | None = None, *,
                     deleted: bool = False) -> set[str]:
    """Paths (in their file system) of every file ``snapshots`` (default: every live snapshot of the
    table) reference: manifest lists, manifests, data and delete files (with ``deleted``, also the
    files their manifests record as deleted: no read of those snapshots opens them). With the
    default, also the table's current and logged metadata files and statistics files."""
    io = lake_table.io
    metadata = lake_table.metadata
    files: set[str] = set()
    if snapshots is None:
        snapshots = metadata.snapshots
        files.add(_path(io, lake_table.metadata_location))
        files.update(_path(io, entry.metadata_file) for entry in metadata.metadata_log)
        files.update(_path(io, s.statistics_path) for s in metadata.statistics)
        files.update(_path(io, s.statistics_path) for s in metadata.partition_statistics)
    seen: set[str] = set()
    for snapshot in snapshots:
        files.add(_path(io, snapshot.manifest_list))
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            files.add(_path(io, manifest.manifest_path))
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=not deleted):
                files.add(_path(io, entry.data_file.file_path))
    return files


class _Live:
    """What the live snapshots of a lake table reference, read only as far as a question needs:
    first what the table metadata names (metadata files, manifest lists: no file read), then the
    current snapshot's manifests, and only for paths still unexplained every live snapshot's (a log
    table's files are all in its current snapshot; walking every manifest list of a table with
    thousands of snapshots is what this spares)."""

    def __init__(self, lake_table: IcebergTable) -> None:
        io, metadata = lake_table.io, lake_table.metadata
        self.table = lake_table
        self.named = {_path(io, lake_table.metadata_location)}
        self.named.update(_path(io, entry.metadata_file) for entry in metadata.metadata_log)
        self.named.update(_path(io, s.statistics_path) for s in metadata.statistics)
        self.named.update(_path(io, s.statistics_path) for s in metadata.partition_statistics)
        self.named.update(_path(io, s.manifest_list) for s in metadata.snapshots)

    def unreferenced(self, paths: set[str]) -> set[str]:
        """Those of ``paths`` no live snapshot and no retained metadata file references."""
        left = paths - self.named
        # Metadata files and manifest lists are named by the metadata alone (the spec's names).
        decided = {p for p in left if p.endswith(".metadata.json")
                   or ("/metadata/snap-" in p and p.endswith(".avro"))}
        left -= decided
        current = self.table.current_snapshot()
        if left and current is not None:
            left -= referenced_files(self.table, [current])
        if left:
            left -= referenced_files(self.table)
        return decided | left


def _under(io: PyArrowFileIO, lake_table: IcebergTable) -> tuple[pafs.FileSystem, str]:
    """The file system of the table's location and that location as its path, ending in '/'."""
    scheme, netloc, path = io.parse_location(lake_table.location(), io.properties)
    return io.fs_by_scheme(scheme, netloc), path.rstrip("/") + "/"


def _delete(fs: pafs.FileSystem, root: str, paths: Iterable[str]) -> list[str]:
    """Delete ``paths`` that lie under ``root``; returns those deleted (a file gone already is
    skipped: a second upkeep racing this one)."""
    deleted = []
    for path in sorted(paths):
        if not path.startswith(root) or ".." in path[len(root):].split("/"):
            continue  # never outside the table's own location
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            continue
        deleted.append(path)
    return deleted


def expire_snapshots(lake_table: IcebergTable, now_ms: int, max_age_ms: int, num_retained: int
                     ) -> tuple[IcebergTable, list[int], list[str]]:
    """Expire what :func:`expirable` says, then delete the files only the expired snapshots
    referenced. Returns the refreshed table, the expired ids, the deleted files."""
    what = f"expiring snapshots of the lake table {'.'.join(lake_table.name())}"
    with lake_failures(what):
        lake_table = lake_table.refresh()
        ids = expirable(lake_table.metadata, now_ms, max_age_ms, num_retained)
        if not ids:
            return lake_table, [], []
        expired = [lake_table.metadata.snapshot_by_id(i) for i in ids]
        lake_table.maintenance.expire_snapshots().by_ids(ids).commit()
        lake_table = lake_table.refresh()
        io = lake_table.io
        gone = _Live(lake_table).unreferenced(referenced_files(lake_table, expired, deleted=True))
        fs, root = _under(io, lake_table)
        return lake_table, ids, _delete(fs, root, gone)


def _sharing(lake_table: IcebergTable) -> list[IcebergTable]:
    """The replaced incarnations of the table (``<table>__replaced_<id>``, see
    :meth:`~flightstore.lake.catalog.LakeCatalog.ensure_table`) at its location."""
    catalog = lake_table.catalog
    namespace, name = lake_table.name()[0], lake_table.name()[-1]
    others = []
    for identifier in catalog.list_tables(namespace):
        if not identifier[-1].startswith(f"{name}__replaced_"):
            continue
        other = catalog.load_table(identifier)
        if other.location().rstrip("/") == lake_table.location().rstrip("/"):
            others.append(other)
    return others


def remove_orphans(lake_table: IcebergTable, older_than_ms: int, now_ms: int | None = None) -> list[str]:
    """Delete the files under the table's location that no live snapshot or retained metadata
    file of it (or of a table sharing its location) references and that were last modified more
    than ``older_than_ms`` ago. Returns the deleted paths."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    with lake_failures(f"removing orphan files of the lake table {'.'.join(lake_table.name())}"):
        io = lake_table.io
        fs, root = _under(io, lake_table)
        cutoff = now - older_than_ms
        listed = fs.get_file_info(pafs.FileSelector(root.rstrip("/"), recursive=True, allow_not_found=True))
        old = [info.path for info in listed if info.type == pafs.FileType.File and info.mtime is not None
               and info.mtime.timestamp() * 1000 < cutoff]
        if not old:
            return []
        orphans = set(old)
        for table in [lake_table, *_sharing(lake_table)]:
            orphans = _Live(table).unreferenced(orphans)
        return _delete(fs, root, orphans)


def upkeep(lake_table: IcebergTable, *, max_age_ms: int, num_retained: int, orphans_older_than_ms: int,
           now_ms: int | None = None) -> UpkeepResult:
    """Expire snapshots, then remove orphan files, of ``lake_table`` (see the module docstring)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    lake_table, expired, removed = expire_snapshots(lake_table, now, max_age_ms, num_retained)
    orphans = remove_orphans(lake_table, orphans_older_than_ms, now)
    store = ChecksumStore.of(lake_table)  # the checks of deleted files go with them
    if store is not None and (removed or orphans):
        store.forget([*removed, *orphans])
    return UpkeepResult(now, tuple(expired), tuple(removed), tuple(orphans))
