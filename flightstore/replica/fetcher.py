"""The follower's side of replication: one long-lived fetch stream per leader server.

A :class:`Fetcher` follows every replica this server holds whose leader is one given server. It
opens a Flight ``DoExchange`` to that server (:mod:`flightstore.replica.protocol`) and loops:

1. replicas that just became followers first ask where the leader's log of their newest epoch
   ends, and truncate where their log diverges (:meth:`Replica.truncate`);
2. one fetch request names every replica with its log end (which also acknowledges what it
   holds); the answer brings the records after each, and the leader's high watermark;
3. the records are appended verbatim, then the next request goes out at once (it acknowledges
   them), and the KV catches up to the high watermark while the leader answers.

A broken stream (the leader died, was paused or restarted) is reopened after
``log.replica.fetch-backoff-interval``; an answer that does not come within the watchdog time
cancels the stream. A replica that cannot append what its leader sent truncates again, but not at
once: it sits out of the stream for the backoff interval, doubled at each failure in a row (up to
:data:`MAX_RETRY_S`), so a replica that cannot converge never spins (the others go on fetching).
The replica manager adds and removes replicas as leadership moves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pyarrow import flight

from flightstore.errors import FlightstoreError
from flightstore.replica import protocol
from flightstore.replica.protocol import ReplicaKey
from flightstore.replica.replica import Replica

__all__ = ["Fetcher"]

log = logging.getLogger("flightstore.replica")

WAIT_MS = 500           # how long a leader holds a fetch that finds nothing new
WATCHDOG_S = 15.0       # an answer later than this (beyond WAIT_MS) means the leader hangs
MAX_RETRY_S = 8.0       # the longest a replica waits to retry after failed appends (< WATCHDOG_S)


class Fetcher:
    """Follows the replicas led by server ``leader`` (see the module docstring)."""

    def __init__(self, me: int, leader: int, uri: Callable[[int], str | None],
                 connect: Callable[[str], flight.FlightClient], call_options: Callable[[], Any], *,
                 max_bytes: int, backoff_s: float) -> None:
        """``connect(uri)`` gives the Flight client of a server; ``call_options()`` the options
        (peer credential) of this server's own calls."""
        self.me = me
        self.leader = leader
        self._uri = uri
        self._connect = connect
        self._call_options = call_options
        self._max_bytes = max_bytes
        self._backoff_s = backoff_s
        self._lock = threading.Condition()
        self._replicas: dict[ReplicaKey, Replica] = {}
        self._truncated: set[ReplicaKey] = set()
        self._failures: dict[ReplicaKey, int] = {}      # failed appends in a row
        self._retry_at: dict[ReplicaKey, float] = {}    # monotonic time a failed replica retries
        self._stop = threading.Event()
        self._reader: Any = None
        self._last_answer = time.monotonic()
        self.last_error: str | None = None
        self.fetches = 0
        self._thread = threading.Thread(target=self._run, name=f"replica-fetcher-{leader}", daemon=True)
        self._thread.start()

    # ---- membership ---------------------------------------------------------------------------
    def add(self, key: ReplicaKey, replica: Replica) -> None:
        """Follow ``replica`` (again): it truncates first."""
        with self._lock:
            self._replicas[key] = replica
            self._truncated.discard(key)
            self._failures.pop(key, None)
            self._retry_at.pop(key, None)
            self._lock.notify_all()
        self._interrupt()

    def remove(self, key: ReplicaKey) -> None:
        with self._lock:
            self._replicas.pop(key, None)
            self._truncated.discard(key)
            self._failures.pop(key, None)
            self._retry_at.pop(key, None)

    def keys(self) -> list[ReplicaKey]:
        with self._lock:
            return list(self._replicas)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        self._interrupt()
        self._thread.join(10)

    def check_alive(self) -> None:
        """Cancel a stream whose answer is overdue (a paused or hung leader)."""
        if self._reader is not None and time.monotonic() - self._last_answer > WATCHDOG_S + WAIT_MS / 1000:
            log.warning("replication from server %d: no answer for %.0f s; reconnecting", self.leader,
                        time.monotonic() - self._last_answer)
            self._interrupt()

    def _interrupt(self) -> None:
        reader = self._reader
        if reader is not None:
            try:
                reader.cancel()
            except Exception:  # noqa: BLE001 - already gone
                pass

    def _snapshot(self, key: ReplicaKey) -> tuple[int, list[tuple[str, bytes]]]:
        """A copy of the leader's newest KV snapshot of replica ``key``: its offset and files."""
        uri = self._uri(self.leader)
        if uri is None:
            raise FlightstoreError(f"server {self.leader} is not live")
        ticket = flight.Ticket(protocol.command({"op": protocol.SNAPSHOT_OP, "key": list(key)}))
        reader = self._connect(uri).do_get(ticket, self._call_options())
        table = reader.read_all()
        offset = int((table.schema.metadata or {})[b"offset"])
        return offset, list(zip(table.column("path").to_pylist(), table.column("data").to_pylist()))

    # ---- the loop -----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._lock.wait_for(lambda: self._replicas or self._stop.is_set())
            if self._stop.is_set():
                return
            try:
                self._session()
            except Exception as exc:  # noqa: BLE001 - any failure: back off and reconnect
                if self._stop.is_set():
                    return
                self.last_error = f"{type(exc).__name__}: {exc}".split("\n")[0][:300]
                log.info("replication from server %d interrupted (%s); retrying", self.leader, self.last_error)
                with self._lock:
                    self._truncated.clear()  # a new session starts by checking divergence again
                self._stop.wait(self._backoff_s)

    def _session(self) -> None:
        uri = self._uri(self.leader)
        if uri is None:
            raise FlightstoreError(f"server {self.leader} is not live")
        client = self._connect(uri)
        descriptor = flight.FlightDescriptor.for_command(
            protocol.command({"op": protocol.FETCH_OP, "follower": self.me}))
        writer, reader = client.do_exchange(descriptor, self._call_options())
        self._reader = reader
        self._last_answer = time.monotonic()
        in_flight: dict[ReplicaKey, Replica] | None = None  # the replicas of the request sent
        try:
            while not self._stop.is_set():
                replicas, fresh, waiting = self._ready()
                if in_flight is None and not replicas and waiting is None:
                    return
                if in_flight is None and not replicas:  # every replica waits to retry
                    with self._lock:
                        self._lock.wait(max(0.0, waiting - time.monotonic()))
                    continue
                if in_flight is None and fresh:
                    self._truncate(writer, reader, {k: replicas[k] for k in fresh})
                    continue
                if in_flight is None:
                    in_flight = self._request(writer, replicas)
                catching_up = self._receive(reader, in_flight)
                in_flight = None
                replicas, fresh, _ = self._ready()
                if replicas and not fresh and not self._stop.is_set():
                    # Acknowledge what just arrived at once; the KVs catch up while the leader answers.
                    in_flight = self._request(writer, replicas)
                for replica in catching_up:
                    replica.apply_committed()
        finally:
            self._reader = None
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - the stream is gone anyway
                pass

    def _ready(self) -> tuple[dict[ReplicaKey, Replica], list[ReplicaKey], float | None]:
        """The replicas to fetch for now (not waiting to retry), those of them that truncate
        first, and when the next waiting one may retry (None: none waits)."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, at in self._retry_at.items() if at <= now]:
                del self._retry_at[key]
            replicas = {k: r for k, r in self._replicas.items() if k not in self._retry_at}
            fresh = [k for k in replicas if k not in self._truncated]
            return replicas, fresh, min(self._retry_at.values(), default=None)

    def _failed(self, key: ReplicaKey, replica: Replica, exc: Exception) -> None:
        """``replica`` could not append what the leader sent: it truncates again after a backoff."""
        with self._lock:
            if self._replicas.get(key) is not replica:
                return
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            delay = min(self._backoff_s * 2 ** (failures - 1), MAX_RETRY_S)
            self._retry_at[key] = time.monotonic() + delay
            self._truncated.discard(key)
        log.warning("%s: cannot append what the leader sent (%s); truncating again in %.1f s (failure %d "
                    "in a row)", replica.label, exc, delay, failures)

    def _restart(self, replica: Replica, key: ReplicaKey, start: int) -> None:
        def snapshot() -> tuple[int, list[tuple[str, bytes]]]:
            return self._snapshot(key)
        try:
            replica.restart_from(start, snapshot)
        except FlightstoreError as exc:
            log.warning("%s: cannot restart from the leader's snapshot yet (%s)", replica.label, exc)

    def _answer(self, reader: Any) -> tuple[dict, dict[ReplicaKey, list]]:
        """The next answer frame's metadata and records (see :mod:`.protocol`)."""
        chunk = reader.read_chunk()
        self._last_answer = time.monotonic()
        return protocol.decode_answer(chunk.app_metadata)

    def _truncate(self, writer: Any, reader: Any, replicas: dict[ReplicaKey, Replica]) -> None:
        items = [{"key": list(k), "epoch": r.epochs.latest if r.epochs.latest is not None else -1}
                 for k, r in replicas.items()]
        writer.write_metadata(protocol.dump({"epoch_end": items}))
        meta, _ = self._answer(reader)
        for answer in meta.get("epoch_end", []):
            key = tuple(answer["key"])
            replica = replicas.get(key)
            if replica is None:
                continue
            if "error" in answer:
                log.info("%s: the leader refused the truncation question: %s", replica.label, answer["error"])
                continue
            with replica.lock:
                if replica.leadership.leader != self.leader:
                    continue
                replica.truncate(replica.truncation_point(answer.get("epoch"), int(answer["end"])))
            with self._lock:
                if self._replicas.get(key) is replica:
                    self._truncated.add(key)
        if any(tuple(a["key"]) in replicas and "error" in a for a in meta.get("epoch_end", [])):
            self._stop.wait(self._backoff_s)

    def _request(self, writer: Any, replicas: dict[ReplicaKey, Replica]) -> dict[ReplicaKey, Replica]:
        items = [{"key": list(k), "offset": r.log.end_offset, "epoch": r.leadership.epoch}
                 for k, r in replicas.items()]
        writer.write_metadata(protocol.dump({"fetch": items, "wait_ms": WAIT_MS,
                                             "max_bytes": self._max_bytes}))
        return replicas

    def _receive(self, reader: Any, replicas: dict[ReplicaKey, Replica]) -> list[Replica]:
        """Read one fetch answer and append its records; returns the replicas whose KV may move."""
        meta, records = self._answer(reader)
        self.fetches += 1
        refused = False
        moved: list[Replica] = []
        for answer in meta.get("replicas", []):
            key = tuple(answer["key"])
            replica = replicas.get(key)
            if replica is None:
                continue
            if "error" in answer:
                if "start" in answer:  # behind the leader's log start
                    self._restart(replica, key, int(answer["start"]))
                else:
                    refused = True
                continue
            fetched = records.get(key, [])
            try:
                if replica.append_fetched([r for _, r in fetched], [e for e, _ in fetched], int(answer["hw"]),
                                          self.leader):
                    moved.append(replica)
            except FlightstoreError as exc:
                self._failed(key, replica, exc)
                continue
            if fetched:
                with self._lock:
                    self._failures.pop(key, None)
        if refused:
            self._stop.wait(min(self._backoff_s, 0.2))
        return moved
