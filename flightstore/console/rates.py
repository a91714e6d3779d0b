"""The console's plots: the server's own metrics sampled into a small ring of the last hour.

A :class:`RateRing` reads the server's Prometheus registry (:class:`~flightstore.server.metrics.
ServerMetrics`) every ``interval_s`` on one daemon thread and keeps ``span_s`` of samples
(cumulative counters and histogram buckets, a few hundred integers each). :meth:`RateRing.series`
turns consecutive samples into per-second rates (rows written and read, calls, failed calls) and
latency percentiles (lookups on lookup streams, query calls) interpolated within histogram
buckets, as Prometheus's ``histogram_quantile`` does. Nothing is recorded on the serving paths.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["RateRing", "Sample", "quantile"]

QUERY_METHODS = ("DoGet", "GetFlightInfo")


@dataclass(frozen=True)
class Sample:
    """Cumulative values at ``at_ms``; histograms as ((upper bound, cumulative count), ...)."""

    at_ms: int
    rows_in: float
    rows_out: float
    queries: float
    failed: float
    active_queries: float
    lookup_buckets: tuple[tuple[float, float], ...]
    query_buckets: tuple[tuple[float, float], ...]


def _total(metric: Any, suffix: str = "_total") -> float:
    return sum(s.value for family in metric.collect() for s in family.samples if s.name.endswith(suffix))


def _buckets(samples: list[Any]) -> tuple[tuple[float, float], ...]:
    by_bound: dict[float, float] = {}
    for s in samples:
        bound = float(s.labels["le"])
        by_bound[bound] = by_bound.get(bound, 0.0) + s.value
    return tuple(sorted(by_bound.items()))


def take_sample(metrics: Any, now_ms: int | None = None) -> Sample:
    """The cumulative values of ``metrics`` now."""
    queries = failed = 0.0
    query_buckets: list[Any] = []
    for family in metrics.rpcs.collect():
        for s in family.samples:
            if s.name.endswith("_total") and s.labels["method"] in QUERY_METHODS:
                queries += s.value
                failed += s.value if s.labels["status"] != "OK" else 0.0
    for family in metrics.latency.collect():
        query_buckets += [s for s in family.samples
                          if s.name.endswith("_bucket") and s.labels["method"] in QUERY_METHODS]
    lookup_buckets = [s for family in metrics.lookups.collect() for s in family.samples
                      if s.name.endswith("_bucket")]
    return Sample(at_ms=int(time.time() * 1000) if now_ms is None else now_ms,
                  rows_in=_total(metrics.rows_in), rows_out=_total(metrics.rows_out),
                  queries=queries, failed=failed, active_queries=metrics.active_queries._value.get(),
                  lookup_buckets=_buckets(lookup_buckets), query_buckets=_buckets(query_buckets))


def quantile(q: float, before: tuple[tuple[float, float], ...], after: tuple[tuple[float, float], ...]
             ) -> float | None:
    """The ``q`` quantile (seconds) of the observations between two cumulative histograms, linear
    within the bucket it falls in (None: no observation). Past the last finite bound it answers
    that bound."""
    old = dict(before)
    deltas = [(bound, count - old.get(bound, 0.0)) for bound, count in after]
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in deltas:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = bound, cumulative
    return lower


class RateRing:
    """The last ``span_s`` of samples of ``metrics``, one every ``interval_s``."""

    def __init__(self, metrics: Any, *, interval_s: float = 10.0, span_s: float = 3600.0,
                 sample: Callable[[Any], Sample] = take_sample) -> None:
        self.metrics = metrics
        self.interval_s = interval_s
        self._sample = sample
        self._samples: deque[Sample] = deque(maxlen=max(2, int(span_s / interval_s) + 1))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> RateRing:
        self.sample_now()
        self._thread = threading.Thread(target=self._run, name="flightstore-console-rates", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_now()

    def sample_now(self) -> None:
        sample = self._sample(self.metrics)
        with self._lock:
            self._samples.append(sample)

    def series(self) -> dict[str, Any]:
        """One point per interval: ``t`` (ms, the interval's end), ``rows_in`` / ``rows_out`` /
        ``queries`` / ``failed`` per second, ``active_queries`` at the end, and ``lookup_p50`` /
        ``lookup_p99`` / ``query_p50`` / ``query_p99`` in milliseconds (None: nothing observed)."""
        with self._lock:
            samples = list(self._samples)
        points = []
        for before, after in zip(samples, samples[1:]):
            seconds = max((after.at_ms - before.at_ms) / 1000, 1e-3)
            point: dict[str, Any] = {"t": after.at_ms, "active_queries": after.active_queries}
            for name in ("rows_in", "rows_out", "queries", "failed"):
                point[name] = max(getattr(after, name) - getattr(before, name), 0.0) / seconds
            for name, field in (("lookup", "lookup_buckets"), ("query", "query_buckets")):
                for q in (50, 99):
                    value = quantile(q / 100, getattr(before, field), getattr(after, field))
                    point[f"{name}_p{q}"] = None if value is None else value * 1000
            points.append(point)
        return {"interval_s": self.interval_s, "points": points}
