"""The local catalog mirror: one server's data directory follows the cluster catalog.

Every server holds every table's descriptor (so it can plan any query) and the data of what was
written to it. The mirror applies each new catalog version to the local :class:`ClusterStore`:
databases and tables the cluster has are created, those it dropped are dropped, and a table that
was dropped and created again (a new table id) starts over empty.

``<data-dir>/cluster.json`` records which cluster and server id the directory belongs to and the
table id of every mirrored table. It is written *before* a local table is created, so a crash in
between leaves a known table to create, never an unknown table whose data would be thrown away.
Guards, checked before a server joins:

* a directory of another server id, or of another cluster (wrong ``--zookeeper`` address or
  chroot, or a ZooKeeper that lost its data), is refused: joining would drop its tables;
* a directory with databases or tables made outside the cluster (a single server's) is refused;
* every view applied is checked to be of the directory's cluster (a ZooKeeper that lost its data
  would otherwise bootstrap a new, empty catalog that drops every table).

A table's data is deleted only by its DROP (``view.dropped``, the table ids DROP TABLE and DROP
DATABASE recorded in ZooKeeper), never because a view lacks it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flightstore.catalog import DEFAULT_DATABASE
from flightstore.cluster.store import ClusterStore
from flightstore.cluster.view import ClusterView
from flightstore.errors import InvalidInput
from flightstore.schema import TablePath

__all__ = ["IDENTITY_FILE", "CatalogMirror"]

log = logging.getLogger("flightstore.cluster")

IDENTITY_FILE = "cluster.json"


def _write_atomically(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class CatalogMirror:
    """Applies cluster catalog versions to ``store`` for server ``server_id``."""

    def __init__(self, store: ClusterStore, server_id: int) -> None:
        self.store = store
        self.server_id = server_id
        self._file = Path(store.data_dir) / IDENTITY_FILE
        self._identity: dict[str, Any] | None = None
        if self._file.exists():
            self._identity = json.loads(self._file.read_text(encoding="utf-8"))
        self.applied_version = 0
        self.last_error: str | None = None
        self._cond = threading.Condition()
        self.on_applied: Callable[[int], None] | None = None
        self.after_reconcile: Callable[[ClusterView], None] | None = None

    # ---- guards -------------------------------------------------------------------------------
    def check(self, cluster_id: str | None) -> bool:
        """Refuse to join when this directory belongs elsewhere (see the module docstring).
        ``cluster_id`` is the cluster's id in ZooKeeper (None before its first coordinator).
        True when the directory is new to the cluster: whatever replicas the cluster thinks this
        server holds are empty here (see ``ClusterMember._resign_lost_replicas``)."""
        where = self.store.data_dir
        if self._identity is not None:
            owner = int(self._identity["server_id"])
            if owner != self.server_id:
                raise InvalidInput(f"data directory {where} belongs to server {owner} of its cluster; "
                                   f"start it with --server-id {owner}, or use another --data-dir")
            if cluster_id != self._identity["cluster_id"]:
                found = f"cluster {cluster_id}" if cluster_id else "no flightstore cluster"
                raise InvalidInput(
                    f"data directory {where} belongs to cluster {self._identity['cluster_id']} but "
                    f"ZooKeeper holds {found} there (wrong --zookeeper address or chroot?); refusing "
                    "to join, which would drop the directory's tables")
            return False
        foreign = [str(p) for p in self.store.catalog.all_tables()]
        foreign += [db for db in self.store.list_databases() if db != DEFAULT_DATABASE]
        if foreign:
            raise InvalidInput(
                f"data directory {where} holds databases or tables made outside a cluster "
                f"({', '.join(sorted(foreign)[:5])}); serve it without --zookeeper, or give this "
                "server an empty --data-dir")
        return True

    # ---- applying -----------------------------------------------------------------------------
    def apply(self, view: ClusterView) -> None:
        """Make the local catalog equal to ``view``'s (a no-op for a version already applied).
        A view of another cluster (ZooKeeper lost its data, or the address moved to another
        chroot) is refused every time, before anything is changed."""
        if view.version == 0 or view.version <= self.applied_version:
            return
        try:
            self._check_cluster(view)
            self._reconcile(view)
            if self.after_reconcile is not None:  # replica roles, before anyone is told "applied"
                self.after_reconcile(view)
        except Exception as exc:  # report it; the next change (or a restart) retries
            log.exception("could not apply catalog version %d locally", view.version)
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        with self._cond:
            self.applied_version = view.version
            self.last_error = None
            self._cond.notify_all()
        if self.on_applied is not None:
            self.on_applied(view.version)

    def wait_applied(self, version: int, timeout: float) -> bool:
        """Whether catalog ``version`` (or a later one) was applied within ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self.applied_version >= version, timeout)

    def _check_cluster(self, view: ClusterView) -> None:
        """InvalidInput unless ``view`` is of the cluster this directory belongs to."""
        if self._identity is not None and view.cluster_id != self._identity["cluster_id"]:
            raise InvalidInput(f"the cluster view is of cluster {view.cluster_id}, but data directory "
                               f"{self.store.data_dir} belongs to cluster {self._identity['cluster_id']}: "
                               "nothing is applied (did ZooKeeper lose its data?)")

    def _reconcile(self, view: ClusterView) -> None:
        """Make the local catalog ``view``'s. A table's data is deleted only for an explicit DROP
        (its id in ``view.dropped``) or when the same id comes back new; a table a view merely
        lacks (which a view read at one version never shows, see the metadata cache) keeps its
        data, and a warning says so."""
        store = self.store
        if view.cluster_id is not None:
            store.join_remote(view.cluster_id)
        store.table_ids.update({str(path): record.table_id for path, record in view.tables.items()})
        identity = self._identity or {"server_id": self.server_id, "cluster_id": view.cluster_id,
                                      "tables": {}}
        known: dict[str, str] = dict(identity["tables"])
        desired = {str(path): record for path, record in view.tables.items()}
        by_id = {record.table_id: name for name, record in desired.items()}
        local_tables = {str(p) for p in store.catalog.all_tables()}
        kept: set[str] = set()  # known tables the view lacks without a DROP: their data stays
        for name, table_id in list(known.items()):
            record = desired.get(name)
            renamed = by_id.get(table_id)
            if record is None and renamed is not None and renamed not in known and name in local_tables:
                # ALTER TABLE ... RENAME TO: the same table (same id) under a new name keeps its data
                store.local_alter_table(TablePath.parse(name), desired[renamed].descriptor)
                del known[name]
                known[renamed] = table_id
                self._save(identity, known, view.version)
            elif (record is None or record.table_id != table_id) and table_id in view.dropped:
                store.local_drop_table(TablePath.parse(name))  # its DROP: the one reason to delete data
                del known[name]
                self._save(identity, known, view.version)
            elif record is None or record.table_id != table_id:
                if record is not None:  # another table took the name without a DROP of this one
                    raise InvalidInput(f"table {name} (id {record.table_id}) replaces table id {table_id} here, "
                                       "which no DROP removed: its data is kept and the view is not applied")
                log.warning("table %s (id %s) is not in cluster catalog version %d and no DROP removed it: its "
                            "data is kept", name, table_id, view.version)
                kept.add(name)
        for database in store.list_databases():
            if database not in view.databases:
                if any(name.split(".", 1)[0] == database for name in kept):
                    continue  # it holds a table that no DROP removed
                store.local_drop_database(database)
        local_databases = set(store.list_databases())
        for database in sorted(view.databases - local_databases):
            store.local_create_database(database)
        local_tables = {str(p) for p in store.catalog.all_tables()}
        for name, record in sorted(desired.items()):
            if known.get(name) != record.table_id:
                known[name] = record.table_id
                self._save(identity, known, view.version)  # before the table exists: see docstring
                if name in local_tables:
                    store.local_drop_table(record.path)  # an older table of that name
                store.local_create_table(record.descriptor)
            elif name not in local_tables:
                store.local_create_table(record.descriptor)  # known, its creation was interrupted
            elif store.catalog.get_table(record.path) != record.descriptor:
                store.local_alter_table(record.path, record.descriptor)  # ALTER TABLE
        self._save(identity, known, view.version)

    def _save(self, identity: dict[str, Any], tables: dict[str, str], version: int) -> None:
        identity = {**identity, "tables": dict(sorted(tables.items())), "version": version}
        _write_atomically(self._file, identity)
        self._identity = identity
