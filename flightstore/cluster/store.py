"""A :class:`~flightstore.store.Store` whose DDL the cluster's coordinator decides.

In cluster mode the server runs on a ``ClusterStore``: every DDL path of the server (SQL DDL, bulk
ingest that creates or replaces a table, the Python client) calls ``create_table`` & co., which
here validate locally, send the request to the coordinator and return once this server's catalog
mirror has applied the committed change (so the caller can use the table at once). The mirror
applies the coordinator's decisions to this data directory with the ``local_*`` methods: the
single-server operations.

Data: :meth:`table` answers a :class:`~flightstore.cluster.table.ClusterTable` once the server
has joined, so reads and writes of buckets another server leads go to that server
(:mod:`flightstore.cluster.table`); :meth:`local_table` is this directory's own table (its
replicas, led or followed).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flightstore.alter import Change, RenameTable, apply_changes
from flightstore.cluster.peers import Peers
from flightstore.cluster.table import ClusterTable
from flightstore.config import SERVER_OPTIONS
from flightstore.errors import CoordinatorUnavailable, InvalidOption, Unavailable
from flightstore.schema import TableDescriptor, TablePath
from flightstore.store import Store, Table, new_table_descriptor
from flightstore.table.api import TableApi

if TYPE_CHECKING:
    from flightstore.cluster.member import ClusterMember

__all__ = ["ClusterStore"]


class ClusterStore(Store):
    """A data directory of one cluster member; DDL goes through :attr:`member`'s coordinator."""

    def __init__(self, data_dir: Any, *, fsync: bool = SERVER_OPTIONS["log.fsync"].default,
                 options: Mapping[str, Any] | None = None) -> None:
        super().__init__(data_dir, fsync=fsync, options=options)
        self.member: ClusterMember | None = None
        self.peers = Peers()
        self._routed: dict[TablePath, ClusterTable] = {}
        self.table_ids: dict[str, str] = {}  # table -> the cluster's table id (the catalog mirror's)
        self.has_lake = False  # the cluster's lake is configured here (flightstore.lake.cluster)

    def local_table(self, path: TablePath | str) -> Table:
        """This data directory's table (the buckets this server leads hold its rows)."""
        return Store.table(self, path)

    def table(self, path: TablePath | str) -> TableApi:
        """The table as the cluster serves it: each bucket from its leader (a
        :class:`~flightstore.cluster.table.ClusterTable`). Before this server joined there is no
        cluster table to serve: UNAVAILABLE."""
        local = Store.table(self, path)
        member = self.member
        if member is None:
            raise CoordinatorUnavailable("this server has not joined its cluster yet; retry shortly")
        routed = self._routed.get(local.path)
        if routed is None or routed.local is not local:  # new, or reopened (ALTER, DROP + CREATE)
            record = member.view().tables.get(local.path)
            if record is None:
                view = member.metadata.refresh(10.0)
                record = view.tables.get(local.path) if view is not None else None
            if record is None:
                raise Unavailable(f"table {local.path} is not in this server's cluster view yet; retry")
            retry_s = 2 * member.config.session_timeout_ms / 1000 + 10
            routed = self._routed[local.path] = ClusterTable(local, record.table_id, member, self.peers, retry_s)
        return routed

    def catch_up(self, timeout: float = 10.0) -> bool:
        """Apply the cluster's newest catalog now (read-your-writes across servers: a database or
        table another server just created); whether this server holds it within ``timeout``."""
        member = self.member
        if member is None:
            return False
        deadline = time.monotonic() + timeout
        view = member.metadata.refresh(timeout)
        if view is None:
            return False
        return member.mirror.wait_applied(view.version, max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self.peers.close()
        super().close()

    # ---- remote storage: one copy per bucket for the whole cluster -----------------------------
    def join_remote(self, cluster_id: str) -> None:
        """Every server of the cluster reads and (as leader) writes the same remote bucket
        directories: the namespace is the cluster's (set before any table opens)."""
        if self.remote is not None:
            self.remote.namespace = f"cluster-{cluster_id}"

    def _remote_table_id(self, path: TablePath, directory: Any) -> str:
        table_id = self.table_ids.get(str(path))
        return table_id if table_id is not None else Store._remote_table_id(self, path, directory)

    def _check_lake(self, descriptor: TableDescriptor) -> None:
        """A datalake-enabled table needs the cluster's lake: without one it would never be
        tiered (and its log never shrink), so it is refused, not accepted and ignored."""
        if descriptor.option("table.datalake.enabled") and not self.has_lake:
            raise InvalidOption(f"table {descriptor.path}: 'table.datalake.enabled' needs the cluster's lake: "
                                "start every server with datalake.iceberg.uri and datalake.iceberg.warehouse "
                                "naming one shared catalog and warehouse")

    def _ddl(self, request: dict[str, Any]) -> None:
        member = self.member
        if member is None:
            raise CoordinatorUnavailable("this server has not joined its cluster yet; retry shortly")
        member.run_ddl(request)

    # ---- DDL, through the coordinator ----------------------------------------------------------
    def create_database(self, name: str, if_not_exists: bool = False) -> None:
        self._ddl({"op": "create_database", "name": name, "if_not_exists": if_not_exists})

    def drop_database(self, name: str, if_exists: bool = False, cascade: bool = False) -> None:
        self._ddl({"op": "drop_database", "name": name, "if_exists": if_exists, "cascade": cascade})

    def create_table(self, path: TablePath | str, schema: pa.Schema | None = None, *,
                     primary_key: Sequence[str] = (), partition_keys: Sequence[str] = (),
                     options: Mapping[str, Any] | None = None, if_not_exists: bool = False,
                     descriptor: TableDescriptor | None = None) -> Table:
        descriptor = new_table_descriptor(self._path(path) if descriptor is None else descriptor.path,
                                          schema, primary_key=primary_key, partition_keys=partition_keys,
                                          options=options, descriptor=descriptor)
        self.partition_limits.check_create(descriptor)  # refused before it is sent
        self._check_lake(descriptor)
        self._ddl({"op": "create_table", "descriptor": descriptor.to_json(), "if_not_exists": if_not_exists})
        if descriptor.option("table.auto-partition.enabled"):
            Store.auto_partition(self, tables=[descriptor.path])  # its first partitions, at once
        return self.table(descriptor.path)

    def drop_table(self, path: TablePath | str, if_exists: bool = False) -> None:
        path = self._path(path)
        self._ddl({"op": "drop_table", "database": path.database, "table": path.table,
                   "if_exists": if_exists})

    def alter_table(self, path: TablePath | str, changes: Sequence[Change]) -> TableDescriptor:
        path = self._path(path)
        descriptor = self.catalog.get_table(path)
        apply_changes(descriptor, changes, self.partition_limits)  # refuse bad changes before sending
        self._ddl({"op": "alter_table", "database": path.database, "table": path.table,
                   "changes": [change.to_json() for change in changes]})
        renamed = [c.target for c in changes if isinstance(c, RenameTable)]
        return self.catalog.get_table(renamed[-1] if renamed else path)

    def auto_partition(self, now_ms: int | None = None,
                       tables: Sequence[TablePath] | None = None) -> dict[str, tuple[int, int]]:
        """Only the coordinator creates and drops auto partitions (through the coordinator, like
        any DDL); the other servers follow its catalog."""
        member = self.member
        if member is None or not member.is_coordinator:
            return {}
        return super().auto_partition(now_ms, tables)

    # ---- what the catalog mirror applies locally ----------------------------------------------
    def local_create_database(self, name: str) -> None:
        Store.create_database(self, name, if_not_exists=True)

    def local_drop_database(self, name: str) -> None:
        Store.drop_database(self, name, if_exists=True, cascade=True)

    def local_create_table(self, descriptor: TableDescriptor) -> None:
        # Only the catalog entry: the table opens when used, and its auto partitions come from
        # the coordinator (the mirror thread must never wait for DDL).
        descriptor = new_table_descriptor(descriptor.path, descriptor=descriptor)
        with self._lock:
            self.catalog.create_table(descriptor)

    def local_drop_table(self, path: TablePath) -> None:
        Store.drop_table(self, path, if_exists=True)

    def local_alter_table(self, path: TablePath, descriptor: TableDescriptor) -> None:
        """The cluster's new descriptor of table ``path`` (same table; renamed when its path differs)."""
        with self._gates_of(path, descriptor.path):
            old, new = self.catalog.alter_table(path, lambda _: descriptor)
            if new != old:
                self._follow(old.path, new)
