"""One worker's membership in its group: the ZooKeeper-free counterpart of
:class:`~flightstore.cluster.member.ClusterMember`.

A :class:`WorkerMember` gives :class:`~flightstore.cluster.store.ClusterStore` and
:class:`~flightstore.cluster.table.ClusterTable` what a cluster member gives them (``view()``,
``metadata.wait_for``/``refresh``, ``replicas``, ``run_ddl``, ``server_id``, ``config``), from
announcements instead of ZooKeeper watches:

* worker 0 holds the :class:`~.catalog.WorkerCatalog` and the live workers' URIs; every change (a
  DDL, a worker joining or leaving) is one announcement with a higher generation, applied by worker
  0 itself and pushed to every live worker over Flight (the peer action ``flightstore.workers.view``)
  before the change is answered, so a table created through any worker is usable at once through
  every other;
* a worker k >= 1 joins by telling worker 0 its URI (``flightstore.workers.join``, answered with
  the current announcement), sends its DDL to worker 0 (``flightstore.workers.ddl``) and applies the
  announcements it is sent, newest generation only, in order (:class:`ViewHolder`).

Each announcement goes through the production catalog mirror and replica manager (bucket *b* of
every table led by worker ``b % N``, one replica), so storage, routing and forwarding are the
cluster's own code. Calls between workers carry a peer credential signed with the group's secret,
which worker 0 makes and hands to its children in their environment.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pyarrow import flight

from flightstore.cluster.ddl import raise_for_error
from flightstore.cluster.identity import PeerIdentity
from flightstore.cluster.mirror import CatalogMirror
from flightstore.cluster.store import ClusterStore
from flightstore.cluster.view import ClusterView, ServerInfo
from flightstore.cluster.workers.catalog import WorkerCatalog, view_from_json, view_to_json
from flightstore.errors import FlightstoreError, InvalidInput, Unauthorized, Unavailable, Unsupported
from flightstore.replica.manager import PENDING, ReplicaManager
from flightstore.schema import TablePath
from flightstore.server import tickets

__all__ = ["PUSH_TIMEOUT_S", "ViewHolder", "WorkerConfig", "WorkerMember"]

log = logging.getLogger("flightstore.workers")

PUSH_TIMEOUT_S = 30.0  # an announcement a live worker has not taken in this long is logged, not waited for


@dataclass(frozen=True)
class WorkerConfig:
    """Worker ``worker_id`` of ``workers``; ``root``: the data directory the user gave (worker 0's
    catalog file lives there); ``coordinator_uri``: worker 0 (None on worker 0 itself)."""

    worker_id: int
    workers: int
    root: str
    secret: bytes
    cluster_id: str | None = None  # a child's: handed over by worker 0 (worker 0 reads its catalog)
    coordinator_uri: str | None = None
    advertised_uri: str | None = None
    ddl_timeout_ms: int = 60_000
    # A call to a bucket whose worker is down waits this long for it to be back (ClusterStore
    # derives the wait as 2 x this + 10 s, as from a ZooKeeper session in a cluster).
    session_timeout_ms: int = 5_000

    @property
    def server_id(self) -> int:
        return self.worker_id


class ViewHolder:
    """The newest announcement as a :class:`ClusterView`; listeners see each in generation order.
    The interface :class:`~flightstore.cluster.table.ClusterTable` uses of the metadata cache."""

    def __init__(self, refresh: Callable[[], None] | None = None) -> None:
        self._view = ClusterView()
        self._generation = 0
        self._cond = threading.Condition()
        self._apply = threading.Lock()  # listeners run for one announcement at a time
        self._listeners: list[Callable[[ClusterView], None]] = []
        self._refresh = refresh

    def add_listener(self, listener: Callable[[ClusterView], None]) -> None:
        self._listeners.append(listener)

    def view(self) -> ClusterView:
        return self._view

    def publish(self, generation: int, view: ClusterView) -> bool:
        """Apply ``view`` unless a newer generation was applied; whether it was."""
        with self._apply:
            if generation <= self._generation:
                return False
            for listener in self._listeners:
                try:
                    listener(view)
                except Exception:  # noqa: BLE001 - a listener's failure is its own to report
                    log.exception("applying worker announcement %d failed", generation)
            with self._cond:
                self._view, self._generation = view, generation
                self._cond.notify_all()
        return True

    def wait_for(self, predicate: Callable[[ClusterView], bool], timeout: float) -> ClusterView | None:
        with self._cond:
            if self._cond.wait_for(lambda: predicate(self._view), timeout):
                return self._view
            return None

    def refresh(self, timeout: float) -> ClusterView | None:
        """Ask worker 0 for the newest announcement now (a child); the view after it."""
        if self._refresh is not None:
            try:
                self._refresh()
            except FlightstoreError as exc:
                log.info("refreshing the workers' view failed: %s", exc)
        return self._view


class WorkerMember:
    """Worker ``config.worker_id`` serving ``store`` (see the module docstring)."""

    def __init__(self, config: WorkerConfig, store: ClusterStore) -> None:
        self.config = config
        self.store = store
        self.secret = config.secret
        self.identity = PeerIdentity(config.secret, config.worker_id)
        self.catalog: WorkerCatalog | None = None  # worker 0's
        self.metadata = ViewHolder(None if config.worker_id == 0 else self._pull)
        self.mirror = CatalogMirror(store, config.worker_id)
        store.initial_leadership = PENDING  # no bucket takes writes before the view says who leads
        store.peers.identity = self.identity
        self.replicas = ReplicaManager(store, config.worker_id, store.options, uri_of=self._uri_of,
                                       connect=store.peers.client, call_options=store.peers.stream_options,
                                       adjust_isr=lambda *args: False)  # one replica: no ISR to adjust
        self.on_decommissioned: Callable[[], None] | None = None
        self.supervisor: Any = None  # worker 0's WorkerSupervisor, for describe()
        self._servers: dict[int, ServerInfo] = {}
        self._generation = 0
        self._announcing = threading.Lock()
        self._pushes = ThreadPoolExecutor(max_workers=max(1, config.workers - 1),
                                          thread_name_prefix="workers-announce")

    @property
    def server_id(self) -> int:
        return self.config.worker_id

    @property
    def is_coordinator(self) -> bool:
        return self.config.worker_id == 0

    def view(self) -> ClusterView:
        return self.metadata.view()

    # ---- joining and leaving ------------------------------------------------------------------
    def start(self) -> None:
        """Worker 0: open the catalog and announce itself; worker k: join worker 0. Raises a
        :class:`FlightstoreError` when the data directory belongs elsewhere or worker 0 refuses."""
        config = self.config
        if self.is_coordinator:
            self.catalog = WorkerCatalog(config.root, config.workers, self.store.partition_limits)
            cluster_id = self.catalog.cluster_id
        else:
            cluster_id = config.cluster_id
        self.mirror.check(cluster_id)
        self.mirror.after_reconcile = self.replicas.apply
        self.metadata.add_listener(self.mirror.apply)
        self.metadata.add_listener(self.replicas.apply)
        if self.is_coordinator:
            self.join(0, config.advertised_uri, os.getpid())
        else:
            answer = self._call(config.coordinator_uri, "flightstore.workers.join",
                                {"worker": config.worker_id, "uri": config.advertised_uri, "pid": os.getpid()})
            self.metadata.publish(int(answer["generation"]), view_from_json(answer))
        view = self.view()
        if not self.mirror.wait_applied(view.version, config.ddl_timeout_ms / 1000):
            raise Unavailable(f"worker {config.worker_id} could not apply the catalog: {self.mirror.last_error}")
        self.store.member = self
        log.info("worker %d of %d serving at %s", config.worker_id, config.workers, config.advertised_uri)

    def stop(self) -> None:
        self.store.member = None
        self._pushes.shutdown(wait=False, cancel_futures=True)
        self.replicas.close()

    def decommission(self, server_id: int) -> None:
        raise Unsupported("workers of one machine lead fixed buckets (b % workers): there is nothing "
                          "to decommission; stop the server instead")

    def _uri_of(self, server_id: int) -> str | None:
        info = self.view().servers.get(server_id)
        return None if info is None else info.uri

    # ---- worker 0: announcements --------------------------------------------------------------
    def join(self, worker: int, uri: str | None, pid: int) -> dict[str, Any]:
        """Worker ``worker`` serves at ``uri`` (worker 0; a restarted worker joins again)."""
        if not 0 <= worker < self.config.workers or not uri:
            raise InvalidInput(f"no worker {worker} in a group of {self.config.workers}")
        with self._announcing:
            self._servers[worker] = ServerInfo(worker, uri, pid, self.catalog.version)
            return self._announce(skip=worker)

    def leave(self, worker: int) -> None:
        """Worker ``worker`` stopped (worker 0's supervisor saw it): its buckets are unavailable
        until it joins again."""
        with self._announcing:
            if self._servers.pop(worker, None) is not None:
                self._announce()

    def _announce(self, skip: int | None = None) -> dict[str, Any]:
        """Apply the current state here and push it to every other live worker (under
        ``_announcing``); the announcement."""
        self._generation += 1
        state = self.catalog.state()
        servers = {i: ServerInfo(s.id, s.uri, s.pid, state["version"]) for i, s in self._servers.items()}
        data = view_to_json(state, servers, self._generation)
        self.metadata.publish(self._generation, view_from_json(data))
        pushes = [(i, self._pushes.submit(self._call, s.uri, "flightstore.workers.view", data))
                  for i, s in servers.items() if i not in (0, skip)]
        for worker, push in pushes:
            try:
                push.result(PUSH_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - a dead worker is the supervisor's to restart
                log.warning("worker %d did not take announcement %d: %s", worker, self._generation, exc)
        return data

    # ---- DDL ----------------------------------------------------------------------------------
    def run_ddl(self, request: dict[str, Any]) -> dict[str, Any]:
        """Apply ``request`` at worker 0; return once this worker applied it (worker 0 answers
        once every live worker took the announcement)."""
        if self.is_coordinator:
            with self._announcing:
                response = self.catalog.apply(request)
                if self.view().version < response["version"]:
                    self._announce()
        else:
            response = self._call(self.config.coordinator_uri, "flightstore.workers.ddl", {"request": request})
            raise_for_error(response)
            if self.view().version < int(response["version"]):
                self._pull()
        if not self.mirror.wait_applied(int(response["version"]), self.config.ddl_timeout_ms / 1000):
            raise Unavailable(f"{request['op']} was committed (catalog version {response['version']}) but "
                              f"this worker has not applied it yet: {self.mirror.last_error or 'still applying'}")
        return response

    # ---- the peer actions ---------------------------------------------------------------------
    def handle(self, kind: str, payload: dict[str, Any], peer: int | None) -> dict[str, Any]:
        """A ``flightstore.workers.*`` call of worker ``peer`` (None: not a worker: refused)."""
        if peer is None:
            raise Unauthorized("this call is open to the server's workers only")
        if kind == "flightstore.workers.view":
            self.metadata.publish(int(payload["generation"]), view_from_json(payload))
            return {"op": "applied", "generation": payload["generation"]}
        if not self.is_coordinator:
            raise InvalidInput(f"{kind} goes to worker 0")
        if kind == "flightstore.workers.join":
            if int(payload["worker"]) != peer:
                raise Unauthorized(f"worker {peer} cannot join as worker {payload['worker']}")
            return self.join(peer, str(payload["uri"]), int(payload.get("pid", 0)))
        if kind == "flightstore.workers.ddl":
            try:
                return {"op": "workers.ddl", **self.run_ddl(dict(payload["request"]))}
            except FlightstoreError as exc:
                return {"op": "workers.ddl", "ok": False, "version": self.view().version, "error": type(exc).__name__,
                        "message": str(exc)}
        if kind == "flightstore.workers.refresh":
            with self._announcing:
                state = self.catalog.state()
                return view_to_json(state, dict(self._servers), self._generation)
        raise InvalidInput(f"unknown workers call {kind!r}")

    def _pull(self) -> None:
        answer = self._call(self.config.coordinator_uri, "flightstore.workers.refresh", {})
        self.metadata.publish(int(answer["generation"]), view_from_json(answer))

    def _call(self, uri: str | None, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        if uri is None:
            raise Unavailable("worker 0 is not known")
        body = tickets.encode_custom({"op": kind, **payload, "peer": True})
        options = flight.FlightCallOptions(timeout=PUSH_TIMEOUT_S, headers=self.identity.headers())
        try:
            results = list(self.store.peers.client(uri).do_action(flight.Action(kind, body), options))
        except flight.FlightUnavailableError as exc:
            raise Unavailable(f"worker at {uri} is unavailable: {str(exc).splitlines()[0]}") from None
        except flight.FlightTimedOutError as exc:
            raise Unavailable(f"worker at {uri} did not answer in time: {str(exc).splitlines()[0]}") from None
        return tickets.decode_custom(results[0].body.to_pybytes())

    # ---- the metadata API over Flight ---------------------------------------------------------
    def describe(self, table: str | None = None) -> dict[str, Any]:
        """This worker's view as JSON (the ``flightstore.cluster`` action), with, on worker 0, the
        state of every worker process (restarts, last exit)."""
        view = self.view()
        path = TablePath.parse(table) if table else None
        replicas = self.replicas.status()["buckets"]
        if path is not None:
            replicas = [r for r in replicas if r["table"] == str(path)]
        out = {"server_id": self.server_id, "uri": self.config.advertised_uri, "is_coordinator": self.is_coordinator,
               "applied_version": self.mirror.applied_version, "workers": self.config.workers,
               **view.to_json(path), "replicas": replicas}
        if self.supervisor is not None:
            out["processes"] = self.supervisor.status()
        return out
