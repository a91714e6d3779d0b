"""The server's tierer: a background thread that tiers every datalake-enabled table on its own.

Each table is tiered every ``table.datalake.freshness`` (at once again while a backlog is left).
A round first takes the table's lease (:mod:`flightstore.lake.lease`), so a tiering job running
elsewhere and this server never work on one table together; the loser sees
:class:`~flightstore.errors.TieringLeaseHeld` in its status and retries later.

When the lake is unavailable (catalog down, warehouse not writable) the round fails with
:class:`~flightstore.errors.LakeUnavailable`: the tierer drops its connection, records the error and
retries after a backoff that doubles from 1 s up to ``datalake.tiering.retry-backoff.max``.
Writes and reads of the log go on meanwhile, and the log keeps every untiered record: the tierer
tells each table the offsets the lake holds (:attr:`flightstore.store.Table.retention_floor`) only
once a commit (or the lake's last snapshot) proves them.

With ``datalake.tiering.enabled`` off (a Spark tiering job tiers instead), and for a table whose
lease another tierer holds, the tierer only *follows* the lake: it reads the committed offsets of
the table's lake table every freshness interval, hands them to log retention and reports them in
the status, so the log of a table tiered elsewhere still shrinks and its lag still shows.

After a successful round, still holding the lease, the tierer runs the lake's upkeep of the table
at most once per ``datalake.maintenance.interval`` (:mod:`flightstore.lake.upkeep`): old snapshots
expire, files nothing references any more are deleted. An upkeep that fails is logged and
reported in the status; it never fails the round.

In cluster mode (:attr:`LakeTierer.cluster`, a :class:`flightstore.lake.cluster.ClusterLake`) every
server runs a tierer, but only the one holding the cluster's tiering lease in ZooKeeper tiers:
it reads every bucket at its leader; the others follow the lake's commits, so each server's
replicas (leaders and followers) get their retention floor. See :mod:`flightstore.lake.cluster`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flightstore.errors import (
    FlightstoreError,
    InvalidInput,
    LakeUnavailable,
    TableNotFound,
    TieringLeaseHeld,
)
from flightstore.lake.catalog import LakeCatalog
from flightstore.lake.cluster_source import ClusterSource
from flightstore.lake.lease import LeaseStore
from flightstore.lake.offsets import TABLE_ID_PROPERTY, committed_offsets, tiering_snapshots
from flightstore.lake.read import cache_appended
from flightstore.lake.settings import LakeSettings
from flightstore.lake.status import TableStatus, bucket_statuses
from flightstore.lake.tiering import RoundResult, hold_untiered, tier_round
from flightstore.lake.upkeep import UpkeepResult, upkeep
from flightstore.schema import TablePath
from flightstore.store import Store
from flightstore.table.api import TableApi

__all__ = ["INITIAL_BACKOFF_MS", "LakeTierer"]

log = logging.getLogger("flightstore.lake")
INITIAL_BACKOFF_MS = 1000
_IDLE_RECHECK_S = 1.0  # how soon a new datalake-enabled table is noticed


@dataclass
class _TableState:
    """What the tierer knows of one table (guarded by the tierer's lock)."""

    due: float = 0.0  # monotonic time of the next round
    rushed: bool = False  # due_now() was asked while a round ran: the next round is due at once
    tiered: dict[int, int] | None = None
    last_commit_ms: int | None = None
    last_snapshot_id: int | None = None
    last_error: str | None = None
    last_error_ms: int | None = None
    failures: int = 0
    upkeep_due: float = 0.0  # monotonic time the next upkeep may run
    last_upkeep: UpkeepResult | None = None
    upkeep_error: str | None = None


class LakeTierer:
    """Tiers the datalake-enabled tables of ``store`` into the lake of ``settings``."""

    def __init__(self, store: Store, settings: LakeSettings, *, holder: str | None = None,
                 catalog: LakeCatalog | None = None, hook: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.settings = settings
        self.catalog = catalog or LakeCatalog(settings)
        self._holder = holder or f"server:{socket.gethostname()}:{settings.data_dir}"
        self.hook = hook
        # Cluster mode: the tiering lease in ZooKeeper (flightstore.lake.cluster.ClusterLake), set
        # before start() once the server joined its cluster.
        self.cluster: Any = None
        self._leases: LeaseStore | None = None
        self._states: dict[TablePath, _TableState] = {}
        self._lock = threading.Lock()
        self._round_lock = threading.Lock()  # one round at a time (thread or tier_now)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> LakeTierer:
        """Start the background thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lake-tierer", daemon=True)
            self._thread.start()
        return self

    @property
    def holder(self) -> str:
        """The name this tierer takes the lake's leases under (a cluster's servers share one)."""
        return self.cluster.holder if self.cluster is not None else self._holder

    def stop(self, timeout: float = 60.0) -> None:
        """Stop after the round in progress, give the leases back (in a cluster: when this server
        holds the cluster's tiering lease, then that lease too), close the catalog connection."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            paths = list(self._states)
        if self.cluster is None or self.cluster.holds_now():
            for path in paths:
                try:
                    self._lease_store().release(str(path), self.holder)
                except FlightstoreError:
                    break  # the lake is down: the leases expire by themselves
        if self.cluster is not None:
            self.cluster.release()
        self.catalog.reset()

    def wake(self) -> None:
        """Check for due tables now (e.g. after a table was created)."""
        self._wake.set()

    def due_now(self, path: TablePath | str) -> None:
        """Make ``path`` due at once (a partition of it was dropped: the lake drops its rows in the
        next round, not a freshness interval later) and wake the thread."""
        path = path if isinstance(path, TablePath) else TablePath.parse(path)
        with self._lock:
            state = self._states.setdefault(path, _TableState())
            state.due, state.rushed = 0.0, True
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_due()
            except Exception:  # the thread must outlive a bad pass; the next one retries
                log.exception("tiering pass failed")
            with self._lock:
                next_due = min((s.due for s in self._states.values()), default=float("inf"))
            delay = min(_IDLE_RECHECK_S, max(0.0, next_due - time.monotonic()))
            self._wake.wait(delay)
            self._wake.clear()

    # ---- rounds ---------------------------------------------------------------------------------
    def enabled_tables(self) -> list[TablePath]:
        """The tables of the store with ``table.datalake.enabled``."""
        paths = []
        for path in self.store.catalog.all_tables():
            try:
                if self.store.catalog.get_table(path).option("table.datalake.enabled"):
                    paths.append(path)
            except FlightstoreError:
                continue  # dropped meanwhile, or unreadable: its owner reports that
        return paths

    def run_due(self) -> list[RoundResult]:
        """One pass: a round for every datalake-enabled table that is due. Errors are recorded in
        the table's status (and retried after a backoff), never raised."""
        results = []
        paths = self.enabled_tables()
        with self._lock:
            for gone in set(self._states) - set(paths):
                del self._states[gone]
            for path in paths:
                self._states.setdefault(path, _TableState())
        for path in paths:
            if self._stop.is_set():
                break
            with self._lock:
                due = self._states[path].due <= time.monotonic()
            if due:
                try:
                    result = self.tier_now(path, if_due=True)
                except FlightstoreError:
                    continue  # recorded by tier_now
                if result is not None:
                    results.append(result)
        return results

    def tier_now(self, path: TablePath | str, *, if_due: bool = False) -> RoundResult | None:
        """Run one round of ``path`` now, whatever its schedule; record the outcome; raise its
        error (LakeUnavailable, TieringLeaseHeld, ...) after recording it. ``if_due``: only if the
        table is still due once this holds the round lock (None otherwise): a round that ran
        meanwhile (a caller's tier_now) set its next one a freshness interval away."""
        path = path if isinstance(path, TablePath) else TablePath.parse(path)
        table = self.store.table(path)
        if not table.descriptor.option("table.datalake.enabled"):
            raise InvalidInput(f"table {path} is not datalake-enabled ('table.datalake.enabled')")
        with self._round_lock:
            with self._lock:  # a due_now() from here on asks for the round after this one
                state = self._states.setdefault(path, _TableState())
                if if_due and state.due > time.monotonic():
                    return None
                state.rushed = False
            try:
                result = self._round(table)
            except Exception as exc:
                self._failed(path, exc)
                if isinstance(exc, FlightstoreError):
                    raise
                raise FlightstoreError(f"tiering {path} failed: {type(exc).__name__}: {exc}") from exc
        self._succeeded(table, result)
        return result

    def _lease_store(self) -> LeaseStore:
        if self._leases is None or self._leases.engine is not self.catalog.catalog.engine:
            self._leases = LeaseStore(self.catalog.catalog.engine)
        return self._leases

    def _round(self, table: TableApi) -> RoundResult:
        name = str(table.path)
        if not self.settings.tiering_enabled:
            return self._follow(table)
        cluster = self.cluster
        if cluster is not None and not cluster.holds():
            return self._follow(table)  # another server of the cluster tiers: follow its commits
        leases = self._lease_store()
        try:
            leases.acquire(name, self.holder, self.settings.lease_ms)
        except TieringLeaseHeld:
            self._follow(table)  # the other tierer's commits still let this log shrink
            raise

        def before_commit() -> None:
            if cluster is not None:
                cluster.check_held()  # a deposed tierer does not commit
            leases.acquire(name, self.holder, self.settings.lease_ms)

        lake_table = self.catalog.ensure_table(table.descriptor, table.table_id)
        source = ClusterSource(table) if table.distributed else table
        result = tier_round(
            source, lake_table, max_rows=self.settings.max_round_rows, hook=self.hook,
            before_commit=before_commit,
            appended=lambda committed, rows: self._cache_appended(table, committed, rows))
        self._upkeep(table, lake_table, leases)
        return result

    def _upkeep(self, table: TableApi, lake_table, leases: LeaseStore) -> UpkeepResult | None:
        """The lake upkeep of ``table`` when due (under its lease, renewed first); never raises."""
        with self._lock:
            state = self._states.setdefault(table.path, _TableState())
            if state.upkeep_due > time.monotonic():
                return None
            state.upkeep_due = time.monotonic() + self.settings.maintenance_interval_ms / 1000
        option = table.descriptor.option
        try:
            leases.acquire(str(table.path), self.holder, self.settings.lease_ms)
            result = upkeep(lake_table, max_age_ms=option("table.datalake.snapshot.retention"),
                            num_retained=option("table.datalake.snapshot.num-retained"),
                            orphans_older_than_ms=option("table.datalake.orphan-files.older-than"))
        except Exception as exc:  # noqa: BLE001 - the round is committed; the next upkeep retries
            error = f"{type(exc).__name__}: {exc}"
            with self._lock:
                state.upkeep_error = error
            log.warning("lake upkeep of %s failed: %s", table.path, error)
            return None
        with self._lock:
            state.last_upkeep, state.upkeep_error = result, None
        if result.expired_snapshots or result.orphans_removed:
            log.info("lake upkeep of %s: expired %d snapshots, deleted %d files and %d orphans",
                     table.path, len(result.expired_snapshots), len(result.files_removed),
                     len(result.orphans_removed))
        return result

    def last_upkeep(self, path: TablePath | str) -> tuple[UpkeepResult | None, str | None]:
        """The last lake upkeep of ``path`` that ran (None: none yet) and the error of the latest
        attempt (None when it succeeded)."""
        path = path if isinstance(path, TablePath) else TablePath.parse(path)
        with self._lock:
            state = self._states.get(path) or _TableState()
            return state.last_upkeep, state.upkeep_error

    def _cache_appended(self, table: TableApi, lake_table, rows) -> None:
        """Write-through of a committed round's data files into the read cache (best effort: the
        round is committed; a file not cached now is cached by its first read)."""
        cache = self.catalog.read_cache
        if cache is None:
            return
        try:
            cache_appended(cache, lake_table, table.descriptor, rows)
        except Exception:  # noqa: BLE001 - never fail a committed round
            log.warning("table %s: caching the files of the round failed", table.path, exc_info=True)

    def _follow(self, table: TableApi) -> RoundResult:
        """What another tierer (a Spark job, another server of the cluster) committed for
        ``table``: hand its offsets to log retention and report them, without tiering. Only the
        lake table of this incarnation of the table counts (a dropped table's lake must not let
        the new one's log go)."""
        local = self.store.local_table(table.path)
        try:
            lake_table = self.catalog.load_table(table.path)
        except TableNotFound:
            lake_table = None
        if lake_table is None or lake_table.properties.get(TABLE_ID_PROPERTY) != table.table_id:
            hold_untiered(local, {})
            return RoundResult(table.path, 0, {}, {})
        offsets = committed_offsets(lake_table)
        hold_untiered(local, offsets)
        latest = next(iter(tiering_snapshots(lake_table)), None)
        return RoundResult(table.path, 0, offsets, offsets,
                           snapshot_id=latest.snapshot_id if latest is not None else None,
                           committed_at_ms=latest.timestamp_ms if latest is not None else None)

    def _succeeded(self, table: TableApi, result: RoundResult) -> None:
        hold_untiered(self.store.local_table(table.path), result.end_offsets)
        freshness_s = table.descriptor.option("table.datalake.freshness") / 1000
        with self._lock:
            state = self._states.setdefault(table.path, _TableState())
            state.tiered = dict(result.end_offsets) if result.end_offsets else None  # None: nothing known
            if result.snapshot_id is not None:  # also after a restart: the lake's latest commit
                state.last_snapshot_id = result.snapshot_id
                state.last_commit_ms = result.committed_at_ms
            state.last_error = state.last_error_ms = None
            state.failures = 0
            # a partition dropped during the round (after its commit became visible, say) must not
            # wait a freshness interval: the round did not see the drop
            rush = result.backlog_left or state.rushed
            state.due = time.monotonic() + (0.0 if rush else freshness_s)
            state.rushed = False
        if result.rows:
            log.info("tiered %d rows of %s in %.2f s (snapshot %s)", result.rows, table.path,
                     result.seconds, result.snapshot_id)

    def _failed(self, path: TablePath, exc: BaseException) -> None:
        if not isinstance(exc, FlightstoreError) or isinstance(exc, LakeUnavailable):
            self.catalog.reset()  # reconnect next time: the catalog may have come back elsewhere
        with self._lock:
            state = self._states.setdefault(path, _TableState())
            state.failures += 1
            state.last_error = f"{type(exc).__name__}: {exc}"
            state.last_error_ms = int(time.time() * 1000)
            backoff_ms = min(self.settings.retry_backoff_max_ms,
                             INITIAL_BACKOFF_MS * 2 ** min(state.failures - 1, 30))
            state.due = time.monotonic() + backoff_ms / 1000
        log.warning("tiering %s failed (attempt %d): %s", path, state.failures, state.last_error)

    # ---- status ---------------------------------------------------------------------------------
    def status(self, path: TablePath | str, *, here: bool = False) -> TableStatus:
        """The tiering status of one datalake-enabled table (answers while the lake is down). In
        a cluster, the status of the server that tiers (asked of it unless ``here``); while no
        server tiers (a failover), this server's view of the lake."""
        path = path if isinstance(path, TablePath) else TablePath.parse(path)
        table = self.store.table(path)
        if not table.descriptor.option("table.datalake.enabled"):
            raise InvalidInput(f"table {path} is not datalake-enabled ('table.datalake.enabled')")
        tierer = self.holder
        if self.cluster is not None and self.settings.tiering_enabled:
            if not here:
                remote = self.cluster.holder_status(str(path))
                if remote is not None:
                    return remote
            tierer = self.cluster.describe()
            if not self.cluster.holds_now():  # following: what the lake says now
                with contextlib.suppress(FlightstoreError):
                    self.tier_now(path)
        if not self.settings.tiering_enabled:  # following another tierer: what the lake says now
            with contextlib.suppress(FlightstoreError):  # unreachable: the last known state, the error
                self.tier_now(path)
        with self._lock:
            state = self._states.get(path) or _TableState()
            tiered = None if state.tiered is None else dict(state.tiered)
            snapshot = (state.last_commit_ms, state.last_snapshot_id, state.last_error,
                        state.last_error_ms, state.failures)
            upkept, upkeep_error = state.last_upkeep, state.upkeep_error
        return TableStatus(
            str(path), bucket_statuses(table, tiered, damaged=self.catalog.damage.damaged(str(path))), *snapshot,
            tierer=tierer,
            last_upkeep_ms=upkept.ran_at_ms if upkept is not None else None,
            upkeep_expired_snapshots=len(upkept.expired_snapshots) if upkept is not None else 0,
            upkeep_removed_files=len(upkept.files_removed) + len(upkept.orphans_removed) if upkept else 0,
            upkeep_error=upkeep_error)

    def statuses(self, *, here: bool = False) -> list[TableStatus]:
        """The status of every datalake-enabled table."""
        return [self.status(path, here=here) for path in self.enabled_tables()]
