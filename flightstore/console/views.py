"""What the console shows, gathered from the running server as plain JSON-able dicts.

Every view runs for one caller (the server's ``_CALLER`` is set by :mod:`.server` for the
request) and goes through the server's own checks (:class:`~flightstore.server.access.
AccessChecks`): a table the caller may not DESCRIBE is absent from every listing and answers
exactly as an absent table; the cluster, the rates and other users' queries need DESCRIBE on the
cluster (as a metrics scrape does); cancelling needs a super user or the query's own user.

The numbers are those SQL and the Flight actions answer: offsets from the table's
``start_offsets`` / ``end_offsets`` (``flightstore.offsets``), row counts from the maintained counts
(``COUNT(*)``), partitions from ``t$partitions``, the lake from ``t$lake$snapshots`` /
``t$lake$status``, sizes from ``flightstore.usage``. Listing tables reads only the catalog (no
table is opened by looking); one table's page opens that table.

In a cluster, a table with a bucket whose leader is down (no live in-sync replica) has no row count
and no log offsets (they need every bucket's leader): its page shows each bucket's placement, the
unavailable ones flagged, with those figures empty (null) instead of failing or waiting.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa

from flightstore.acl import CLUSTER, Operation, Permission
from flightstore.errors import FlightstoreError, InvalidInput, NotFound
from flightstore.partitioning import bucket_id
from flightstore.schema import TablePath, arrow_type_to_sql
from flightstore.server.rpc import _CALLER

__all__ = ["ConsoleViews"]

MAX_LAKE_SNAPSHOTS = 50  # the newest tiering commits a table's lake page lists


def _kind(descriptor: Any) -> str:
    kind = "primary key" if descriptor.has_primary_key else "log"
    return f"partitioned {kind}" if descriptor.is_partitioned else kind


def _summary(descriptor: Any) -> dict[str, Any]:
    return {"name": descriptor.path.table, "database": descriptor.path.database, "kind": _kind(descriptor),
            "primary_key": list(descriptor.primary_key), "bucket_key": list(descriptor.bucket_key),
            "partition_keys": list(descriptor.partition_keys), "buckets": descriptor.num_buckets,
            "partitions": len(descriptor.partitions), "schema_version": descriptor.version,
            "datalake": bool(descriptor.option("table.datalake.enabled")),
            "options": dict(sorted(descriptor.options.items())), "comment": descriptor.comment}


def _columns(schema: pa.Schema) -> list[dict[str, Any]]:
    return [{"name": f.name, "type": arrow_type_to_sql(f.type), "nullable": f.nullable} for f in schema]


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    """A pyarrow table as JSON-able rows (timestamps as epoch milliseconds, maps as dicts)."""
    out = []
    for row in table.to_pylist():
        for key, value in row.items():
            if hasattr(value, "timestamp"):
                row[key] = int(value.timestamp() * 1000)
            elif isinstance(value, list) and value and isinstance(value[0], tuple):
                row[key] = {str(k): v for k, v in value}
        out.append(row)
    return out


class ConsoleViews:
    """The console's data of one :class:`~flightstore.server.service.FlightSqlServer`."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self._descriptors: tuple[int, list[Any]] = (-1, [])  # (catalog version, every descriptor)
        self._lock = threading.Lock()

    # ---- who may see what ---------------------------------------------------------------------
    def is_super(self) -> bool:
        return self.server.authz.is_super(_CALLER.get())

    def require_cluster(self) -> None:
        """Unauthorized unless the caller may DESCRIBE the cluster (what a metrics scrape needs)."""
        self.server.authz.check(_CALLER.get(), [Permission(Operation.DESCRIBE, CLUSTER)])

    def _all_descriptors(self) -> list[Any]:
        """Every table's descriptor, read again only when the catalog changed."""
        catalog = self.server.store.catalog
        version = catalog.version
        with self._lock:
            if self._descriptors[0] == version:
                return self._descriptors[1]
        found = []
        for path in catalog.all_tables():
            try:
                found.append(catalog.get_table(path))
            except FlightstoreError:
                continue  # dropped meanwhile, or corrupt: its own page says which
        with self._lock:
            self._descriptors = (version, found)
        return found

    # ---- databases and tables ------------------------------------------------------------------
    def tables(self) -> dict[str, Any]:
        """Every database and table the caller sees, from the catalog alone."""
        server, principal = self.server, _CALLER.get()
        descriptors = self._all_descriptors()
        visible = set(server.authz.visible_tables(principal, [d.path for d in descriptors]))
        databases = server.authz.visible_databases(principal, server.store.list_databases())
        listed: dict[str, list[dict[str, Any]]] = {name: [] for name in databases}
        for descriptor in descriptors:
            if descriptor.path in visible and descriptor.path.database in listed:
                listed[descriptor.path.database].append(_summary(descriptor))
        return {"databases": [{"name": name, "tables": tables} for name, tables in listed.items()]}

    def table(self, name: str) -> dict[str, Any]:
        """One table: its descriptor, schema versions, partitions and every bucket."""
        if not isinstance(name, str) or "." not in name:
            raise InvalidInput("name the table as database.table")
        table = self.server._visible_table(TablePath.parse(name))
        descriptor = table.descriptor
        leaders = self._leaders(descriptor.path)
        whole = all(placement["available"] for placement in leaders.values())  # every leader is up
        versions = [{"version": v, "columns": _columns(s)} for v, s in sorted(descriptor.schemas.items())]
        answer = {**_summary(descriptor), "columns": _columns(descriptor.schema), "schema_versions": versions,
                  "row_count": table.row_count() if whole else None, "partition_list": [],
                  "unavailable_buckets": sorted(b for b, p in leaders.items() if not p["available"]),
                  "bucket_list": self._buckets(table, leaders, whole)}
        if descriptor.is_partitioned:
            rows = self.server.executor.views.partitions_table(descriptor.path)
            answer["partition_list"] = [{"name": r["partition_name"], "id": r["partition_id"],
                                         "row_count": r["row_count"]} for r in rows.to_pylist()]
        return answer

    def _buckets(self, table: Any, leaders: dict[int, dict[str, Any]], whole: bool) -> list[dict[str, Any]]:
        """Every bucket's row; ``whole``: every bucket's leader is up (else no log offsets)."""
        descriptor = table.descriptor
        start, end = (table.start_offsets(), table.end_offsets()) if whole else ({}, {})
        lake = self._lake_status(descriptor.path) if descriptor.option("table.datalake.enabled") else {}
        local = self._local_buckets(descriptor.path)
        partition_of = {bucket_id(p.id, b, descriptor.num_buckets): p.name
                        for p in descriptor.partitions for b in range(descriptor.num_buckets)}
        numbers = sorted(partition_of) if descriptor.is_partitioned else range(descriptor.num_buckets)
        out = []
        for bucket in sorted(end) if whole else numbers:
            held = local.get(bucket, {})
            status = lake.get(bucket, {})
            placement = leaders.get(bucket % descriptor.num_buckets, {}) if leaders else {}
            out.append({"bucket": bucket, "partition": partition_of.get(bucket),
                        "leader": placement.get("leader", "this server"),
                        "replicas": placement.get("replicas"), "isr": placement.get("isr"),
                        "available": placement.get("available", True),
                        "log_start": start.get(bucket), "log_end": end.get(bucket),
                        "kv_snapshot_offset": held.get("kv_snapshot_offset"),
                        "lake_tiered_offset": status.get("tiered_offset"),
                        "lake_lag_records": status.get("lag_records"),
                        "lake_lag_seconds": status.get("lag_seconds"),
                        "bytes": held.get("bytes")})
        return out

    def _local_buckets(self, path: TablePath) -> dict[int, dict[str, Any]]:
        """The newest KV snapshot offset and bytes on disk of every bucket this server holds, by
        table-wide bucket number (in a cluster, only the buckets with a replica here)."""
        try:
            local = self.server.store.local_table(path)
        except FlightstoreError:
            return {}
        descriptor = local.descriptor
        units = [(p.id, local.units[p.id]) for p in descriptor.partitions if p.id in local.units] \
            if descriptor.is_partitioned else [(None, local)]
        held = None
        if self.server.cluster is not None:
            held = {(e["bucket"]) for e in self.server.cluster.replicas.status()["buckets"] if e["table"] == str(path)}
        out = {}
        for partition_id, unit in units:
            for bucket in range(descriptor.num_buckets):
                number = bucket if partition_id is None else bucket_id(partition_id, bucket, descriptor.num_buckets)
                if held is not None and bucket not in held:
                    continue
                newest = unit.kvs[bucket].snapshots.newest if unit.kvs else None
                out[number] = {"kv_snapshot_offset": newest.offset if newest is not None else None,
                               "bytes": unit.upkeep.disk_usage([bucket])["total"]}
        return out

    def _leaders(self, path: TablePath) -> dict[int, dict[str, Any]]:
        """Each bucket's leader, replicas and in-sync replicas (cluster mode; {} on one server)."""
        if self.server.cluster is None:
            return {}
        return {loc.bucket: {"leader": loc.leader, "replicas": list(loc.replicas), "isr": list(loc.isr),
                             "available": loc.available}
                for loc in self.server.cluster.view().locations(path)}

    def _lake_status(self, path: TablePath) -> dict[int, dict[str, Any]]:
        if self.server.executor.lake is None:
            return {}
        try:
            rows = self.server.executor.views.lake_status_table(path).to_pylist()
        except FlightstoreError:
            return {}
        return {r["bucket"]: r for r in rows}

    # ---- the lake ---------------------------------------------------------------------------
    def lake(self) -> dict[str, Any]:
        """Every datalake-enabled table the caller sees: its tiering commits, data files, lag
        and last upkeep (``t$lake$snapshots`` and ``t$lake$status``)."""
        if self.server.executor.lake is None:
            return {"enabled": False, "tables": []}
        tables = []
        for database in self.tables()["databases"]:
            for summary in database["tables"]:
                if summary["datalake"]:
                    tables.append(self.lake_table(TablePath(summary["database"], summary["name"])))
        return {"enabled": True, "tables": tables}

    def lake_table(self, path: TablePath) -> dict[str, Any]:
        views = self.server.executor.views
        answer: dict[str, Any] = {"table": str(path)}
        try:
            status = views.lake_status_table(path).to_pylist()
            snapshots = _rows(views.lake_snapshots_table(path))
        except FlightstoreError as exc:
            return {**answer, "error": str(exc)}
        first = status[0] if status else {}
        stamp = {k: (int(v.timestamp() * 1000) if hasattr(v, "timestamp") else v) for k, v in first.items()}
        answer.update({
            "snapshots": len(snapshots), "recent_snapshots": snapshots[-MAX_LAKE_SNAPSHOTS:][::-1],
            "files": self._lake_files(path),
            "lag_records": sum(r["lag_records"] for r in status),
            "lag_seconds": max((r["lag_seconds"] for r in status), default=0.0),
            **{k: stamp.get(k) for k in ("last_commit", "last_snapshot_id", "last_error", "consecutive_failures",
                                         "tierer", "last_upkeep", "upkeep_expired_snapshots",
                                         "upkeep_removed_files", "upkeep_error")},
            "damaged_files": sorted({f for r in status for f in r["damaged_files"]}),
        })
        return answer

    def _lake_files(self, path: TablePath) -> int | None:
        """Data files in the lake table's current snapshot (its summary's ``total-data-files``)."""
        try:
            snapshot = self.server.executor.lake.load_table(path).current_snapshot()
        except FlightstoreError:
            return None
        if snapshot is None or snapshot.summary is None:
            return 0
        return int(snapshot.summary.additional_properties.get("total-data-files", 0))

    # ---- the cluster --------------------------------------------------------------------------
    def cluster(self) -> dict[str, Any]:
        """Servers, coordinator and unavailable buckets (cluster mode); this server otherwise."""
        self.require_cluster()
        server = self.server
        if server.cluster is None:
            return {"mode": "single", "uri": server.uri, "servers": [], "unavailable": []}
        view = server.cluster.view()
        unavailable = [{"table": str(path), **loc.to_json()} for path in sorted(view.tables)
                       for loc in view.locations(path) if not loc.available]
        return {"mode": "cluster", "uri": server.uri, "server_id": server.cluster.server_id,
                "coordinator": view.coordinator, "catalog_version": view.version,
                "servers": [{"id": i, **s.to_json()} for i, s in sorted(view.servers.items())],
                "unavailable": unavailable}

    # ---- rates and queries --------------------------------------------------------------------
    def queries(self) -> dict[str, Any]:
        """The running queries: all of them for a super user, the caller's own otherwise."""
        principal, everyone = _CALLER.get(), self.is_super()
        rows = [{"number": q.number, "user": q.user, "sql": q.sql, "started_ms": q.started_ms}
                for q in self.server.queries.running() if everyone or q.user == principal]
        return {"queries": rows, "may_cancel_any": everyone}

    def cancel(self, number: int) -> dict[str, Any]:
        """Stop running query ``number``: a super user may stop any, a user its own. A query the
        caller may not see answers as one that ended (NotFound)."""
        principal = _CALLER.get()
        query = next((q for q in self.server.queries.running() if q.number == number), None)
        if query is None or not (self.is_super() or query.user == principal):
            raise NotFound(f"no running query {number} (it ended, or is not yours)")
        if self.server.queries.cancel_stream(number) is None:
            raise NotFound(f"no running query {number} (it ended, or is not yours)")
        return {"cancelled": True, "number": number, "sql": query.sql, "user": query.user}
