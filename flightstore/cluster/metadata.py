"""Every server's cache of the cluster metadata, kept current by ZooKeeper watches.

A :class:`MetadataCache` follows three things: the live servers (``servers/*``), the coordinator
(``coordinator/active``) and the catalog (everything under ``metadata/``, re-read whenever
``metadata/version`` changes: every DDL bumps it in the same transaction). Watch callbacks only mark
a part dirty; one thread re-reads dirty parts (re-arming the one-shot watches), publishes a new
immutable :class:`~flightstore.cluster.view.ClusterView` and then calls the listeners in order, so
a listener (the local catalog mirror) sees every catalog change in version order, never two at once.

The catalog part of a view is read at one version (:meth:`MetadataCache._read_catalog`: read it
all, check the version did not move, else read again), so a view holds exactly what its version
holds: no table of it is missing because a DDL (a rename) committed between two reads.
After a lost session the watches are gone with it: the state listener marks everything dirty on
reconnection, and the thread re-reads and re-arms all of it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from flightstore.cluster.layout import ZkPaths, decode
from flightstore.cluster.view import BucketAssignment, ClusterView, ServerInfo, TableRecord
from flightstore.schema import TableDescriptor, TablePath

__all__ = ["MetadataCache"]

log = logging.getLogger("flightstore.cluster")

_PARTS = frozenset({"servers", "coordinator", "catalog", "assignments"})
_ZK_ERRORS = (KazooException, KazooTimeoutError)


class _CatalogMoved(Exception):
    """A DDL committed while the catalog was being read: read it again."""


class MetadataCache:
    """Follows the cluster metadata of ``paths`` over ``client``; :meth:`view` is the latest."""

    def __init__(self, client: KazooClient, paths: ZkPaths) -> None:
        self._client = client
        self._paths = paths
        self._view = ClusterView()
        self._cond = threading.Condition()
        self._dirty: set[str] = set(_PARTS)
        self._requested = 1  # refresh tickets: a reload serving ticket n finishes every wait on n
        self._completed = 0
        self._listeners: list[Callable[[ClusterView], None]] = []
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cluster-metadata", daemon=True)
        # One function object per part: kazoo keeps watchers in a set, so re-arming adds none.
        self._watchers = {part: self._watcher(part) for part in _PARTS}

    # ---- life ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self._client.connected:
            self._connected.set()
        self._client.add_listener(self._on_state)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._connected.set()
        with self._cond:
            self._cond.notify_all()
        self._client.remove_listener(self._on_state)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def add_listener(self, listener: Callable[[ClusterView], None]) -> None:
        """Call ``listener(view)`` (on the cache's thread) after every new view, in order."""
        self._listeners.append(listener)

    # ---- reading ------------------------------------------------------------------------------
    def view(self) -> ClusterView:
        return self._view

    def wait_for(self, predicate: Callable[[ClusterView], bool], timeout: float) -> ClusterView | None:
        """The first view ``predicate`` accepts, or None after ``timeout`` seconds."""
        with self._cond:
            if self._cond.wait_for(lambda: predicate(self._view) or self._stop.is_set(), timeout) \
                    and predicate(self._view):
                return self._view
            return None

    def refresh(self, timeout: float) -> ClusterView | None:
        """Re-read everything now (a read that must not miss a change made elsewhere, e.g. a table
        another server just created); the view after it, or None after ``timeout``."""
        try:
            self._client.sync(self._paths.root)
        except _ZK_ERRORS:
            pass  # the reload below fails the same way and is retried on reconnection
        with self._cond:
            self._requested += 1
            ticket = self._requested
            self._dirty |= _PARTS
            self._cond.notify_all()
            if self._cond.wait_for(lambda: self._completed >= ticket or self._stop.is_set(), timeout):
                return self._view
            return None

    # ---- following ----------------------------------------------------------------------------
    def _watcher(self, part: str) -> Callable:
        def watch(event: object) -> None:
            self._mark({part})
        return watch

    def _mark(self, parts: set[str]) -> None:
        with self._cond:
            self._dirty |= parts
            self._requested += 1
            self._cond.notify_all()

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._connected.set()
            self._mark(set(_PARTS))  # a new session has no watches: re-read and re-arm everything
        else:
            self._connected.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                self._cond.wait_for(lambda: self._dirty or self._stop.is_set())
                parts, self._dirty = self._dirty, set()
                serving = self._requested
            if self._stop.is_set():
                return
            try:
                view = self._reload(parts, self._view)
            except _ZK_ERRORS as exc:
                log.info("metadata reload deferred until ZooKeeper is back (%s)", type(exc).__name__)
                with self._cond:
                    self._dirty |= parts
                self._connected.clear()
                self._connected.wait(timeout=1.0)  # also woken by stop(); bounded in any case
                continue
            except Exception:  # a bad znode must not kill the follower thread
                log.exception("metadata reload failed")
                self._stop.wait(1.0)
                self._mark(parts)
                continue
            with self._cond:
                self._view = view
            for listener in self._listeners:
                try:
                    listener(view)
                except Exception:  # one listener's failure is its own to report
                    log.exception("metadata listener failed")
            with self._cond:
                self._completed = max(self._completed, serving)
                self._cond.notify_all()

    def _reload(self, parts: set[str], old: ClusterView) -> ClusterView:
        servers = self._read_servers() if "servers" in parts else old.servers
        coordinator = self._read_coordinator() if "coordinator" in parts else old.coordinator
        if "catalog" in parts:
            version, cluster_id, databases, tables, dropped = self._read_catalog()
        else:
            version, cluster_id, databases, tables, dropped = (old.version, old.cluster_id, old.databases,
                                                               old.tables, old.dropped)
            if "assignments" in parts:
                tables = self._read_assignments(tables)
        return ClusterView(version=version, cluster_id=cluster_id, servers=servers,
                           coordinator=coordinator, databases=databases, tables=tables, dropped=dropped)

    def _read_servers(self) -> dict[int, ServerInfo]:
        client, watch = self._client, self._watchers["servers"]
        names = client.get_children(self._paths.servers, watch=watch)
        # A data watch on each registration: its catalog_version moves as its mirror applies DDL.
        pending = [client.get_async(f"{self._paths.servers}/{name}", watch=watch) for name in names]
        servers = {}
        for result in pending:
            try:
                data, _ = result.get()
            except NoNodeError:
                continue  # gone since the listing; the children watch has fired
            info = ServerInfo.from_json(decode(data))
            servers[info.id] = info
        return servers

    def _read_coordinator(self) -> int | None:
        client, watch = self._client, self._watchers["coordinator"]
        try:
            data, _ = client.get(self._paths.active_coordinator, watch=watch)
        except NoNodeError:
            if client.exists(self._paths.active_coordinator, watch=watch) is None:
                return None
            return self._read_coordinator()
        return int(decode(data)["id"])

    def _read_catalog(self) -> tuple[int, str | None, frozenset[str], dict[TablePath, TableRecord], frozenset[str]]:
        """The catalog at one version: everything is read, then the version znode again; when a
        DDL committed meanwhile (its modification moved, or a znode of the listing vanished),
        everything is read again. Every DDL bumps the version in its own transaction, and one
        session's reads never go back in time, so an unchanged version means every read saw the
        same catalog: a rename committing between two reads can never make a table look absent."""
        attempt = 0
        while True:
            try:
                return self._read_catalog_once()
            except _CatalogMoved:
                attempt += 1
                if attempt % 10 == 0:
                    log.info("the catalog keeps changing while it is read (%d attempts); reading again", attempt)
                    self._stop.wait(0.05)

    def _read_catalog_once(self) -> tuple[int, str | None, frozenset[str], dict[TablePath, TableRecord],
                                          frozenset[str]]:
        client, paths, watch = self._client, self._paths, self._watchers["catalog"]
        try:
            data, stat = client.get(paths.version, watch=watch)
        except NoNodeError:
            if client.exists(paths.version, watch=watch) is None:
                return 0, None, frozenset(), {}, frozenset()  # not bootstrapped: no coordinator was ever elected
            raise _CatalogMoved() from None
        try:
            version = int(decode(data)["version"])
            cluster_id = decode(client.get(paths.cluster_id)[0])["cluster_id"]
            databases = client.get_children(paths.databases)
            listings = {db: client.get_children_async(paths.database(db)) for db in databases}
            dropped = client.get_children_async(paths.dropped)
            entries = {TablePath(db, name): client.get_async(paths.table(db, name))
                       for db, listing in listings.items() for name in listing.get()}
            assignments = {}
            for path, pending in entries.items():
                entry = decode(pending.get()[0])
                assignments[path] = (entry, client.get_async(paths.assignment(entry["table_id"]),
                                                              watch=self._watchers["assignments"]))
            client.get_children(paths.assignments, watch=self._watchers["assignments"])
            tables: dict[TablePath, TableRecord] = {}
            for path, (entry, pending) in assignments.items():
                assignment = decode(pending.get()[0])
                tables[path] = TableRecord(
                    table_id=entry["table_id"], descriptor=TableDescriptor.from_json(entry["descriptor"]),
                    buckets=tuple(BucketAssignment.from_json(b) for b in assignment["buckets"]))
        except NoNodeError:
            raise _CatalogMoved() from None  # a DDL removed what the listing named: read again
        try:
            dropped_ids = frozenset(dropped.get())
        except NoNodeError:
            dropped_ids = frozenset()  # a cluster from before DROP records (the parent is made at start)
        now = client.exists(paths.version)
        if now is None or now.mzxid != stat.mzxid:
            raise _CatalogMoved()
        return version, cluster_id, frozenset(databases), tables, dropped_ids

    def _read_assignments(self, tables: dict[TablePath, TableRecord]) -> dict[TablePath, TableRecord]:
        """The tables with their buckets' LeaderAndIsr re-read (elections and ISR changes move
        them without a catalog version), re-arming the data watches."""
        client, paths, watch = self._client, self._paths, self._watchers["assignments"]
        client.get_children(paths.assignments, watch=watch)
        pending = {path: client.get_async(paths.assignment(record.table_id), watch=watch)
                   for path, record in tables.items()}
        out = dict(tables)
        for path, result in pending.items():
            try:
                assignment = decode(result.get()[0])
            except NoNodeError:
                continue  # dropped: the catalog version watch brings that
            out[path] = replace(tables[path], buckets=tuple(BucketAssignment.from_json(b)
                                                            for b in assignment["buckets"]))
        return out
