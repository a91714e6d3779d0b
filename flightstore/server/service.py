"""The Flight SQL server: Flight RPCs -> planner/executor/store, errors -> Flight status codes.

:class:`FlightSqlServer` holds the server's state (store, executor, authorizer, sessions, metrics,
background work) and its lifecycle; its RPCs live in modules named for what they hold, mixed into
it: :mod:`.reads` (GetFlightInfo, DoGet, metadata and read commands), :mod:`.writes` (DoPut),
:mod:`.actions` (DoAction, ListActions) and :mod:`.exchange` (DoExchange: the lookup stream).
Every RPC goes through :func:`.rpc._rpc`, so errors are translated in exactly one place,
:func:`.rpc._translate`; results are cut into Flight messages by :mod:`.messages`. :func:`serve`
runs a server until SIGTERM/SIGINT.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyarrow import flight

from flightstore import memory
from flightstore.acl import CLUSTER, Operation, Permission
from flightstore.cache import LruCache
from flightstore.cluster.identity import PEER_MIDDLEWARE, PeerMiddlewareFactory, peer_of
from flightstore.config import SERVER_OPTIONS, server_option, validate_server_options
from flightstore.errors import (
    DataDirectoryInUse,
    FlightstoreError,
    InvalidOption,
    Unauthenticated,
    Unauthorized,
    Unsupported,
)
from flightstore.remote import RemoteLogManager
from flightstore.replica.protocol import FETCH_OP
from flightstore.server import status, tickets
from flightstore.server.access import AccessChecks
from flightstore.server.actions import ActionRpcs, PreparedStatement
from flightstore.server.auth import AUTH_MIDDLEWARE, BasicAuthMiddlewareFactory, NoAuthHandler
from flightstore.server.authz import Authorizer
from flightstore.server.exchange import LookupStreamRpcs, LookupStreams
from flightstore.server.expiring import ExpiringSet
from flightstore.server.housekeeping import Housekeeping
from flightstore.server.logins import LoginGate
from flightstore.server.messages import MAX_BATCH_BYTES, rechunk
from flightstore.server.metrics import METRICS_MIDDLEWARE, ServerMetrics
from flightstore.server.metrics_http import ssl_context
from flightstore.server.partition_manager import AutoPartitionManager
from flightstore.server.peer import PeerRpcs
from flightstore.server.queries import RunningQueries
from flightstore.server.reads import ReadRpcs
from flightstore.server.rpc import _peer, _rpc
from flightstore.server.rpc import _translate as _translate  # re-exported: tests import it from here
from flightstore.server.session import Session
from flightstore.server.tls import TlsConfig
from flightstore.server.upload import UploadLimits
from flightstore.server.users import UserStore
from flightstore.server.writes import WriteRpcs
from flightstore.sql.execute import Executor
from flightstore.store import Store

__all__ = ["MAX_BATCH_BYTES", "FlightSqlServer", "rechunk", "serve"]

log = logging.getLogger("flightstore.server")
HARD_EXIT_MARGIN_S = 5.0  # after the shutdown grace: stopped queries end, then the process exits
MAX_SESSIONS = 4096  # client connections whose USE / session options are remembered


class FlightSqlServer(ReadRpcs, WriteRpcs, ActionRpcs, LookupStreamRpcs, PeerRpcs, AccessChecks,
                      flight.FlightServerBase):
    """flightstore's Flight SQL endpoint over one :class:`~flightstore.store.Store`."""

    def __init__(self, store: Store, location: str = "grpc://127.0.0.1:0", *,
                 users: UserStore | dict[str, str] | None = None, super_users: tuple[str, ...] = (),
                 tls: TlsConfig | None = None, token_ttl_ms: int | None = None,
                 max_tokens: int | None = None, lake: Any = None, retention_interval_s: float | None = None,
                 start_tierer: bool = True, **kwargs: Any) -> None:
        """``users`` (a UserStore, or a dict of plain passwords for tests and embedded use) turns
        on authentication and authorization; ``tls`` serves ``grpc+tls://`` (``location`` may say
        ``grpc://``: the scheme follows ``tls``). ``lake`` (a :class:`flightstore.lake.LakeSettings`)
        starts the background tierer of datalake-enabled tables (which only follows the lake's
        commits for retention and status when its ``tiering_enabled`` is off); with
        ``start_tierer`` off the caller starts it (a cluster member, once it joined).
        A background thread (:mod:`.housekeeping`) takes the KV snapshots ``kv.snapshot.interval``
        makes due and applies ``table.log.ttl`` every ``retention_interval_s`` (default: the
        ``log.retention.check-interval`` option); it stops with :meth:`shutdown`."""
        self.metrics = ServerMetrics(store)
        middleware = kwargs.setdefault("middleware", {})
        middleware[METRICS_MIDDLEWARE] = self.metrics.middleware()  # first: it times every call
        self.peers = PeerMiddlewareFactory()  # cluster mode: which calls come from peer servers
        middleware[PEER_MIDDLEWARE] = self.peers
        if isinstance(users, dict):
            users = UserStore.from_passwords(users)
        self.authenticator = None
        if users is not None:
            options = store.options
            self.authenticator = BasicAuthMiddlewareFactory(
                users, on_refused=self.metrics.refused, gate=LoginGate.from_options(options),
                token_ttl_ms=token_ttl_ms if token_ttl_ms is not None else server_option(options, "auth.token-ttl"),
                max_tokens=max_tokens if max_tokens is not None else server_option(options, "auth.max-tokens"))
            middleware[AUTH_MIDDLEWARE] = self.authenticator
        self.tls = tls
        if tls is not None:
            location = location.replace("grpc://", "grpc+tls://", 1).replace("grpc+tcp://", "grpc+tls://", 1)
            kwargs.update(tls.server_kwargs())
        super().__init__(location, auth_handler=NoAuthHandler(), **kwargs)
        status.quiet_tracebacks()  # until shutdown: no traceback in any error a client gets
        self._quiet = True
        self.store = store
        memory.configure(server_option(store.options, "query.memory-limit"))  # every read path's budget
        self._hidden_paths = tuple({str(store.data_dir), os.path.abspath(store.data_dir),
                                    os.path.realpath(store.data_dir)})
        # A cluster's users: authorization is on once the cluster has users.
        enabled = (lambda: not users.is_open) if hasattr(users, "is_open") else users is not None
        self.authz = Authorizer(store.data_dir, enabled=enabled, super_users=super_users)
        self.executor = Executor(store)
        self.upload_limits = UploadLimits.from_options(store.options)
        self.max_batch_rows = server_option(store.options, "server.max-batch-rows")  # see .messages
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # by gRPC peer, least recent first
        self._prepared: dict[bytes, PreparedStatement] = {}
        self._prepare_cache: LruCache[tuple, tuple] = LruCache(server_option(store.options, "sql.cache.entries"))
        self._results: dict[str, tuple[float, pa.Table, str | None]] = {}  # (kept at, rows, owner)
        self._ticket_key = os.urandom(32)  # binds inline result tickets to their user (tickets.py)
        self._cancelled = ExpiringSet()  # cancelled query tickets: bounded (size cap, time to live)
        self.queries = RunningQueries()  # DoGet streams of queries: CancelFlightInfo / shutdown stop them
        self.lookup_streams = LookupStreams()  # DoExchange lookup streams: shutdown sends them GOAWAY
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.cluster: Any = None  # the ClusterMember in cluster mode (flightstore.cluster.member)
        self.console: Any = None  # the web console once serve_console ran (flightstore.console)
        self.partition_manager = AutoPartitionManager(store).start()
        self.tierer: Any = None  # the lake's LakeTierer when this server tiers (flightstore.lake)
        if lake is not None:  # with tiering off it follows what a tiering job commits (retention, status)
            from flightstore.lake.tierer import LakeTierer
            self.tierer = LakeTierer(store, lake)
            if start_tierer:
                self.tierer.start()
            self.partition_manager.on_dropped = self.tierer.due_now
        if lake is not None:  # SQL reads the lake too: union reads, t$lake, time travel
            from flightstore.lake.catalog import LakeCatalog
            self.executor.lake = self.tierer.catalog if self.tierer is not None else LakeCatalog(lake)
            self.executor.tierer = self.tierer
        if retention_interval_s is None:
            retention_interval_s = server_option({}, "log.retention.check-interval") / 1000
        self.housekeeping = Housekeeping(store, retention_interval_s).start()
        self.remote_log: RemoteLogManager | None = None  # uploads to remote.data.dir
        if store.remote is not None:
            self.remote_log = RemoteLogManager(store, server_option(
                store.options, "remote.log.task-interval-duration")).start()

    def session(self, context: flight.ServerCallContext | None) -> Session:
        """The session of the connection ``context`` arrived on, keyed by its gRPC peer address
        (each ADBC/JDBC connection has its own channel): ``USE`` and session options hold per
        connection, as in a SQL database. Calls without a context (in-process) share one session.
        At most :data:`MAX_SESSIONS` are kept; the least recently used is forgotten first."""
        peer = _peer(context)
        with self._lock:
            session = self._sessions.get(peer)
            if session is None:
                session = self._sessions[peer] = Session()
                if len(self._sessions) > MAX_SESSIONS:
                    self._sessions.popitem(last=False)
            else:
                self._sessions.move_to_end(peer)
            return session

    @property
    def uri(self) -> str:
        return f"{'grpc+tls' if self.tls is not None else 'grpc'}://127.0.0.1:{self.port}"

    def shutdown(self, grace_s: float | None = None) -> None:
        """Stop accepting calls and wait for the running ones; past ``grace_s`` (default: the
        ``server.shutdown-grace`` option) stop every running query (its client gets CANCELLED).
        Subscriptions end at once; lookup streams are told to go away (GOAWAY): their clients
        half-close them once the lookups already sent are answered; in a cluster, followers'
        replication fetch streams end once they hold every record of this server's leaders."""
        if grace_s is None:
            grace_s = server_option(self.store.options, "server.shutdown-grace") / 1000
        self._stop.set()
        if self._quiet:
            self._quiet = False
            status.loud_tracebacks()
        self.partition_manager.stop()
        self.housekeeping.stop()
        if self.remote_log is not None:
            self.remote_log.stop()
        self.lookup_streams.go_away()
        if self.cluster is not None:  # followers' fetch streams end once they hold every record
            self.cluster.replicas.drain()
        finished = threading.Event()

        def abort_after_grace() -> None:
            if not finished.wait(grace_s):
                stopped = self.queries.cancel_all("shutdown")
                log.warning("shutdown grace of %.1f s passed: stopping %d running queries", grace_s, stopped)

        grace = threading.Thread(target=abort_after_grace, name="flightstore-shutdown-grace", daemon=True)
        grace.start()
        super().shutdown()
        finished.set()
        grace.join()  # no thread of ours may be left waiting when the process exits
        if self.tierer is not None:
            self.tierer.stop()
        self.metrics.close()
        if self.console is not None:
            self.console.close()
            self.console = None
        if self.authenticator is not None:
            self.authenticator.gate.close()
        self.executor.close()

    # ---- the metrics endpoint ------------------------------------------------------------------
    def serve_metrics(self, host: str, port: int) -> int:
        """Serve the Prometheus metrics on ``host:port`` (0: a free port) as the ``metrics.auth``
        and ``metrics.tls`` options say; returns the port. InvalidOption when they ask for what
        this server lacks (Basic credentials without users, HTTPS without TLS)."""
        options = self.store.options
        auth = server_option(options, "metrics.auth")
        if auth == "basic" and self.authenticator is None:
            raise InvalidOption("option 'metrics.auth': basic needs users (--users-file)")
        if server_option(options, "metrics.tls") and self.tls is None:
            raise InvalidOption("option 'metrics.tls': the server has no TLS certificate (--tls-cert/--tls-key)")
        admit = self._admit_scraper if auth == "basic" or (auth == "auto" and self.authenticator) else None
        tls = None
        if server_option(options, "metrics.tls"):
            tls = ssl_context(self.tls.cert, self.tls.key, self.tls.client_ca)
        users = self.authenticator.users if self.authenticator is not None else None
        is_open = (lambda: bool(users.is_open)) if auth == "auto" and hasattr(users, "is_open") else None
        return self.metrics.serve(host, port, admit=admit, tls=tls, is_open=is_open)

    # ---- the web console -----------------------------------------------------------------------
    def serve_console(self, host: str, port: int, *, sample_interval_s: float = 10.0) -> int:
        """Serve the web console (:mod:`flightstore.console`) on ``host:port`` (0: a free port),
        over HTTPS when this server has TLS; returns the port. It admits this server's users and
        shows each only what they may DESCRIBE; it stops with :meth:`shutdown`."""
        from flightstore.console import Console
        with self._lock:
            if self.console is None:
                console = Console(self, sample_interval_s=sample_interval_s)
                console.port = console.start(host, port)
                self.console = console
            return self.console.port

    def _admit_scraper(self, user: str, password: str) -> None:
        """A scrape of the metrics (which name every table) needs a user allowed DESCRIBE on the
        cluster; Unauthenticated / Unauthorized / Unavailable otherwise."""
        if self.authenticator.check_password(user, password) is None:
            raise Unauthenticated("wrong username or password")
        self.authz.check(user, [Permission(Operation.DESCRIBE, CLUSTER)])

    @_rpc
    def list_flights(self, context: flight.ServerCallContext, criteria: bytes) -> Iterator[flight.FlightInfo]:
        raise Unsupported("ListFlights is not supported by flightstore; list tables with Flight SQL "
                          "CommandGetTables (or SHOW TABLES)")

    @_rpc
    def get_schema(self, context: flight.ServerCallContext,
                   descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        raise Unsupported("GetSchema is not supported by flightstore; GetFlightInfo answers the schema")

    @_rpc
    def do_exchange(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
                    reader: flight.MetadataRecordBatchReader, writer: flight.MetadataRecordBatchWriter) -> None:
        """Two long-lived streams: a client's lookup stream (:mod:`.exchange`) and, in a
        cluster, a follower's replication fetch stream (peers only)."""
        command = descriptor.command if descriptor.descriptor_type == flight.DescriptorType.CMD else b""
        payload = tickets.decode_custom(command) if tickets.is_custom(command) else {}
        if payload.get("op") == FETCH_OP:
            peer = peer_of(context)
            if peer is None or self.cluster is None or peer != payload.get("follower"):
                raise Unauthorized("replication streams are open to the cluster's servers only")
            self.cluster.replicas.serve_fetch(peer, reader, writer, context.is_cancelled)
            return
        self._lookup_exchange(context, descriptor, reader, writer)


def _secure_cluster(server: FlightSqlServer, seed: UserStore | None) -> None:
    """Turn a joined server to the cluster's security: its users and grants from ZooKeeper
    (``seed``, the users of ``--users-file``, become the cluster's users if it has none yet), and
    tokens signed with the cluster secret, so every server takes every server's tokens."""
    from flightstore.cluster.security import ClusterGrants
    member = server.cluster
    if seed is not None:
        member.security.seed_users(seed)
    server.authenticator.users.security = member.security
    server.authenticator.secret = member.secret
    server.authenticator.peer_identity = member.identity
    server.authz.store = ClusterGrants(member.security)


def _wait_for_signal(grace_s: float) -> None:
    """Return at SIGTERM/SIGINT. The server listens from its construction: the main thread waits
    here, in Python, where signal handlers run (Arrow's own ``serve()`` would shut the server down
    on the signal itself, waiting for running calls forever)."""
    requested = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if not requested.is_set():
            log.info("signal %d: stopping (grace %.1f s)", signum, grace_s)
        requested.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not requested.wait(1.0):
        pass


def _exit_unless(finished: threading.Event, seconds: float) -> None:
    """Exit the process unless ``finished`` within ``seconds`` of the stop signal: calls that no
    query control reaches (a write in progress) do not keep it alive. Like a crash, this loses no
    acknowledged write."""
    if finished.wait(seconds):
        return
    log.error("calls still running %.1f s after the stop signal: exiting now", seconds)
    logging.shutdown()
    os._exit(1)


def _listen_failure(host: str, port: int, tls: TlsConfig | None, exc: BaseException) -> str:
    """Why the server could not start listening, as far as it can be told: gRPC says only "Server
    did not start properly". A port another socket holds is found by binding it; otherwise the
    address, or with TLS the certificate and key gRPC refused, is named."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        return f"cannot listen on {host}:{port}: the host does not resolve ({error.strerror})"
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind(address)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    return f"cannot listen on {host}:{port}: the port is in use by another process"
                return f"cannot listen on {host}:{port}: {error.strerror}"
    if tls is not None:
        return (f"cannot listen on {host}:{port} with TLS: gRPC refused the certificate or key ({exc}); "
                "check that they are PEM, that the key is unencrypted and belongs to the certificate")
    return f"cannot listen on {host}:{port} ({exc})"


def serve(data_dir: str, host: str = "127.0.0.1", port: int = 8815, *,
          fsync: bool = SERVER_OPTIONS["log.fsync"].default,
          users: UserStore | dict[str, str] | None = None, cluster: Any = None,
          super_users: tuple[str, ...] = (), tls: TlsConfig | None = None,
          token_ttl_ms: int | None = None, max_tokens: int | None = None,
          metrics_port: int | None = None, options: Mapping[str, Any] | None = None,
          workers: Any = None) -> None:
    """Run the server until SIGTERM/SIGINT, then shut down cleanly and close the store.
    ``cluster`` (a :class:`flightstore.cluster.member.ClusterConfig`) joins a cluster first;
    ``workers`` (a :class:`flightstore.cluster.workers.launch.WorkerLaunch`) runs this process as
    one of a machine's workers (worker 0 starts the others and stops them on SIGTERM);
    ``metrics_port`` serves Prometheus metrics on ``host``; ``options`` are further server options
    (``serve --option``): retention, partitions, the lake, and ``console.port`` (the web console
    on ``host``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    status.full_tracebacks_in_log()  # the server holds sys.tracebacklimit at 0 (see .status)
    from flightstore.lake.settings import LakeSettings
    try:
        options = validate_server_options(options or {})
        if metrics_port is None:
            metrics_port = options.get("metrics.port")
        distributed = cluster is not None or workers is not None
        if cluster is not None:  # one lake for the cluster, named explicitly by every server (flightstore.lake.cluster)
            from flightstore.lake.cluster import cluster_lake_settings
            lake = cluster_lake_settings(data_dir, options)
        else:  # a machine's workers tier nothing yet: each would tier only the buckets it leads
            lake = None if workers is not None else LakeSettings.from_options(data_dir, options)
        store_dir = data_dir
        if workers is not None:
            from flightstore.cluster.workers.launch import WorkerLaunch
            assert isinstance(workers, WorkerLaunch)
            store_dir = workers.data_dir(data_dir)
        elif cluster is None:
            from flightstore.cluster.workers.launch import check_single_server_dir
            check_single_server_dir(data_dir)
    except FlightstoreError as exc:
        raise SystemExit(f"flightstore: {exc}") from None
    seed = None
    if distributed:
        if cluster is not None:
            from flightstore.cluster.security import ClusterUsers
            seed, users = users, ClusterUsers()  # the cluster's users, in ZooKeeper; a users file seeds them
        from flightstore.cluster.store import ClusterStore as store_class
    else:
        store_class = Store
    try:
        store = store_class(store_dir, fsync=fsync, options=options)
    except (DataDirectoryInUse, InvalidOption) as exc:  # another server; remote.* options
        raise SystemExit(f"flightstore: {exc}") from None
    if cluster is not None:
        store.peers.tls = tls.client_kwargs() if tls is not None else {}
    try:
        server = FlightSqlServer(store, f"grpc://{host}:{port}", users=users, super_users=super_users,
                                 tls=tls, token_ttl_ms=token_ttl_ms, max_tokens=max_tokens, lake=lake,
                                 start_tierer=cluster is None, retention_interval_s=server_option(
                                     options, "log.retention.check-interval") / 1000)
    except pa.ArrowException as exc:
        store.close()
        raise SystemExit(f"flightstore: {_listen_failure(host, port, tls, exc)}") from None
    supervisor = None  # worker 0's children (--workers)
    if distributed:
        try:
            if cluster is not None:
                from flightstore.cluster.member import join
                server.cluster = join(cluster, store, host, server.port, tls=tls is not None)
            else:
                server.cluster = workers.join(store, data_dir, host, server.port)
            server.peers.identity = server.cluster.identity
            server.metrics.watch_replicas(server.cluster.replicas)
            server.cluster.on_decommissioned = lambda: os.kill(os.getpid(), signal.SIGTERM)
            store.has_lake = lake is not None
            if cluster is not None:
                _secure_cluster(server, seed)
                from flightstore.lake.cluster import ClusterLake, check_cluster_lake
                check_cluster_lake(server.cluster, lake)  # the cluster's lake, or none on every server
                if server.tierer is not None:  # tiers while it holds the cluster's lease, else follows
                    server.tierer.cluster = ClusterLake(server.cluster, store.peers)
                    server.tierer.start()
            elif server.authenticator is not None:  # tokens signed: every worker takes them
                server.authenticator.secret = server.cluster.secret
                server.authenticator.peer_identity = server.cluster.identity
            if workers is not None and workers.worker_id == 0:
                supervisor = workers.start_children(server.cluster, data_dir)
        except FlightstoreError as exc:
            if server.cluster is not None:  # leave at once: a refused server must not stay a member
                server.cluster.stop()
            server.shutdown()
            store.close()
            raise SystemExit(f"flightstore: {exc}") from None
    scheme = "grpc+tls" if tls is not None else "grpc"
    print(f"flightstore serving {data_dir} at {scheme}://{host}:{server.port}", flush=True)
    if metrics_port is not None:
        try:
            bound = server.serve_metrics(host, metrics_port)
        except FlightstoreError as exc:
            server.shutdown()
            store.close()
            raise SystemExit(f"flightstore: {exc}") from None
        except OSError as exc:
            server.shutdown()
            store.close()
            raise SystemExit(f"flightstore: cannot serve metrics on {host}:{metrics_port} ({exc})") from None
        scheme = "https" if server_option(options, "metrics.tls") else "http"
        print(f"flightstore metrics at {scheme}://{host}:{bound}/metrics", flush=True)

    console_port = options.get("console.port")
    if console_port is not None:
        try:
            bound = server.serve_console(host, console_port)
        except OSError as exc:
            server.shutdown()
            store.close()
            raise SystemExit(f"flightstore: cannot serve the console on {host}:{console_port} ({exc})") from None
        print(f"flightstore console at {'https' if tls is not None else 'http'}://{host}:{bound}/", flush=True)

    grace_s = server_option(options, "server.shutdown-grace") / 1000
    finished = threading.Event()
    guard = threading.Thread(target=_exit_unless, args=(finished, grace_s + HARD_EXIT_MARGIN_S),
                             name="flightstore-exit-guard", daemon=True)
    children = threading.Thread(target=supervisor.stop, name="flightstore-workers-stop", daemon=True) \
        if supervisor is not None else None
    try:
        _wait_for_signal(grace_s)
        if children is not None:  # the workers stop alongside worker 0
            children.start()
        guard.start()
        server.shutdown(grace_s)  # stops accepting, waits grace_s, then stops running queries
    finally:
        if children is not None and children.is_alive():
            children.join(grace_s + HARD_EXIT_MARGIN_S)
        if server.cluster is not None:
            server.cluster.stop()
        if server.tierer is not None:
            server.tierer.stop()
        store.close()
        finished.set()
        if guard.is_alive():
            guard.join()  # no thread of ours may be left running when the interpreter finalizes
        print("flightstore stopped", flush=True)
