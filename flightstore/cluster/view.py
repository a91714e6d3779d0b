"""The cluster as one server sees it: an immutable snapshot of servers, coordinator and catalog.

:class:`ClusterView` is what the metadata cache publishes after every change it follows; readers
take the current one and never see half an update. Liveness is the ephemeral registration of a
server: a bucket whose leader is not registered is *unavailable*, and :meth:`ClusterView.bucket`
says so, naming the server, so a caller can answer UNAVAILABLE instead of a partial result.

Replication later: each bucket already has a leader, a leader epoch and a replica list; failover
will move ``leader`` to a live replica and bump ``leader_epoch`` (see ``coordinator.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flightstore.errors import BucketUnavailable, DatabaseNotFound, TableNotFound
from flightstore.schema import TableDescriptor, TablePath

__all__ = ["BucketAssignment", "BucketLocation", "ClusterView", "ServerInfo", "TableRecord"]


@dataclass(frozen=True)
class ServerInfo:
    """A live server's registration."""

    id: int
    uri: str
    pid: int = 0
    catalog_version: int = 0  # the catalog version its local mirror has applied
    # The znode versions of the cluster's users and grants it applied (flightstore.cluster.security).
    security: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServerInfo:
        return cls(id=int(data["id"]), uri=str(data["uri"]), pid=int(data.get("pid", 0)),
                   catalog_version=int(data.get("catalog_version", 0)),
                   security=tuple(sorted((str(k), int(v)) for k, v in (data.get("security") or {}).items())))

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "uri": self.uri, "pid": self.pid, "catalog_version": self.catalog_version,
                "security": dict(self.security)}


@dataclass(frozen=True)
class BucketAssignment:
    """A bucket's LeaderAndIsr: the servers holding replicas (in preference order), the leader
    (-1: none alive in sync), its leader epoch, and the in-sync replica set."""

    leader: int
    leader_epoch: int = 0
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"leader": self.leader, "leader_epoch": self.leader_epoch, "replicas": list(self.replicas),
                "isr": list(self.isr)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BucketAssignment:
        replicas = tuple(int(r) for r in data.get("replicas", [data["leader"]]))
        return cls(leader=int(data["leader"]), leader_epoch=int(data.get("leader_epoch", 0)),
                   replicas=replicas, isr=tuple(int(r) for r in data.get("isr", replicas)))


@dataclass(frozen=True)
class TableRecord:
    """A table of the cluster catalog: its id (new for every CREATE), descriptor and buckets."""

    table_id: str
    descriptor: TableDescriptor
    buckets: tuple[BucketAssignment, ...]

    @property
    def path(self) -> TablePath:
        return self.descriptor.path


@dataclass(frozen=True)
class BucketLocation:
    """Where one bucket is served now: its leader, and that server's URI when it is live."""

    table: TablePath
    bucket: int
    leader: int
    leader_epoch: int
    server: ServerInfo | None
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()

    @property
    def available(self) -> bool:
        return self.server is not None

    @property
    def reason(self) -> str:
        """Why the bucket cannot be served ("" when it can)."""
        if self.server is not None:
            return ""
        if self.leader < 0:
            return (f"bucket {self.bucket} of table {self.table} is unavailable: no in-sync replica "
                    f"({', '.join(map(str, self.isr)) or 'none'}) is alive to lead it")
        return (f"bucket {self.bucket} of table {self.table} is unavailable: its leader, server "
                f"{self.leader}, is down")

    def require(self) -> ServerInfo:
        """The live leader; :class:`BucketUnavailable` naming the server when it is down."""
        if self.server is None:
            raise BucketUnavailable(self.reason)
        return self.server

    def to_json(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "leader": self.leader, "leader_epoch": self.leader_epoch,
                "replicas": list(self.replicas), "isr": list(self.isr),
                "uri": self.server.uri if self.server else None, "available": self.available,
                "reason": self.reason}


@dataclass(frozen=True)
class ClusterView:
    """One consistent snapshot: catalog ``version``, live ``servers``, ``coordinator`` id, tables."""

    version: int = 0
    cluster_id: str | None = None
    servers: Mapping[int, ServerInfo] = field(default_factory=dict)
    coordinator: int | None = None
    databases: frozenset[str] = frozenset()
    tables: Mapping[TablePath, TableRecord] = field(default_factory=dict)
    dropped: frozenset[str] = frozenset()  # the ids of the tables a DROP removed

    def table(self, path: TablePath) -> TableRecord:
        record = self.tables.get(path)
        if record is None:
            if path.database not in self.databases:
                raise DatabaseNotFound(f"database {path.database!r} does not exist")
            raise TableNotFound(f"table {path} does not exist")
        return record

    def locations(self, path: TablePath) -> list[BucketLocation]:
        """Every bucket of ``path`` with its leader and whether that leader is live."""
        record = self.table(path)
        return [BucketLocation(path, bucket, a.leader, a.leader_epoch, self.servers.get(a.leader),
                               a.replicas, a.isr)
                for bucket, a in enumerate(record.buckets)]

    def bucket(self, path: TablePath, bucket: int) -> BucketLocation:
        return self.locations(path)[bucket]

    def buckets_led_by(self, server_id: int) -> dict[TablePath, list[int]]:
        """The buckets ``server_id`` leads, per table (what it serves when it is up)."""
        led: dict[TablePath, list[int]] = {}
        for path, record in self.tables.items():
            mine = [b for b, a in enumerate(record.buckets) if a.leader == server_id]
            if mine:
                led[path] = mine
        return led

    def to_json(self, table: TablePath | None = None) -> dict[str, Any]:
        """The view as JSON (the ``flightstore.cluster`` Flight action answers this)."""
        tables = [table] if table is not None else sorted(self.tables)
        return {
            "version": self.version, "cluster_id": self.cluster_id, "coordinator": self.coordinator,
            "servers": {str(i): s.to_json() for i, s in sorted(self.servers.items())},
            "databases": sorted(self.databases),
            "tables": {str(p): {"table_id": self.table(p).table_id,
                                "buckets": [loc.to_json() for loc in self.locations(p)]}
                       for p in tables},
        }
