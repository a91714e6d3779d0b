"""The coordinator: one server, elected through ZooKeeper, that alone changes the cluster catalog.

Every server campaigns with kazoo's ``Election`` recipe (a ZooKeeper lock: the lowest ephemeral
sequential contender leads), so there is no separate ``flightstore coordinator`` process to run: a
cluster of N servers survives N-1 of them, the coordinator included. Fluss runs its coordinator as
a separate process; flightstore's coordinator does little (DDL and bucket assignment) and a
separate process would be one more thing to keep alive, so it lives in the servers.

On winning, a server

1. bumps ``coordinator/epoch`` (compare-and-set on the znode version). Every later write of its
   reign is a transaction that first checks that version: when a newer coordinator has been elected
   (say this one's session expired while it was paused) its writes fail and it steps down. This
   is the fencing a bucket leader epoch will rely on when replication moves leaders;
2. publishes ``coordinator/active`` (ephemeral: it disappears with the session);
3. bootstraps the catalog the first time any coordinator runs (cluster id, version, ``default``);
4. answers DDL requests in sequence order (protocol in :mod:`flightstore.cluster.ddl`), assigning
   new tables' buckets round-robin over the live servers (:mod:`flightstore.cluster.assignment`).

It leads until it stops, loses its session, or is fenced; then it campaigns again. Seams left for
later: the ``_servers_changed`` hook (failover would move the leaders of a dead server's buckets
to live replicas and bump their leader epochs, in the same fenced transactions).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NoNodeError, RolledBackError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.election import Election

from flightstore.alter import PartitionLimits, apply_changes, change_from_json
from flightstore.catalog import DEFAULT_DATABASE
from flightstore.cluster.assignment import round_robin
from flightstore.cluster.ddl import error_response
from flightstore.cluster.failover import elect, move_off
from flightstore.cluster.layout import ZkPaths, decode, encode
from flightstore.cluster.view import BucketAssignment
from flightstore.config import server_option
from flightstore.errors import AlreadyExists, DatabaseNotFound, FlightstoreError, InvalidInput, TableNotFound
from flightstore.names import check_name
from flightstore.schema import TableDescriptor, TablePath
from flightstore.store import new_table_descriptor

__all__ = ["Coordinator"]

log = logging.getLogger("flightstore.cluster")

_ZK_ERRORS = (KazooException, KazooTimeoutError)
RESPONSE_TTL_S = 3600  # answers nobody collected (their requester died) are removed after this


class Fenced(Exception):
    """A newer coordinator exists: this one must stop writing."""


def _fenced_out(results: list) -> bool:
    """Whether a fenced transaction failed on its first operation, the epoch check."""
    return isinstance(results[0], (BadVersionError, NoNodeError))


class Coordinator:
    """Campaigns for server ``server_id`` (reachable at ``uri``) and leads while elected."""

    def __init__(self, client: KazooClient, paths: ZkPaths, server_id: int, uri: str) -> None:
        self._client = client
        self._paths = paths
        self.server_id = server_id
        self.uri = uri
        self.epoch: int | None = None  # set while leading
        self._fence_version = -1
        self._stop = threading.Event()
        self._session_lost = threading.Event()
        self._connected = threading.Event()
        self._wake = threading.Event()
        self._election: Election | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._campaign, name="cluster-coordinator", daemon=True)
        self.leading = threading.Event()
        self.partition_limits = PartitionLimits()  # the server's max.partition.num / max.bucket.num
        self.options: dict[str, Any] = {}  # the server's options (replication defaults, timeouts)
        self.on_lead: Callable[[int], None] | None = None  # tests and logs: called with the epoch
        self._dead_since: dict[int, float] = {}  # replica holders seen down, since (monotonic)

    # ---- life ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self._client.connected:
            self._connected.set()
        self._client.add_listener(self._on_state)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop leading or campaigning; returns once the campaign thread ended (or ``timeout``)."""
        with self._lock:  # a campaign starting now sees the stop, or its election is cancelled
            self._stop.set()
            election = self._election
        self._wake.set()
        self._connected.set()
        if election is not None:
            election.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._client.remove_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._session_lost.set()
        if state == KazooState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        self._wake.set()

    def _campaign(self) -> None:
        while not self._stop.is_set():
            if not self._connected.wait(timeout=1.0):
                continue
            try:
                self._session_lost.clear()
                with self._lock:
                    if self._stop.is_set():
                        break
                    election = self._election = Election(self._client, self._paths.election,
                                                         str(self.server_id))
                election.run(self._lead)
            except _ZK_ERRORS as exc:
                if not self._stop.is_set():
                    log.info("coordinator campaign interrupted (%s); campaigning again", type(exc).__name__)
                    self._stop.wait(0.5)  # let the connection settle before contending again
            except Exception:  # keep campaigning whatever happened
                log.exception("coordinator failed; campaigning again")
                self._stop.wait(1.0)
            finally:
                self.leading.clear()
                self.epoch = None

    # ---- leading ------------------------------------------------------------------------------
    def _lead(self) -> None:
        try:
            self._take_office()
        except (Fenced, BadVersionError):
            return
        log.info("server %d is the coordinator (epoch %d)", self.server_id, self.epoch)
        self.leading.set()
        if self.on_lead is not None:
            self.on_lead(self.epoch)
        try:
            self._collect_stale_responses()
            while not self._stop.is_set() and not self._session_lost.is_set():
                self._wake.clear()
                names = sorted(self._client.get_children(self._paths.requests, watch=self._on_requests))
                for name in names:
                    if self._stop.is_set():
                        break
                    self._answer(name)
                live = {int(n) for n in self._client.get_children(self._paths.servers, watch=self._on_requests)}
                self._place_replicas(live)
                self._wake.wait(timeout=1.0 if self._dead_since else 5.0)  # watches wake us sooner
        except Fenced:
            log.warning("server %d is no longer the coordinator: a newer one was elected", self.server_id)
        finally:
            self.leading.clear()
            self._resign()

    def _on_requests(self, event: object) -> None:
        self._wake.set()

    # ---- leaders and replicas -----------------------------------------------------------------
    def _place_replicas(self, live: set[int]) -> None:
        """Bring every bucket's LeaderAndIsr in line with the live servers: elect a live in-sync
        leader where the leader died, drop dead followers from the ISR, and move the replicas of a
        server dead for longer than ``cluster.replica.dead-timeout`` (or being decommissioned) to
        live servers. Each table's assignment is one compare-and-set in a fenced transaction."""
        now = time.monotonic()
        unclean = server_option(self.options, "unclean.leader.election.enable")
        dead_timeout = server_option(self.options, "cluster.replica.dead-timeout") / 1000
        try:
            leaving = {int(n) for n in self._client.get_children(self._paths.decommissioned,
                                                                 watch=self._on_requests)}
        except NoNodeError:
            leaving = set()
        assignments = self._client.get_children(self._paths.assignments)
        holders: dict[int, int] = {}
        records = {}
        for table_id in assignments:
            try:
                data, stat = self._client.get(self._paths.assignment(table_id))
            except NoNodeError:
                continue
            records[table_id] = (decode(data), stat)
            for bucket in decode(data).get("buckets", []):
                for r in bucket.get("replicas", [bucket.get("leader")]):
                    holders[int(r)] = holders.get(int(r), 0) + 1
        for server in list(self._dead_since):
            if server in live or server not in holders:
                del self._dead_since[server]
        for server in holders:
            if server not in live:
                self._dead_since.setdefault(server, now)
        expired = {s for s, since in self._dead_since.items() if now - since >= dead_timeout}
        movable = live - leaving
        for table_id, (record, stat) in records.items():
            buckets = [BucketAssignment.from_json(b) for b in record.get("buckets", [])]
            factor = int(record.get("replication_factor") or max((len(b.replicas) for b in buckets), default=1))
            changed = []
            for bucket in buckets:
                new = elect(bucket, live, unclean=unclean, avoid=leaving)
                for gone in sorted((expired | leaving) & set(new.replicas)):
                    new = move_off(new, gone, factor, movable, holders)
                changed.append(new)
            if changed == buckets:
                continue
            for old, new in zip(buckets, changed):
                if old.leader != new.leader:
                    log.warning("table %s bucket %d: leader %s -> %s (epoch %d), in sync %s", record.get("path"),
                                buckets.index(old), old.leader, new.leader, new.leader_epoch, list(new.isr))
            transaction = self._fenced()
            transaction.set_data(self._paths.assignment(table_id),
                                 encode({**record, "buckets": [b.to_json() for b in changed]}),
                                 version=stat.version)
            results = transaction.commit()
            if _fenced_out(results):
                raise Fenced()
            if any(isinstance(r, Exception) for r in results):
                self._wake.set()  # the assignment moved meanwhile (an ISR change): look again

    def _take_office(self) -> None:
        client, paths = self._client, self._paths
        client.ensure_path(paths.coordinator_epoch)
        data, stat = client.get(paths.coordinator_epoch)
        epoch = int(decode(data).get("epoch", 0)) + 1
        stat = client.set(paths.coordinator_epoch, encode({"epoch": epoch, "server": self.server_id}),
                               version=stat.version)
        self.epoch, self._fence_version = epoch, stat.version
        active = encode({"id": self.server_id, "uri": self.uri, "epoch": epoch})
        transaction = self._fenced()
        stale = client.exists(paths.active_coordinator)
        if stale is not None:  # a deposed coordinator's, still in its (expiring) session
            transaction.delete(paths.active_coordinator, version=stale.version)
        transaction.create(paths.active_coordinator, active, ephemeral=True)
        self._commit(transaction)
        if client.exists(paths.version) is None:
            bootstrap = self._fenced()
            bootstrap.create(paths.cluster_id, encode({"cluster_id": uuid.uuid4().hex}))
            bootstrap.create(paths.version, encode({"version": 1, "assigned": 0}))
            bootstrap.create(paths.database(DEFAULT_DATABASE), encode({}))
            self._commit(bootstrap)

    def _resign(self) -> None:
        try:
            data, stat = self._client.get(self._paths.active_coordinator)
            if decode(data).get("epoch") == self.epoch:
                self._client.delete(self._paths.active_coordinator, version=stat.version)
        except _ZK_ERRORS:
            pass  # gone with the session, or taken over

    def _fenced(self) -> Any:
        transaction = self._client.transaction()
        transaction.check(self._paths.coordinator_epoch, self._fence_version)
        return transaction

    def _commit(self, transaction: Any) -> None:
        results = transaction.commit()
        failures = [r for r in results if isinstance(r, Exception)]
        if not failures:
            return
        if _fenced_out(results):
            raise Fenced()
        raise next(f for f in failures if not isinstance(f, RolledBackError))

    def _collect_stale_responses(self) -> None:
        now_ms = time.time() * 1000
        for name in self._client.get_children(self._paths.responses):
            try:
                _, stat = self._client.get(self._paths.response(name))
                if now_ms - stat.ctime > RESPONSE_TTL_S * 1000:
                    self._client.delete(self._paths.response(name))
            except NoNodeError:
                continue

    # ---- answering DDL ------------------------------------------------------------------------
    def _answer(self, name: str) -> None:
        client, paths = self._client, self._paths
        request_path = f"{paths.requests}/{name}"
        try:
            data, request_stat = client.get(request_path)
        except NoNodeError:
            return  # withdrawn by its requester
        version_data, version_stat = client.get(paths.version)
        state = decode(version_data)
        transaction = self._fenced()
        try:
            request = decode(data)
            result = self._apply(request, transaction, state)
        except FlightstoreError as exc:
            transaction = self._fenced()
            response = error_response(exc, int(state["version"]))
        except _ZK_ERRORS:
            raise  # ZooKeeper trouble is no answer: the request stays pending for the next attempt
        except Exception as exc:  # a bad request must be answered, not retried forever
            log.exception("DDL request %s failed", name)
            transaction = self._fenced()
            response = error_response(FlightstoreError(f"internal error: {type(exc).__name__}: {exc}"),
                                      int(state["version"]))
        else:
            if result.pop("changed"):
                state = {**state, "version": int(state["version"]) + 1}
                transaction.set_data(paths.version, encode(state), version=version_stat.version)
            response = {"ok": True, "version": int(state["version"]), "result": result}
        transaction.create(paths.response(name), encode(response))
        transaction.delete(request_path, version=request_stat.version)
        results = transaction.commit()
        if _fenced_out(results):
            raise Fenced()
        if any(isinstance(r, Exception) for r in results):
            if client.exists(request_path) is None:
                return  # withdrawn while we worked: nothing was committed, as its requester was told
            raise Fenced()  # the catalog moved under us: only another coordinator writes it

    def _apply(self, request: dict[str, Any], transaction: Any, state: dict[str, Any]) -> dict[str, Any]:
        """Add ``request``'s catalog change to ``transaction``; return the answer's ``result``
        (with ``changed``: whether the catalog changes). Refusals raise the single-server error."""
        op = request.get("op")
        if op == "create_database":
            return self._create_database(request, transaction)
        if op == "drop_database":
            return self._drop_database(request, transaction)
        if op == "create_table":
            return self._create_table(request, transaction, state)
        if op == "drop_table":
            return self._drop_table(request, transaction)
        if op == "alter_table":
            return self._alter_table(request, transaction)
        raise InvalidInput(f"unknown DDL operation {op!r}")

    def _alter_table(self, request: dict, transaction: Any) -> dict:
        """ALTER TABLE: the changes applied to the descriptor in ZooKeeper (the single-server rules
        of :mod:`flightstore.alter`); a rename moves the table's znode, keeping its id and buckets."""
        path = TablePath(request["database"], request["table"])
        try:
            data, stat = self._client.get(self._paths.table(path.database, path.table))
        except NoNodeError:
            raise TableNotFound(f"table {path} does not exist") from None
        record = decode(data)
        old = TableDescriptor.from_json(record["descriptor"])
        changes = [change_from_json(c) for c in request["changes"]]
        new = apply_changes(old, changes, self.partition_limits)
        if new == old:
            return {"changed": False}
        record = {**record, "descriptor": new.to_json()}
        if new.path == path:
            transaction.set_data(self._paths.table(path.database, path.table), encode(record),
                                 version=stat.version)
            return {"changed": True}
        if self._client.exists(self._paths.table(new.path.database, new.path.table)) is not None:
            raise AlreadyExists(f"table {new.path} already exists")
        transaction.delete(self._paths.table(path.database, path.table), version=stat.version)
        transaction.create(self._paths.table(new.path.database, new.path.table), encode(record))
        assignment, assignment_stat = self._client.get(self._paths.assignment(record["table_id"]))
        transaction.set_data(self._paths.assignment(record["table_id"]),
                             encode({**decode(assignment), "path": str(new.path)}),
                             version=assignment_stat.version)
        return {"changed": True}

    def _create_database(self, request: dict, transaction: Any) -> dict:
        name = check_name(request["name"], "database")
        if self._client.exists(self._paths.database(name)) is not None:
            if request.get("if_not_exists"):
                return {"changed": False, "created": False}
            raise AlreadyExists(f"database {name!r} already exists")
        transaction.create(self._paths.database(name), encode({}))
        return {"changed": True, "created": True}

    def _drop_database(self, request: dict, transaction: Any) -> dict:
        name = str(request["name"])
        try:
            tables = self._client.get_children(self._paths.database(name))
        except NoNodeError:
            if request.get("if_exists"):
                return {"changed": False, "dropped": False}
            raise DatabaseNotFound(f"database {name!r} does not exist") from None
        if tables and not request.get("cascade"):
            raise InvalidInput(f"database {name!r} is not empty ({len(tables)} tables); use DROP "
                               f"DATABASE {name} CASCADE")
        for table in tables:
            self._delete_table(TablePath(name, table), transaction)
        transaction.delete(self._paths.database(name))
        return {"changed": True, "dropped": True}

    def _create_table(self, request: dict, transaction: Any, state: dict) -> dict:
        requested = TableDescriptor.from_json(request["descriptor"])
        descriptor = new_table_descriptor(requested.path, descriptor=requested)
        path = descriptor.path
        if self._client.exists(self._paths.database(path.database)) is None:
            raise DatabaseNotFound(f"database {path.database!r} does not exist")
        if self._client.exists(self._paths.table(path.database, path.table)) is not None:
            if request.get("if_not_exists"):
                return {"changed": False, "created": False}
            raise AlreadyExists(f"table {path} already exists")
        live = [int(name) for name in self._client.get_children(self._paths.servers)]
        try:  # servers being decommissioned take no new replica
            leaving = {int(n) for n in self._client.get_children(self._paths.decommissioned)}
        except NoNodeError:
            leaving = set()
        live = [s for s in live if s not in leaving] or live
        assigned = int(state.get("assigned", 0))
        factor = descriptor.option("table.replication.factor") or server_option(
            self.options, "default.replication.factor")
        buckets = round_robin(descriptor.num_buckets, live, start=assigned, replication_factor=factor)
        table_id = uuid.uuid4().hex
        descriptor = descriptor.with_version(1)
        transaction.create(self._paths.table(path.database, path.table),
                           encode({"table_id": table_id, "descriptor": descriptor.to_json()}))
        transaction.create(self._paths.assignment(table_id),
                           encode({"path": str(path), "coordinator_epoch": self.epoch,
                                   "replication_factor": factor,
                                   "buckets": [b.to_json() for b in buckets]}))
        state["assigned"] = assigned + descriptor.num_buckets
        return {"changed": True, "created": True, "table_id": table_id,
                "leaders": [b.leader for b in buckets]}

    def _drop_table(self, request: dict, transaction: Any) -> dict:
        path = TablePath(request["database"], request["table"])
        if self._client.exists(self._paths.database(path.database)) is None:
            if request.get("if_exists"):
                return {"changed": False, "dropped": False}
            raise DatabaseNotFound(f"database {path.database!r} does not exist")
        if self._client.exists(self._paths.table(path.database, path.table)) is None:
            if request.get("if_exists"):
                return {"changed": False, "dropped": False}
            raise TableNotFound(f"table {path} does not exist")
        self._delete_table(path, transaction)
        return {"changed": True, "dropped": True}

    def _delete_table(self, path: TablePath, transaction: Any) -> None:
        """Remove the table from the catalog and record its DROP (the record is what lets every
        server delete the table's data: a view that merely lacks a table never does)."""
        data, _ = self._client.get(self._paths.table(path.database, path.table))
        table_id = decode(data)["table_id"]
        transaction.delete(self._paths.assignment(table_id))
        transaction.delete(self._paths.table(path.database, path.table))
        transaction.create(self._paths.dropped_table(table_id), encode({"path": str(path)}))
