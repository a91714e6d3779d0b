"""The lake's Iceberg catalog: one pyiceberg SqlCatalog, one Iceberg table per tiered table.

A flightstore table ``db.t`` is the Iceberg table ``db.t`` (namespace = database), so any engine
that knows the catalog finds it by the same name. The Iceberg table remembers which incarnation
of the flightstore table it holds (``flightstore.table-id``, the table's data directory name): a
table dropped and created again under the same name starts a new lake table, and the old one is
kept, renamed ``<table>__replaced_<id>``, never silently mixed with the new rows.

Everything the catalog or warehouse can throw (I/O, SQL, commit conflicts) leaves this package as
:class:`~flightstore.errors.LakeUnavailable`; :meth:`LakeCatalog.reset` drops the connection so the
next call reconnects (a restarted catalog database, a restored warehouse).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.table import Table as IcebergTable
from sqlalchemy import create_engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from flightstore import memory
from flightstore.config import ICEBERG_TABLE_PREFIX
from flightstore.errors import FlightstoreError, LakeUnavailable, TableNotFound, Unsupported
from flightstore.lake.cache import ReadCache
from flightstore.lake.layout import iceberg_schema, partition_spec, sort_order
from flightstore.lake.offsets import TABLE_ID_PROPERTY
from flightstore.lake.settings import CATALOG_NAME, LakeSettings
from flightstore.schema import TableDescriptor, TablePath

__all__ = ["DEFAULT_FORMAT_VERSION", "LAKE_FAILURES", "LakeCatalog", "lake_failures"]

# Lake tables are Iceberg v2, whatever pyiceberg's default: primary-key tables need its position
# delete files (v1 has none; v3 replaces them with deletion vectors). ``iceberg.format-version``
# overrides it; such tables are tiered copy-on-write.
FORMAT_VERSION, DEFAULT_FORMAT_VERSION = "format-version", "2"

# What an unreachable catalog database or an unwritable warehouse raises.
LAKE_FAILURES = (OSError, pa.ArrowException, SQLAlchemyError, CommitFailedException,
                 CommitStateUnknownException)


@contextlib.contextmanager
def lake_failures(what: str) -> Iterator[None]:
    """Translate the lake's own failures inside the block into :class:`LakeUnavailable`."""
    try:
        yield
    except FlightstoreError:
        raise
    except LAKE_FAILURES as exc:
        raise LakeUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc


# Iceberg table properties of every lake table unless its ``iceberg.*`` options say otherwise.
DEFAULT_TABLE_PROPERTIES = {"write.parquet.compression-codec": "snappy"}


# Parquet row groups of a wide table hold at most about this many bytes: a reader decodes a row
# group's column chunks together (pyiceberg's limit is in rows only: 1,048,576).
ROW_GROUP_BYTES = 128 << 20
_ROW_GROUP_ROWS = 1_048_576


def table_properties(descriptor: TableDescriptor, table_id: str) -> dict[str, str]:
    """Iceberg table properties: :data:`DEFAULT_TABLE_PROPERTIES` (and, for a wide table, a row
    group limit of about :data:`ROW_GROUP_BYTES`) overridden by the ``iceberg.*`` table options,
    and the incarnation id."""
    properties = dict(DEFAULT_TABLE_PROPERTIES)
    rows = memory.rows_within(memory.row_width(descriptor.schema), _ROW_GROUP_ROWS, ROW_GROUP_BYTES)
    if rows < _ROW_GROUP_ROWS:
        properties["write.parquet.row-group-limit"] = str(rows)
    properties.update({key[len(ICEBERG_TABLE_PREFIX):]: value for key, value in descriptor.options.items()
                       if key.startswith(ICEBERG_TABLE_PREFIX)})
    properties[TABLE_ID_PROPERTY] = table_id
    return properties


