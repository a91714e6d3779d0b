"""Databases and tables, persisted in the data directory.

``<data-dir>/catalog.json`` is the source of truth for what exists; every change rewrites it
atomically (write, fsync, rename) and bumps its version. Each table owns a data directory named in
its catalog entry (``dir``, relative to the data directory). New tables get ``tables/<table id>``:
directories are never built from user text, so no name can reach outside the data directory.
Entries written before that keep their ``<database>/<table>-<id>`` directory and stay readable.

A table listed in the catalog whose directory is gone is reported as
:class:`~flightstore.errors.CorruptData` on access, never silently recreated; a catalog file that
does not parse, names a database or table that breaks :func:`flightstore.names.check_name`, or
points a ``dir`` outside the data directory stops start-up with the same error.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from flightstore.errors import AlreadyExists, CorruptData, DatabaseNotFound, InvalidInput, TableNotFound
from flightstore.names import check_name, shown_name
from flightstore.schema import TableDescriptor, TablePath

__all__ = [
    "DEFAULT_DATABASE",
    "TABLES_DIR",
    "Catalog",
    "read_catalog_file",
    "read_table_dir",
    "table_directory",
]

DEFAULT_DATABASE = "default"
TABLES_DIR = "tables"  # new tables' directories: <data-dir>/tables/<table id>


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_catalog_file(path: Path) -> tuple[int, dict[str, dict[str, dict]]]:
    """``(version, {database: {table: entry}})`` of a catalog file (entries hold ``descriptor``
    and ``dir``); CorruptData when it does not parse. Reading only: ``flightstore verify`` uses it
    on a data directory it must not change."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        version = int(state["version"])
        databases = {db: dict(tables) for db, tables in state["databases"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptData(f"catalog file {path} is corrupt: {exc}") from None
    for database, tables in databases.items():
        for table, entry in tables.items():
            try:
                TablePath.checked(database, table)
                if not isinstance(entry, dict) or not isinstance(entry.get("dir"), str):
                    raise InvalidInput("its entry has no 'dir'")
                table_directory(path.parent, entry["dir"])
            except (InvalidInput, CorruptData) as exc:
                raise CorruptData(f"catalog file {path} is corrupt: the entry of table "
                                  f"{shown_name(database)}.{shown_name(table)} is refused: {exc}") from None
        try:
            check_name(database, "database")
        except InvalidInput as exc:
            raise CorruptData(f"catalog file {path} is corrupt: {exc}") from None
    return version, databases


def table_directory(data_dir: Path, relative: str) -> Path:
    """``data_dir / relative`` (a catalog entry's ``dir``) once it is known to stay inside
    ``data_dir`` (CorruptData otherwise): a hand-edited or old catalog cannot make flightstore
    write, read or delete elsewhere."""
    if not relative or "\x00" in relative or Path(relative).is_absolute():
        raise CorruptData(f"table directory {relative!r} is not a path inside the data directory")
    root = Path(os.path.realpath(data_dir))
    directory = Path(os.path.realpath(root / relative))
    if directory == root or root not in directory.parents:
        raise CorruptData(f"table directory {relative!r} is outside the data directory")
    return Path(data_dir) / relative


def read_table_dir(data_dir: str | os.PathLike, table: TablePath | str) -> Path:
    """The data directory of ``table`` as the catalog file of ``data_dir`` names it (reading
    only, the Store may be closed): for tools and tests that look at a table's files."""
    path = table if isinstance(table, TablePath) else TablePath.parse(table, DEFAULT_DATABASE)
    _, databases = read_catalog_file(Path(data_dir) / "catalog.json")
    entry = databases.get(path.database, {}).get(path.table)
    if entry is None:
        raise TableNotFound(f"table {path} does not exist")
    return table_directory(Path(data_dir), entry["dir"])


class Catalog:
    """The databases and table descriptors of one data directory. Thread-safe."""

    def __init__(self, data_dir: str | os.PathLike) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._file = self.data_dir / "catalog.json"
        self._lock = threading.RLock()
        self._databases: dict[str, dict[str, dict]] = {}
        self.version = 0
        if self._file.exists():
            self.version, self._databases = read_catalog_file(self._file)
        else:
            self._databases = {DEFAULT_DATABASE: {}}
            self._save()

    # ---- persistence --------------------------------------------------------------------------
    def _save(self) -> None:
        self.version += 1
        _write_atomically(self._file, json.dumps(
            {"version": self.version, "databases": self._databases}, indent=1, sort_keys=True))

    # ---- databases ----------------------------------------------------------------------------
    def list_databases(self) -> list[str]:
        with self._lock:
            return sorted(self._databases)

    def database_exists(self, name: str) -> bool:
        with self._lock:
            return name in self._databases

    def create_database(self, name: str, if_not_exists: bool = False) -> None:
        check_name(name, "database")
        with self._lock:
            if name in self._databases:
                if if_not_exists:
                    return
                raise AlreadyExists(f"database {name!r} already exists")
            self._databases[name] = {}
            self._save()

    def drop_database(self, name: str, if_exists: bool = False, cascade: bool = False) -> list[Path]:
        """Remove a database; returns the data directories of the tables dropped with it."""
        with self._lock:
            if name not in self._databases:
                if if_exists:
                    return []
                raise DatabaseNotFound(f"database {name!r} does not exist")
            tables = self._databases[name]
            if tables and not cascade:
                raise InvalidInput(
                    f"database {name!r} is not empty ({len(tables)} tables); use DROP DATABASE "
                    f"{name} CASCADE")
            dirs = [table_directory(self.data_dir, entry["dir"]) for entry in tables.values()]
            del self._databases[name]
            self._save()
        for directory in dirs:
            shutil.rmtree(directory, ignore_errors=True)
        return dirs

    # ---- tables -------------------------------------------------------------------------------
    def list_tables(self, database: str) -> list[str]:
        with self._lock:
            if database not in self._databases:
                raise DatabaseNotFound(f"database {database!r} does not exist")
            return sorted(self._databases[database])

    def all_tables(self) -> list[TablePath]:
        with self._lock:
            return [TablePath(db, t) for db in sorted(self._databases) for t in sorted(self._databases[db])]

    def _entry(self, path: TablePath) -> dict:
        tables = self._databases.get(path.database)
        if tables is None:
            raise DatabaseNotFound(f"database {path.database!r} does not exist")
        entry = tables.get(path.table)
        if entry is None:
            raise TableNotFound(f"table {path} does not exist")
        return entry

    def get_table(self, path: TablePath) -> TableDescriptor:
        with self._lock:
            entry = self._entry(path)
            try:
                return TableDescriptor.from_json(entry["descriptor"])
            except (ValueError, KeyError, TypeError) as exc:
                raise CorruptData(f"table {path}: descriptor is corrupt: {exc}") from None

    def table_dir(self, path: TablePath) -> Path:
        """The table's data directory; CorruptData if it vanished."""
        with self._lock:
            directory = table_directory(self.data_dir, self._entry(path)["dir"])
        if not directory.is_dir():
            raise CorruptData(f"table {path}: data directory {directory} is missing; the table's "
                              "data is lost (drop and recreate it to start over)")
        return directory

    def create_table(self, descriptor: TableDescriptor, if_not_exists: bool = False) -> bool:
        """Create a table; returns False when it existed and ``if_not_exists`` was set."""
        path = TablePath.checked(descriptor.path.database, descriptor.path.table)
        with self._lock:
            if path.database not in self._databases:
                raise DatabaseNotFound(f"database {path.database!r} does not exist")
            if path.table in self._databases[path.database]:
                if if_not_exists:
                    return False
                raise AlreadyExists(f"table {path} already exists")
            relative = f"{TABLES_DIR}/{uuid.uuid4().hex}"  # an id: never the user's text
            (self.data_dir / relative).mkdir(parents=True)
            self._databases[path.database][path.table] = {
                "descriptor": descriptor.with_version(1).to_json(), "dir": relative}
            self._save()
            return True

    def alter_table(self, path: TablePath, alter: Callable[[TableDescriptor], TableDescriptor]
                    ) -> tuple[TableDescriptor, TableDescriptor]:
        """Replace table ``path``'s descriptor by ``alter(descriptor)`` in one atomic catalog write
        (a crash leaves the old or the new descriptor); a new path renames the table (its data
        directory stays). Returns ``(old, new)``; nothing is written when they are equal or when
        ``alter`` raises."""
        with self._lock:
            entry = self._entry(path)
            old = self.get_table(path)
            new = alter(old)
            if new == old:
                return old, new
            if new.path != path:
                TablePath.checked(new.path.database, new.path.table)
                if new.path.database != path.database:
                    raise InvalidInput(f"table {path} cannot move to database {new.path.database!r}")
                if new.path.table in self._databases[path.database]:
                    raise AlreadyExists(f"table {new.path} already exists")
                del self._databases[path.database][path.table]
            self._databases[new.path.database][new.path.table] = {**entry, "descriptor": new.to_json()}
            try:
                self._save()
            except BaseException:
                self._databases[new.path.database].pop(new.path.table, None)
                self._databases[path.database][path.table] = entry
                raise
            return old, new

    def drop_table(self, path: TablePath, if_exists: bool = False) -> Path | None:
        """Remove a table from the catalog and delete its data; returns the removed directory."""
        with self._lock:
            try:
                entry = self._entry(path)
            except (TableNotFound, DatabaseNotFound):
                if if_exists:
                    return None
                raise
            del self._databases[path.database][path.table]
            self._save()
        directory = table_directory(self.data_dir, entry["dir"])
        shutil.rmtree(directory, ignore_errors=True)
        return directory
