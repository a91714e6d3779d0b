"""Prometheus metrics of one server (prometheus-client), served on ``--metrics-port``.

Series (each server has its own registry, so several servers in one process do not mix):

* ``flightstore_rpc_total{method,status}`` and ``flightstore_rpc_duration_seconds{method,status}``
  (histogram): every Flight call, measured by :class:`MetricsMiddlewareFactory` from its start to
  its completion (a DoGet stream's last message included); ``status`` is the gRPC status name
  (``OK``, ``INVALID_ARGUMENT``, ``UNAUTHENTICATED``, ``PERMISSION_DENIED``, ...). Calls refused by
  authentication are counted too. GetFlightInfo, DoPut and DoAction, whose handler does all their
  work, are timed by the RPC wrapper (:func:`.rpc._rpc`: :meth:`ServerMetrics.call_started` /
  :meth:`ServerMetrics.call_ended`) from the handler's start to its return, with the status the
  client gets: a middleware instance costs a Flight call two more calls into Python (its
  ``sending_headers`` and ``call_completed``), about a tenth of the server CPU of an ADBC
  lookup, which makes exactly those three calls.
* ``flightstore_rows_in_total{table}``, ``flightstore_bytes_in_total{table}``: rows and Arrow bytes
  written (DoPut, ingest, SQL INSERT); ``flightstore_rows_out_total{table}``,
  ``flightstore_bytes_out_total{table}``: rows and bytes sent to clients, labelled with the table a
  result comes from (the input tables, comma-separated, for joins and other residual SQL).
* ``flightstore_lookup_duration_seconds`` (histogram): each lookup answered on a client's lookup
  stream (DoExchange), from its request read to its answer written.
* ``flightstore_partial_aggregates_total``: partial aggregates this server ran over the buckets it
  leads for a query another server of the cluster received (which merges them).
* ``flightstore_log_end_offset{table,bucket}``, ``flightstore_kv_applied_offset{table,bucket}``:
  read at scrape time from the tables this server has open.
* ``flightstore_active_queries`` (GetFlightInfo and DoGet calls in flight, subscriptions excluded),
  ``flightstore_active_subscriptions`` (changelog streams open).
* Memory: ``process_resident_memory_bytes`` and the other ``process_*`` series of the process
  collector, and ``flightstore_arrow_allocated_bytes`` (Arrow's default memory pool).

With ``metrics.table-labels`` off no series names a table: the row and byte counters have no
``table`` label (server-wide totals) and the per-bucket offsets are not exported. Who may scrape,
and over what, is :mod:`.metrics_http`'s business.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector
from pyarrow import flight

from flightstore.config import server_option
from flightstore.server.metrics_http import MetricsEndpoint

if TYPE_CHECKING:
    from flightstore.store import Store

__all__ = ["METRICS_MIDDLEWARE", "MetricsMiddlewareFactory", "ServerMetrics", "status_name"]

METRICS_MIDDLEWARE = "metrics"
_log = logging.getLogger("flightstore.server.metrics")
_QUERY_METHODS = (flight.FlightMethod.DO_GET, flight.FlightMethod.GET_FLIGHT_INFO)
#: The calls whose handler does all their work (nothing streams after it returns): timed by the RPC
#: wrapper, by handler name, instead of by a middleware instance (see the module docstring).
HANDLER_TIMED = {"get_flight_info": flight.FlightMethod.GET_FLIGHT_INFO, "do_put": flight.FlightMethod.DO_PUT,
                 "do_action": flight.FlightMethod.DO_ACTION}
_HANDLER_TIMED_METHODS = frozenset(HANDLER_TIMED.values())
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_LOOKUP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)


def method_name(method: flight.FlightMethod) -> str:
    """``DO_GET`` -> ``DoGet``, the RPC's name in Flight.proto."""
    return "".join(part.capitalize() for part in method.name.split("_"))