class LakeCatalog:
    """Opens the Iceberg catalog lazily and maps flightstore tables to Iceberg tables. Thread-safe."""

    def __init__(self, settings: LakeSettings) -> None:
        if settings.format != "iceberg":
            raise Unsupported(f"datalake.format {settings.format!r} is not supported; use iceberg")
        self.settings = settings
        self._catalog: SqlCatalog | None = None
        self._lock = threading.RLock()
        self._read_cache: ReadCache | None = None
        # Damaged lake files reads met (t$lake$status): flightstore.lake.integrity.
        from flightstore.lake.integrity import DamageLog
        self.damage = DamageLog()

    @property
    def read_cache(self) -> ReadCache | None:
        """The local cache of decoded data files union reads use (None: ``datalake.read-cache.size``
        is 0), opened on first use."""
        if self.settings.read_cache_size <= 0:
            return None
        with self._lock:
            if self._read_cache is None:
                self._read_cache = ReadCache(self.settings.read_cache_dir, self.settings.read_cache_size)
            return self._read_cache

    @property
    def catalog(self) -> SqlCatalog:
        """The pyiceberg catalog, connected on first use (LakeUnavailable if it cannot be)."""
        with self._lock:
            if self._catalog is None:
                local = self.settings.local_warehouse
                with lake_failures(f"opening the lake catalog {self.settings.catalog_uri}"):
                    if self.settings.catalog_uri.startswith("sqlite:///"):
                        Path(self.settings.catalog_uri[len("sqlite:///"):]).parent.mkdir(
                            parents=True, exist_ok=True)
                    if local is not None:
                        local.mkdir(parents=True, exist_ok=True)
                    catalog = SqlCatalog(CATALOG_NAME, **self.settings.pyiceberg_properties())
                    if self.settings.catalog_uri.startswith("sqlite"):
                        # No pooled connection across rounds: sqlite connections are cheap, and a
                        # catalog file that went away (unmounted, restored) is noticed at once
                        # instead of being written through a stale handle.
                        catalog.engine.dispose()
                        catalog.engine = create_engine(self.settings.catalog_uri, poolclass=NullPool)
                    self._catalog = catalog
            return self._catalog

    def reset(self) -> None:
        """Forget the connection; the next use reconnects."""
        with self._lock:
            catalog, self._catalog = self._catalog, None
        if catalog is not None:
            with contextlib.suppress(Exception):
                catalog.engine.dispose()

    @staticmethod
    def identifier(path: TablePath) -> tuple[str, str]:
        """The Iceberg identifier of a flightstore table: (database, table)."""
        return (path.database, path.table)

    def load_table(self, path: TablePath) -> IcebergTable:
        """The lake table of ``path``; TableNotFound if nothing was tiered for it yet."""
        with lake_failures(f"loading the lake table of {path}"):
            try:
                return self.catalog.load_table(self.identifier(path))
            except (NoSuchTableError, NoSuchNamespaceError):
                raise TableNotFound(f"table {path} has no lake table (not tiered yet)") from None

    def ensure_table(self, descriptor: TableDescriptor, table_id: str) -> IcebergTable:
        """The lake table of this incarnation of a table, created with its layout if missing.

        ``table_id`` names the incarnation (the table's data directory); a lake table of another
        incarnation is renamed out of the way first. ``iceberg.*`` options are kept in sync.
        """
        identifier = self.identifier(descriptor.path)
        properties = table_properties(descriptor, table_id)
        with lake_failures(f"opening the lake table of {descriptor.path}"):
            catalog = self.catalog
            catalog.create_namespace_if_not_exists(descriptor.path.database)
            try:
                table = catalog.load_table(identifier)
            except NoSuchTableError:
                table = None
            if table is not None and table.properties.get(TABLE_ID_PROPERTY) != table_id:
                old = table.properties.get(TABLE_ID_PROPERTY, "unknown").replace("-", "_")
                catalog.rename_table(identifier, (identifier[0], f"{identifier[1]}__replaced_{old}"))
                table = None
            if table is None:
                schema = iceberg_schema(descriptor)
                try:
                    table = catalog.create_table(identifier, schema,
                                                 partition_spec=partition_spec(descriptor, schema),
                                                 sort_order=sort_order(schema),
                                                 properties={FORMAT_VERSION: DEFAULT_FORMAT_VERSION, **properties})
                except TableAlreadyExistsError:  # another tierer created it meanwhile
                    table = catalog.load_table(identifier)
            stale = {k: v for k, v in properties.items() if table.properties.get(k) != v}
            if stale:
                with table.transaction() as transaction:
                    transaction.set_properties(stale)
                table = catalog.load_table(identifier)
            return table
