"""One server's membership in a cluster: session, registration, metadata, mirror, coordinator role.

``ClusterMember.start`` joins in this order:

1. connect to ZooKeeper (session timeout ``zookeeper.session-timeout``) and create the layout;
2. check the data directory belongs here (:meth:`CatalogMirror.check`); a new (empty) one first
   leaves every in-sync replica set and leadership ZooKeeper still gives it
   (:meth:`ClusterMember._resign_lost_replicas`), before any view is applied;
3. start following the metadata (:class:`MetadataCache`) and campaigning to coordinate;
4. wait until the catalog exists (a coordinator bootstrapped it) and the local mirror applied it;
5. register ``servers/<id>`` (ephemeral, with the advertised URI): from then on the server is live
   and counted when new tables' buckets are assigned.

A server killed with -9 keeps its registration until ZooKeeper expires its session; restarted
before that, it waits for the stale registration to expire (a live server with the same id makes
start fail with :class:`ServerIdInUse`). After a lost session (a long pause, a ZooKeeper outage)
kazoo opens a new one: the member registers again and the cache re-reads everything.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from flightstore.cluster.coordinator import Coordinator
from flightstore.cluster.ddl import DdlClient
from flightstore.cluster.failover import resign, with_isr
from flightstore.cluster.identity import PeerIdentity
from flightstore.cluster.layout import ZkAddress, ZkPaths, decode, encode
from flightstore.cluster.metadata import MetadataCache
from flightstore.cluster.mirror import CatalogMirror
from flightstore.cluster.security import ClusterSecurity, cluster_secret
from flightstore.cluster.store import ClusterStore
from flightstore.cluster.view import BucketAssignment, ClusterView, ServerInfo
from flightstore.config import SERVER_OPTIONS
from flightstore.errors import CoordinatorUnavailable, InvalidInput, ServerIdInUse, Unavailable
from flightstore.replica.manager import PENDING, ReplicaManager
from flightstore.schema import TablePath

__all__ = ["ClusterConfig", "ClusterMember", "join"]

log = logging.getLogger("flightstore.cluster")

_ZK_ERRORS = (KazooException, KazooTimeoutError)


@dataclass(frozen=True)
class ClusterConfig:
    """How a server joins: ZooKeeper address, its id, the URI it is reached at, timeouts (ms)."""

    zookeeper: ZkAddress
    server_id: int
    advertised_uri: str | None = None  # None: grpc://HOST:PORT of the listening address
    session_timeout_ms: int = SERVER_OPTIONS["zookeeper.session-timeout"].default
    ddl_timeout_ms: int = SERVER_OPTIONS["cluster.ddl-timeout"].default
    secret_key: bytes | None = None  # the bytes of --cluster-secret-file (flightstore.cluster.security)


def join(config: ClusterConfig, store: ClusterStore, host: str, port: int, *, tls: bool = False) -> ClusterMember:
    """Start the membership of a server listening on ``host:port`` (the server's one hook);
    ``tls``: it serves ``grpc+tls://`` only, and so must advertise."""
    scheme = "grpc+tls" if tls else "grpc"
    if config.advertised_uri is None:
        config = replace(config, advertised_uri=f"{scheme}://{host}:{port}")
    elif not config.advertised_uri.startswith(f"{scheme}://"):
        raise InvalidInput(f"--advertised-uri {config.advertised_uri} must start with {scheme}:// (the server "
                           f"{'serves TLS only' if tls else 'has no TLS certificate'})")
    member = ClusterMember(config, store)
    member.start()
    return member


class ClusterMember:
    """Joins ``store`` to the cluster of ``config``; :meth:`start`, then :meth:`stop`."""

    def __init__(self, config: ClusterConfig, store: ClusterStore) -> None:
        if config.advertised_uri is None:
            raise ValueError("ClusterMember needs the advertised URI (see join())")
        self.config = config
        self.store = store
        self.paths = ZkPaths(config.zookeeper.root)
        self.client = KazooClient(hosts=config.zookeeper.hosts,
                                  timeout=config.session_timeout_ms / 1000,
                                  connection_retry={"max_tries": -1, "max_delay": 1.0},
                                  command_retry={"max_tries": 3, "max_delay": 1.0})
        self.metadata = MetadataCache(self.client, self.paths)
        self.mirror = CatalogMirror(store, config.server_id)
        self.coordinator = Coordinator(self.client, self.paths, config.server_id, config.advertised_uri)
        self.coordinator.partition_limits = store.partition_limits
        self.coordinator.options = dict(store.options)
        store.initial_leadership = PENDING  # no bucket takes writes before the view says who leads
        self.replicas = ReplicaManager(store, config.server_id, store.options, uri_of=self._uri_of,
                                       connect=store.peers.client, call_options=store.peers.stream_options,
                                       adjust_isr=self.adjust_isr)
        self.ddl = DdlClient(self.client, self.paths, config.server_id)
        self.secret: bytes | None = None  # set on joining (flightstore.cluster.security.cluster_secret)
        self.security = ClusterSecurity(self.client, self.paths, keyed=config.secret_key is not None)
        self.identity: PeerIdentity | None = None  # this server's peer credential (same)
        self.on_decommissioned: Callable[[], None] | None = None  # the server stops itself
        self._registered = threading.Event()
        self._reregister = threading.Event()
        self._stop = threading.Event()
        self._keeper = threading.Thread(target=self._keep_registered, name="cluster-registration",
                                        daemon=True)

    @property
    def server_id(self) -> int:
        return self.config.server_id

    @property
    def is_coordinator(self) -> bool:
        return self.coordinator.leading.is_set()

    def view(self) -> ClusterView:
        return self.metadata.view()

    # ---- joining and leaving ------------------------------------------------------------------
    def start(self, timeout: float | None = None) -> None:
        """Join the cluster; raises a :class:`FlightstoreError` (and leaves nothing behind) when
        ZooKeeper is unreachable, the data directory belongs elsewhere or the id is taken."""
        timeout = timeout if timeout is not None else max(30.0, 3 * self.config.session_timeout_ms / 1000)
        deadline = time.monotonic() + timeout
        try:
            self.client.start(timeout=timeout)
        except KazooTimeoutError:
            self.client.stop()
            self.client.close()
            raise Unavailable(f"cannot connect to ZooKeeper at {self.config.zookeeper.hosts} within "
                              f"{timeout:g} s") from None
        try:
            for parent in self.paths.persistent_parents():
                self.client.ensure_path(parent)
            cluster_id = self._cluster_id()
            fresh = self.mirror.check(cluster_id)
            self.secret = cluster_secret(self.client, self.paths, self.config.secret_key)
            self.security.on_applied = self._publish_async
            self.security.start(max(1.0, deadline - time.monotonic()))
            if self.security.users() is not None and self.config.secret_key is None:
                raise InvalidInput("this cluster has users: their tokens are signed with a secret derived from "
                                   "--cluster-secret-file; start this server with it (the same file as the others)")
            self.identity = PeerIdentity(self.secret, self.server_id)
            self.store.peers.identity = self.identity
            if fresh:  # before the first view is applied: it may still name this server leader
                self._resign_lost_replicas()
            self.mirror.on_applied = self._publish_applied
            self.mirror.after_reconcile = self.replicas.apply
            self.metadata.add_listener(self.mirror.apply)
            self.metadata.add_listener(self.replicas.apply)  # leaders and ISRs move without a version
            self.metadata.add_listener(self._watch_decommission)
            self.metadata.start()
            self.client.add_listener(self._on_state)
            self.coordinator.start()
            view = self.metadata.wait_for(lambda v: v.version > 0, max(0.0, deadline - time.monotonic()))
            if view is None:
                raise CoordinatorUnavailable("no coordinator bootstrapped the cluster catalog in time")
            self.mirror.check(view.cluster_id)
            if not self.mirror.wait_applied(view.version, max(0.0, deadline - time.monotonic())):
                raise Unavailable(f"could not apply the cluster catalog locally: {self.mirror.last_error}")
            self._register(deadline)
        except BaseException:
            self.stop()
            raise
        self.store.member = self
        self._keeper.start()
        log.info("server %d joined the cluster at %s as %s", self.server_id, self.config.zookeeper,
                 self.config.advertised_uri)

    def stop(self) -> None:
        """Leave: stop coordinating and following, close the session (the registration goes with
        it at once, so the others see this server down without waiting for a timeout)."""
        self._stop.set()
        self._reregister.set()
        self.store.member = None
        self.coordinator.stop()
        self.metadata.stop()
        self.replicas.close()
        if self._keeper.is_alive():
            self._keeper.join(10)
        try:
            self.client.stop()
        finally:
            self.client.close()

    def _cluster_id(self) -> str | None:
        try:
            return decode(self.client.get(self.paths.cluster_id)[0])["cluster_id"]
        except NoNodeError:
            return None

    # ---- registration -------------------------------------------------------------------------
    def _info(self) -> bytes:
        return encode(ServerInfo(self.server_id, self.config.advertised_uri, os.getpid(),
                                 self.mirror.applied_version,
                                 tuple(sorted(self.security.versions.items()))).to_json())

    def _register(self, deadline: float) -> None:
        path = self.paths.server(self.server_id)
        gone = threading.Event()
        while True:
            try:
                self.client.create(path, self._info(), ephemeral=True)
                self._registered.set()
                return
            except NodeExistsError:
                pass
            try:
                data, stat = self.client.get(path, watch=lambda event: gone.set())
            except NoNodeError:
                continue
            if stat.ephemeralOwner == self.client.client_id[0]:
                self.client.set(path, self._info())
                self._registered.set()
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                holder = ServerInfo.from_json(decode(data))
                raise ServerIdInUse(f"server id {self.server_id} is registered by a live server at "
                                    f"{holder.uri} (pid {holder.pid}); give each server its own "
                                    "--server-id")
            log.info("waiting for the previous registration of server %d to expire", self.server_id)
            gone.wait(remaining)
            gone.clear()

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._registered.clear()
        elif state == KazooState.CONNECTED and not self._registered.is_set():
            self._reregister.set()

    def _keep_registered(self) -> None:
        """Register again after a lost session (the ephemeral znode went with it)."""
        while not self._stop.is_set():
            self._reregister.wait()
            self._reregister.clear()
            if self._stop.is_set() or self._registered.is_set():
                continue
            try:
                self._register(time.monotonic() + 2 * self.config.session_timeout_ms / 1000 + 10)
                log.info("server %d registered again after a lost ZooKeeper session", self.server_id)
            except _ZK_ERRORS + (ServerIdInUse,) as exc:
                log.warning("registering again failed (%s); retrying", exc)
                self._stop.wait(1.0)
                self._reregister.set()

    # ---- decommission -------------------------------------------------------------------------
    def decommission(self, server_id: int) -> None:
        """Mark server ``server_id`` for decommission: the coordinator moves its replicas to other
        servers (a replacement catches up before the old copy goes) and elects other leaders; once
        it holds none, that server stops by itself."""
        view = self.view()
        if server_id not in view.servers:
            raise InvalidInput(f"server {server_id} is not a live server of this cluster "
                               f"(live: {', '.join(map(str, sorted(view.servers)))})")
        if len(view.servers) < 2:
            raise InvalidInput("the last live server cannot be decommissioned: nowhere to move its replicas")
        factors = [len(b.replicas) for r in view.tables.values() for b in r.buckets]
        if factors and max(factors) > len(view.servers) - 1:
            raise InvalidInput(f"a table has {max(factors)} replicas per bucket but only "
                               f"{len(view.servers) - 1} server(s) would be left to hold them")
        try:
            self.client.create(self.paths.decommission(server_id), encode({"requested_ms": int(time.time() * 1000)}))
        except NodeExistsError:
            pass  # already under way
        self.coordinator._wake.set()

    def _watch_decommission(self, view: ClusterView) -> None:
        """Stop this server once it is decommissioned and holds no replica any more."""
        if self.on_decommissioned is None or self._stop.is_set():
            return
        try:
            if self.client.exists(self.paths.decommission(self.server_id)) is None:
                return
        except _ZK_ERRORS:
            return
        if any(self.server_id in b.replicas for r in view.tables.values() for b in r.buckets):
            return
        log.warning("server %d is decommissioned and holds no replica: stopping", self.server_id)
        try:
            self.client.delete(self.paths.decommission(self.server_id))
        except _ZK_ERRORS + (NoNodeError,):
            pass
        callback, self.on_decommissioned = self.on_decommissioned, None
        callback()

    # ---- replicas -----------------------------------------------------------------------------
    def _uri_of(self, server_id: int) -> str | None:
        info = self.view().servers.get(server_id)
        return None if info is None else info.uri

    def adjust_isr(self, table_id: str, bucket: int, leader: int, epoch: int, isr: Sequence[int]) -> bool:
        """Set the ISR of a bucket this server leads (compare-and-set); False when ZooKeeper no
        longer names it leader at ``epoch`` (deposed: the view brings the new leader)."""
        path = self.paths.assignment(table_id)
        for _ in range(10):
            try:
                data, stat = self.client.get(path)
            except NoNodeError:
                return False
            except _ZK_ERRORS as exc:
                log.warning("ISR change of %s bucket %d not written (%s)", table_id, bucket, exc)
                return False
            record = decode(data)
            buckets = [BucketAssignment.from_json(b) for b in record["buckets"]]
            if bucket >= len(buckets):
                return False
            changed = with_isr(buckets[bucket], leader, epoch, isr)
            if changed is None:
                return False
            if changed == buckets[bucket]:
                return True
            buckets[bucket] = changed
            try:
                self.client.set(path, encode({**record, "buckets": [b.to_json() for b in buckets]}),
                                version=stat.version)
                return True
            except BadVersionError:
                continue  # another bucket's change (or the coordinator's) came first: re-read
            except _ZK_ERRORS as exc:
                log.warning("ISR change of %s bucket %d not written (%s)", table_id, bucket, exc)
                return False
        return False

    def _resign_lost_replicas(self) -> None:
        """This data directory is new (a lost disk, a replacement machine): the replicas the
        cluster thinks it holds are empty. Before the first view is applied (and before
        registering), leave every ISR (and give up any leadership: the coordinator elects another
        in-sync replica), so an empty replica never leads, serves or counts as a copy, not even
        for the moment between the first view and this (a view applied first made it lead from
        an empty log, and recorded that epoch at offset 0); it rejoins the ISR once it caught up.
        :class:`Unavailable` (start fails) when the assignments keep changing under it."""
        for table_id in self.client.get_children(self.paths.assignments):
            path = self.paths.assignment(table_id)
            for _ in range(10):
                try:
                    data, stat = self.client.get(path)
                except NoNodeError:
                    break
                record = decode(data)
                buckets = [BucketAssignment.from_json(b) for b in record["buckets"]]
                # The last in-sync copy, when remote storage holds the bucket, is rebuilt from there
                # as the table opens (up to the last uploaded offset, reported): it keeps its place.
                changed = [b if self.store.remote is not None and b.isr == (self.server_id,)
                           else resign(b, self.server_id) for b in buckets]
                if changed == buckets:
                    break
                try:
                    self.client.set(path, encode({**record, "buckets": [b.to_json() for b in changed]}),
                                    version=stat.version)
                    log.warning("server %d starts with an empty data directory: it left the in-sync "
                                "replicas of table %s and catches up as a follower", self.server_id,
                                record.get("path"))
                    break
                except BadVersionError:
                    continue
            else:  # never join with a role this empty directory cannot fill
                raise Unavailable(f"server {self.server_id} starts with an empty data directory but could not "
                                  f"leave the in-sync replicas of table {table_id} (its assignment kept changing)")

    def _publish_async(self) -> None:
        """Publish the users and grants versions this server applied (called on kazoo's watch
        thread: the write is sent, not awaited; one session's writes apply in order)."""
        if self._registered.is_set():
            self.client.set_async(self.paths.server(self.server_id), self._info())

    def _publish_applied(self, version: int) -> None:
        """Tell the others (and DDL requesters) which catalog version this server has applied."""
        if not self._registered.is_set():
            return
        try:
            self.client.set(self.paths.server(self.server_id), self._info())
        except _ZK_ERRORS:
            pass  # registering again writes the current version

    # ---- DDL ----------------------------------------------------------------------------------
    def run_ddl(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run ``request`` through the coordinator; return once this server applied it (and, for
        up to the DDL timeout, once every live server did, so the table is usable everywhere)."""
        timeout = self.config.ddl_timeout_ms / 1000
        deadline = time.monotonic() + timeout
        response = self.ddl.submit(request, timeout)
        version = int(response["version"])
        self.metadata.refresh(max(0.0, deadline - time.monotonic()))
        if not self.mirror.wait_applied(version, max(0.0, deadline - time.monotonic())):
            raise Unavailable(f"{request['op']} was committed (catalog version {version}) but this server "
                              f"has not applied it yet: {self.mirror.last_error or 'still applying'}")
        lagging = self.metadata.wait_for(
            lambda view: all(s.catalog_version >= version for s in view.servers.values()),
            max(0.0, deadline - time.monotonic()))
        if lagging is None:
            behind = sorted(i for i, s in self.view().servers.items() if s.catalog_version < version)
            log.warning("catalog version %d not yet applied by servers %s", version, behind)
        return response

    # ---- the metadata API over Flight ---------------------------------------------------------
    def describe(self, table: str | None = None) -> dict[str, Any]:
        """This server's view as JSON: servers, coordinator, catalog version and, per table,
        each bucket's leader, URI and availability (the ``flightstore.cluster`` action)."""
        view = self.view()
        path = TablePath.parse(table) if table else None
        replicas = self.replicas.status()["buckets"]
        if path is not None:
            replicas = [r for r in replicas if r["table"] == str(path)]
        return {"server_id": self.server_id, "uri": self.config.advertised_uri,
                "is_coordinator": self.is_coordinator, "applied_version": self.mirror.applied_version,
                **view.to_json(path), "replicas": replicas}