def status_name(exc: BaseException | None) -> str:
    """The gRPC status a call ended with, from the exception pyarrow turns into it."""
    if exc is None:
        return "OK"
    for kind, name in ((flight.FlightUnauthenticatedError, "UNAUTHENTICATED"),
                       (flight.FlightUnauthorizedError, "PERMISSION_DENIED"),
                       (flight.FlightCancelledError, "CANCELLED"),
                       (flight.FlightTimedOutError, "DEADLINE_EXCEEDED"),
                       (flight.FlightUnavailableError, "UNAVAILABLE"),
                       (flight.FlightError, "INTERNAL"),
                       (pa.ArrowKeyError, "NOT_FOUND"),
                       (pa.ArrowInvalid, "INVALID_ARGUMENT"),
                       (pa.ArrowTypeError, "INVALID_ARGUMENT"),
                       (NotImplementedError, "UNIMPLEMENTED")):
        if isinstance(exc, kind):
            return name
    return "UNKNOWN"


class _CallMetrics(flight.ServerMiddleware):
    def __init__(self, metrics: ServerMetrics, method: flight.FlightMethod) -> None:
        self.metrics = metrics
        self.method = method
        self.started = time.perf_counter()
        self.gauge = metrics.active_queries if method in _QUERY_METHODS else None
        if self.gauge is not None:
            self.gauge.inc()

    def subscription(self) -> None:
        """This call is a changelog subscription: count it there, not among queries."""
        if self.gauge is not None:
            self.gauge.dec()
        self.gauge = self.metrics.active_subscriptions
        self.gauge.inc()

    def call_completed(self, exception: BaseException | None) -> None:
        if self.gauge is not None:
            self.gauge.dec()
            self.gauge = None
        self.metrics.record(self.method, status_name(exception), time.perf_counter() - self.started)


class MetricsMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Times every call; install it before the authentication middleware."""

    def __init__(self, metrics: ServerMetrics) -> None:
        super().__init__()
        self.metrics = metrics

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[str]]) -> flight.ServerMiddleware | None:
        if info.method in _HANDLER_TIMED_METHODS:
            return None  # timed by the RPC wrapper (ServerMetrics.call_started / call_ended)
        return _CallMetrics(self.metrics, info.method)


class _StoreCollector:
    """Offsets of the open tables' buckets (unless tables go unnamed) and Arrow's memory, read at
    each scrape."""

    def __init__(self, store: Store, table_labels: bool) -> None:
        self.store = store
        self.table_labels = table_labels

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.table_labels:
            yield from self._offsets()
        memory = GaugeMetricFamily("flightstore_arrow_allocated_bytes",
                                   "Bytes allocated from Arrow's default memory pool")
        memory.add_metric([], pa.total_allocated_bytes())
        yield memory

    def _offsets(self) -> Iterator[GaugeMetricFamily]:
        log_end = GaugeMetricFamily("flightstore_log_end_offset", "Next offset of each bucket's log",
                                    labels=["table", "bucket"])
        applied = GaugeMetricFamily("flightstore_kv_applied_offset",
                                    "Log offset up to which each bucket's KV store is applied",
                                    labels=["table", "bucket"])
        for table in self.store.open_tables():
            name = str(table.path)
            try:
                for bucket, (log, kv) in table.tablets().items():
                    log_end.add_metric([name, str(bucket)], log.end_offset)
                    if kv is not None:
                        applied.add_metric([name, str(bucket)], kv.applied_offset)
            except Exception:  # noqa: BLE001 - a table dropped or closed under the scrape
                _log.debug("metrics: skipped table %s", name, exc_info=True)
        yield log_end
        yield applied


class _ReplicaCollector:
    """Per bucket held by this cluster member: role, in-sync replicas, high watermark and (on the
    leader) each follower's lag, read from the replica manager at each scrape."""

    def __init__(self, replicas: Any) -> None:
        self.replicas = replicas

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["table", "bucket"]
        leader = GaugeMetricFamily("flightstore_replica_leader", "1 when this server leads the bucket",
                                   labels=labels)
        epoch = GaugeMetricFamily("flightstore_replica_leader_epoch", "The bucket's leader epoch", labels=labels)
        isr = GaugeMetricFamily("flightstore_replica_in_sync", "In-sync replicas of the bucket", labels=labels)
        replicas = GaugeMetricFamily("flightstore_replica_count", "Replicas of the bucket", labels=labels)
        under = GaugeMetricFamily("flightstore_replica_under_replicated",
                                  "1 when the bucket (led here) has fewer in-sync replicas than replicas",
                                  labels=labels)
        hw = GaugeMetricFamily("flightstore_replica_high_watermark",
                               "High watermark of the bucket here (summed over partitions)", labels=labels)
        lag = GaugeMetricFamily("flightstore_replica_follower_lag",
                                "Records a follower lacks of the bucket's log (reported by the leader)",
                                labels=[*labels, "follower"])
        try:
            buckets = self.replicas.status()["buckets"]
        except Exception:  # noqa: BLE001 - a scrape never fails the server
            _log.debug("metrics: replica status failed", exc_info=True)
            buckets = []
        for entry in buckets:
            key = [entry["table"], str(entry["bucket"])]
            leading = entry["role"] == "leader"
            leader.add_metric(key, 1 if leading else 0)
            epoch.add_metric(key, entry["epoch"])
            isr.add_metric(key, len(entry["isr"]))
            replicas.add_metric(key, len(entry["replicas"]))
            hw.add_metric(key, entry["high_watermark"])
            if leading:
                under.add_metric(key, 1 if len(entry["isr"]) < len(entry["replicas"]) else 0)
                for follower, behind in entry.get("lag", {}).items():
                    if behind is not None:
                        lag.add_metric([*key, follower], behind)
        yield from (leader, epoch, isr, replicas, under, hw, lag)


