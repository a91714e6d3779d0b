"""``flightstore verify`` for the lake: every data and delete file any live snapshot references, checked.

Each file is read through and compared with the size its manifest entry records and the CRC-32
recorded when it was written (:mod:`flightstore.lake.integrity`). A file that is missing,
truncated or corrupt is an error naming it (the union read may still answer its rows from the log,
but the lake table is damaged for every engine that reads it); a file without a recorded CRC
(written before checksums were recorded) is checked by size, and noted.
"""

from __future__ import annotations

from collections.abc import Iterator

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table as IcebergTable

from flightstore.errors import FlightstoreError, TableNotFound
from flightstore.lake.catalog import LakeCatalog, lake_failures
from flightstore.lake.integrity import ChecksumStore, Verification, key_path
from flightstore.lake.offsets import TABLE_ID_PROPERTY
from flightstore.schema import TableDescriptor

__all__ = ["live_files", "verify_lake_table"]

_BATCH = 64  # files checked at once


def live_files(lake_table: IcebergTable) -> list[DataFile]:
    """Every data and delete file some live snapshot of ``lake_table`` references, once each."""
    io = lake_table.io
    files: dict[str, DataFile] = {}
    seen: set[str] = set()
    for snapshot in lake_table.metadata.snapshots:
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
                files.setdefault(entry.data_file.file_path, entry.data_file)
    return list(files.values())


def verify_lake_table(catalog: LakeCatalog, descriptor: TableDescriptor,
                      table_id: str) -> Iterator[tuple[str, str]]:
    """``(severity, message)`` findings of the lake table of a datalake-enabled table (``table_id``:
    its incarnation); nothing for a table nothing was tiered for yet. Raises LakeUnavailable when
    the lake cannot be read."""
    try:
        lake_table = catalog.load_table(descriptor.path)
    except TableNotFound:
        return
    if lake_table.properties.get(TABLE_ID_PROPERTY) != table_id:
        return  # another incarnation's lake table (the table was dropped and created again)
    what = f"verifying the lake files of {descriptor.path}"
    with lake_failures(what):
        files = live_files(lake_table)
        store = ChecksumStore.of(lake_table)
        checks = store.lookup([key_path(lake_table.io, f.file_path) for f in files]) if store is not None else {}
    unchecked = sum(key_path(lake_table.io, f.file_path) not in checks for f in files)
    for start in range(0, len(files), _BATCH):
        damaged = Verification(lake_table, files[start:start + _BATCH], what, checks).result()
        for location in sorted(damaged):
            yield "error", damaged[location].describe()
    if unchecked:
        yield "note", (f"{unchecked} of {len(files)} lake file(s) have no recorded checksum (written before "
                       "checksums were recorded): checked by size only")


def verify_lake(catalog: LakeCatalog, tables: list[tuple[TableDescriptor, str]]) -> Iterator[tuple[str, str, str]]:
    """``(severity, where, message)`` findings of the lake tables of ``tables`` (descriptor, table
    id); a lake that cannot be read is an error per table."""
    for descriptor, table_id in tables:
        where = f"table {descriptor.path} lake"
        try:
            for severity, message in verify_lake_table(catalog, descriptor, table_id):
                yield severity, where, message
        except FlightstoreError as exc:
            yield "error", where, f"the lake cannot be checked: {exc}"