class ServerMetrics:
    """The metrics of one server and, once :meth:`serve` ran, its HTTP endpoint."""

    def watch_replicas(self, replicas: Any) -> None:
        """Export the replica manager's per-bucket state (cluster mode)."""
        self.registry.register(_ReplicaCollector(replicas))

    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.table_labels = bool(server_option(store.options, "metrics.table-labels"))
        by_table = ["table"] if self.table_labels else []
        self.rpcs = Counter("flightstore_rpc", "Flight calls by method and final status",
                            ["method", "status"], registry=r)
        self.latency = Histogram("flightstore_rpc_duration_seconds",
                                 "Flight call duration, from its start to its last message",
                                 ["method", "status"], buckets=_BUCKETS, registry=r)
        self.rows_in = Counter("flightstore_rows_in", "Rows written, by table", by_table, registry=r)
        self.bytes_in = Counter("flightstore_bytes_in", "Arrow bytes written, by table", by_table, registry=r)
        self.rows_out = Counter("flightstore_rows_out", "Rows sent to clients, by table", by_table, registry=r)
        self.bytes_out = Counter("flightstore_bytes_out", "Arrow bytes sent to clients, by table",
                                 by_table, registry=r)
        self.lookups = Histogram("flightstore_lookup_duration_seconds",
                                 "Lookups on lookup streams, from the request read to the answer written",
                                 buckets=_LOOKUP_BUCKETS, registry=r)
        self.point_lookups = 0  # of those, single keys answered without Arrow calls (see served)
        self.partials = Counter("flightstore_partial_aggregates",
                                "Partial aggregates run here for a cluster peer's query", registry=r)
        self.active_queries = Gauge("flightstore_active_queries",
                                    "GetFlightInfo and DoGet calls in flight (subscriptions excluded)",
                                    registry=r)
        self.active_subscriptions = Gauge("flightstore_active_subscriptions",
                                          "Changelog subscription streams open", registry=r)
        ProcessCollector(registry=r)
        r.register(_StoreCollector(store, self.table_labels))
        self._http: MetricsEndpoint | None = None
        self._port = 0
        self._rpc_series: dict[tuple, tuple] = {}  # (method, status) -> (counter, histogram) children
        self._out_series: dict[str, tuple] = {}    # table label -> (rows, bytes) counter children
        self._lock = threading.Lock()

    # ---- recording ----------------------------------------------------------------------------
    def middleware(self) -> MetricsMiddlewareFactory:
        return MetricsMiddlewareFactory(self)

    def record(self, method: flight.FlightMethod, status: str, seconds: float) -> None:
        series = self._rpc_series.get((method, status))
        if series is None:  # labels() costs more than the update: keep each pair's children
            name = method_name(method)
            series = self._rpc_series[(method, status)] = (self.rpcs.labels(name, status),
                                                           self.latency.labels(name, status))
        series[0].inc()
        series[1].observe(seconds)

    def call_started(self, method: flight.FlightMethod) -> float:
        """A handler-timed call (:data:`HANDLER_TIMED`) starts: its start time, for
        :meth:`call_ended` (a GetFlightInfo is counted among the active queries until then)."""
        if method in _QUERY_METHODS:
            self.active_queries.inc()
        return time.perf_counter()

    def call_ended(self, method: flight.FlightMethod, started: float, error: BaseException | None) -> None:
        """A handler-timed call ended, with ``error`` (the Flight error the client gets) or None."""
        if method in _QUERY_METHODS:
            self.active_queries.dec()
        self.record(method, status_name(error), time.perf_counter() - started)

    def refused(self, method: flight.FlightMethod, error: BaseException | None = None) -> None:
        """A call authentication refused before it started (UNAUTHENTICATED, or UNAVAILABLE when
        the login gate turned it away)."""
        self.record(method, status_name(error) if error is not None else "UNAUTHENTICATED", 0.0)

    def _series(self, counter: Counter, table: object) -> Counter:
        """``counter``'s series of ``table`` (the counter itself when tables go unnamed)."""
        return counter.labels(str(table)) if self.table_labels else counter

    def written(self, table: object, data: pa.Table | pa.RecordBatch) -> None:
        self._series(self.rows_in, table).inc(data.num_rows)
        self._series(self.bytes_in, table).inc(data.nbytes)

    def sent(self, table: str, data: pa.Table | pa.RecordBatch) -> None:
        # (get_total_buffer_size: nbytes walks the buffers in Python-visible steps)
        self.sent_rows(table, data.num_rows, data.get_total_buffer_size())

    def sent_rows(self, table: str, rows: int, nbytes: int) -> None:
        """:meth:`sent` of ``rows`` rows of ``nbytes`` buffer bytes (an answer written without a table)."""
        series = self._out_series.get(table)
        if series is None:
            if len(self._out_series) >= 4096:  # tables come and go: do not keep every name
                self._out_series.clear()
            series = self._out_series[table] = (self._series(self.rows_out, table),
                                                 self._series(self.bytes_out, table))
        series[0].inc(rows)
        series[1].inc(nbytes)

    def metered(self, table: str, batches: Iterator[pa.RecordBatch | pa.Table]
                ) -> Iterator[pa.RecordBatch | pa.Table]:
        """``batches``, counting each as it is sent."""
        rows, nbytes = self._series(self.rows_out, table), self._series(self.bytes_out, table)
        for batch in batches:
            rows.inc(batch.num_rows)
            nbytes.inc(batch.nbytes)
            yield batch

    @staticmethod
    def mark_subscription(context: flight.ServerCallContext | None) -> None:
        middleware = context.get_middleware(METRICS_MIDDLEWARE) if context is not None else None
        if middleware is not None:
            middleware.subscription()

    def served(self) -> dict[str, int]:
        """Calls served so far: ``calls`` by Flight method, ``stream_lookups`` (requests answered
        on lookup streams), ``point_lookups`` (of those, single keys answered without Arrow calls,
        :mod:`flightstore.server.point_lookups`; counted without a lock, so a floor under
        concurrency): what the ``flightstore.cluster`` action reports of this server."""
        calls: dict[str, int] = {}
        for sample in self.rpcs.collect()[0].samples:
            if sample.name.endswith("_total"):
                method = sample.labels["method"]
                calls[method] = calls.get(method, 0) + int(sample.value)
        count = next(s.value for s in self.lookups.collect()[0].samples if s.name.endswith("_count"))
        return {"calls": calls, "stream_lookups": int(count), "point_lookups": self.point_lookups}

    # ---- exposition ---------------------------------------------------------------------------
    def exposition(self) -> str:
        """The text a scrape gets (Prometheus text format)."""
        return generate_latest(self.registry).decode()

    def serve(self, host: str, port: int, *, admit: Callable[[str, str], None] | None = None,
              tls: ssl.SSLContext | None = None, is_open: Callable[[], bool] | None = None) -> int:
        """Serve ``/metrics`` on ``host:port`` (0: a free port) in daemon threads; returns the port.
        ``admit`` checks a scrape's Basic credentials (None: anyone may scrape); ``tls``: HTTPS."""
        with self._lock:
            if self._http is None:
                endpoint = MetricsEndpoint(lambda: generate_latest(self.registry), admit=admit, tls=tls,
                                           is_open=is_open)
                self._port = endpoint.start(host, port)
                self._http = endpoint
            return self._port

    def close(self) -> None:
        with self._lock:
            if self._http is not None:
                self._http.close()
                self._http = None
