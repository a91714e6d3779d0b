"""The replicas of one server: roles from the cluster's decisions, fetchers, fetch answers, ISR.

:class:`ReplicaManager` listens to the cluster view (after the catalog mirror applied it) and, for
every bucket this server holds a replica of, makes each partition's :class:`Replica` leader or
follower at the epoch ZooKeeper says (:meth:`apply`). It runs one :class:`Fetcher` per leader
server its followers follow, answers its own followers' fetch streams (:meth:`serve_fetch`), and,
for the buckets it leads, keeps the in-sync replica set honest (:meth:`_maintain_isr`): a follower
that has not caught up for ``log.replica.max-lag-time`` leaves it, one that caught up rejoins it.
ISR changes are compare-and-set writes in ZooKeeper that check this server still leads at its
epoch (``adjust_isr``): a deposed leader's change fails, and it learns it was deposed.

Only a leader answers reads and takes writes, and only at the epoch the caller knows
(:meth:`require_leader`); see ``docs/replication.md``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pyarrow import flight

from flightstore.config import server_option
from flightstore.errors import BucketUnavailable, FlightstoreError, InvalidInput, NotLeader, OffsetOutOfRange
from flightstore.replica import protocol
from flightstore.replica.fetcher import WAIT_MS, Fetcher
from flightstore.replica.protocol import ReplicaKey
from flightstore.replica.replica import Leadership, Replica
from flightstore.schema import TablePath

__all__ = ["PENDING", "ReplicaManager"]

log = logging.getLogger("flightstore.replica")

#: The leadership of a bucket in cluster mode before the replica manager applied the view: it
#: takes no write (and the cluster routes no read to it).
PENDING = Leadership(me=-1, replicated=True)

#: Encoded fetch answers kept for the other followers of the same records (at most this many, of
#: at most :data:`SHARED_ANSWER_BYTES` each: the tail of the log every in-sync follower asks for).
SHARED_ANSWERS = 8
SHARED_ANSWER_BYTES = 1 << 20

AdjustIsr = Callable[[str, int, int, int, Sequence[int]], bool]


def _partitions(table: Any, bucket: int) -> dict[int, Replica]:
    """The replicas of ``bucket`` in every partition of ``table`` (-1: unpartitioned)."""
    units = getattr(table, "units", None)
    if units is None:
        return {-1: table.replicas[bucket]} if bucket < len(table.replicas) else {}
    return {pid: unit.replicas[bucket] for pid, unit in list(units.items()) if bucket < len(unit.replicas)}


class ReplicaManager:
    """The replica side of one cluster member (see the module docstring)."""

    def __init__(self, store: Any, server_id: int, options: Mapping[str, Any], *,
                 uri_of: Callable[[int], str | None], connect: Callable[[str], flight.FlightClient],
                 call_options: Callable[[], Any], adjust_isr: AdjustIsr) -> None:
        self.store = store
        self.me = server_id
        self.options = dict(options)
        self._uri_of = uri_of
        self._connect = connect
        self._call_options = call_options
        self._adjust_isr = adjust_isr
        self.min_isr = server_option(options, "log.replica.min-in-sync-replicas-number")
        self.max_lag_s = server_option(options, "log.replica.max-lag-time") / 1000
        self.commit_timeout_s = server_option(options, "log.replica.write-timeout") / 1000
        self.backoff_s = server_option(options, "log.replica.fetch-backoff-interval") / 1000
        self.max_bytes = server_option(options, "log.fetch.max-bytes")
        self._lock = threading.RLock()
        self._appended = threading.Condition()
        self._answers: OrderedDict[tuple, bytes] = OrderedDict()  # see _encoded
        self._answers_lock = threading.Lock()
        self._fetchers: dict[int, Fetcher] = {}
        self._following: dict[ReplicaKey, int] = {}        # replica -> the leader it fetches from
        self._tables: dict[str, TablePath] = {}             # table id -> path, from the last view
        self._groups: dict[tuple[str, int], tuple[Leadership, TablePath]] = {}  # buckets held here
        self._stop = threading.Event()
        self._draining = threading.Event()  # the server is stopping: see drain()
        self._thread = threading.Thread(target=self._maintain, name="replica-isr", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self._appended:
            self._appended.notify_all()
        with self._lock:
            fetchers, self._fetchers = list(self._fetchers.values()), {}
        for fetcher in fetchers:
            fetcher.stop()
        self._thread.join(10)

    def drain(self) -> None:
        """The server is stopping (it takes no new call): each follower's fetch stream ends once an
        answer has no records for it (it holds every record here), instead of keeping the server's
        shutdown waiting for the stream (every leader of a cluster stopped at once waited for the
        others' fetchers, each until its hard exit). Records still being replicated (a write that
        waits for its followers) go on streaming until the follower has them."""
        self._draining.set()
        with self._appended:
            self._appended.notify_all()

    # ---- the view -----------------------------------------------------------------------------
    def apply(self, view: Any) -> None:
        """Give every local replica the role the view says (the metadata listener calls this after
        the catalog mirror, so every table of the view exists locally)."""
        with self._lock:
            self._tables = {record.table_id: path for path, record in view.tables.items()}
            held: dict[tuple[str, int], tuple[Leadership, TablePath]] = {}
            followed: set[ReplicaKey] = set()  # every replica held here (a dropped partition's goes)
            for path, record in view.tables.items():
                mine = [b for b, a in enumerate(record.buckets) if self.me in a.replicas]
                if not mine:
                    continue
                try:
                    table = self.store.local_table(path)
                except FlightstoreError as exc:
                    log.warning("cannot open %s to serve its replicas: %s", path, exc)
                    continue
                for bucket in mine:
                    assignment = record.buckets[bucket]
                    lead = Leadership(me=self.me, leader=assignment.leader, epoch=assignment.leader_epoch,
                                      replicas=tuple(assignment.replicas), isr=tuple(assignment.isr),
                                      min_isr=self.min_isr, replicated=len(assignment.replicas) > 1,
                                      commit_timeout_s=self.commit_timeout_s)
                    held[(record.table_id, bucket)] = (lead, path)
                    for partition, replica in _partitions(table, bucket).items():
                        followed.add((record.table_id, partition, bucket))
                        self._apply_one((record.table_id, partition, bucket), replica, lead)
            gone = [key for key in self._following
                    if key not in followed or held[(key[0], key[2])][0].leader != self._following[key]]
            for key in gone:
                self._unfollow(key)
            self._groups = held

    def _apply_one(self, key: ReplicaKey, replica: Replica, lead: Leadership) -> None:
        replica.on_append = self._notify_appended
        replica.log.commit_timeout_s = lead.commit_timeout_s
        current = replica.leadership
        if current == lead:
            return
        same_term = current.me == lead.me and current.leader == lead.leader and current.epoch == lead.epoch
        if lead.leader == self.me:
            if same_term:
                replica.update(lead)
            else:
                self._unfollow(key)
                replica.become_leader(lead)
                log.info("%s: leader at epoch %d (in sync: %s)", replica.label, lead.epoch, list(lead.isr))
            return
        if same_term:
            replica.update(lead)
            return
        replica.become_follower(lead)
        self._follow(key, replica, lead.leader)
        log.info("%s: follower of server %d at epoch %d", replica.label, lead.leader, lead.epoch)

    def _follow(self, key: ReplicaKey, replica: Replica, leader: int | None) -> None:
        self._unfollow(key)
        if leader is None or leader < 0:
            return
        fetcher = self._fetchers.get(leader)
        if fetcher is None:
            fetcher = self._fetchers[leader] = Fetcher(
                self.me, leader, self._uri_of, self._connect, self._call_options,
                max_bytes=self.max_bytes, backoff_s=self.backoff_s)
        fetcher.add(key, replica)
        self._following[key] = leader

    def _unfollow(self, key: ReplicaKey) -> None:
        leader = self._following.pop(key, None)
        if leader is not None and leader in self._fetchers:
            self._fetchers[leader].remove(key)

    # ---- what callers may touch ---------------------------------------------------------------
    def leadership(self, table_id: str, bucket: int) -> Leadership | None:
        with self._lock:
            held = self._groups.get((table_id, bucket))
            return held[0] if held else None

    def require_leader(self, table_id: str, buckets: Sequence[int], epochs: Mapping[int, int] | None = None,
                       *, what: str = "table") -> None:
        """NotLeader unless this server leads every bucket of ``buckets`` (at the epoch the caller
        names, when it names one)."""
        for bucket in buckets:
            lead = self.leadership(table_id, int(bucket))
            if lead is None or lead.leader != self.me:
                leader = None if lead is None else lead.leader
                raise NotLeader(f"{what}: server {self.me} does not lead bucket {bucket}"
                                + (f" (server {leader} does)" if leader is not None else "")
                                + "; the sender's cluster view is stale: retry")
            expected = None if epochs is None else epochs.get(int(bucket))
            if expected is not None and int(expected) != lead.epoch:
                raise NotLeader(f"{what}: bucket {bucket} is led at epoch {lead.epoch}, the sender "
                                f"knows epoch {expected}; retry with a fresh view")

    def _notify_appended(self) -> None:
        with self._appended:
            self._appended.notify_all()

    # ---- the leader's side of the fetch stream -------------------------------------------------
    def _replica(self, key: ReplicaKey) -> Replica:
        table_id, partition, bucket = key
        with self._lock:
            path = self._tables.get(table_id)
        if path is None:
            raise BucketUnavailable(f"no table with id {table_id} here (dropped, or this server's view is behind)")
        table = self.store.local_table(path)
        replica = _partitions(table, bucket).get(partition)
        if replica is None:
            raise BucketUnavailable(f"table {path} has no partition {partition} bucket {bucket} here")
        return replica

    def serve_fetch(self, follower: int, reader: Any, writer: Any, cancelled: Callable[[], bool]) -> None:
        """Answer follower ``follower``'s fetch stream until it ends (see :mod:`.protocol`)."""
        writer.begin(protocol.RECORDS)
        while not self._stop.is_set() and not cancelled():
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            request = protocol.load(chunk.app_metadata)
            if "epoch_end" in request:
                writer.write_metadata(protocol.encode_answer({"epoch_end": self._epoch_ends(request["epoch_end"])}))
            elif "fetch" in request:
                records, meta = self._fetch_answer(follower, request, cancelled)
                writer.write_metadata(protocol.encode_answer(meta, records))
                if not records and self._draining.is_set():
                    return  # the server is stopping and the follower has every record
            else:
                raise InvalidInput("a replication request needs 'fetch' or 'epoch_end'")

    def _epoch_ends(self, items: list[dict]) -> list[dict]:
        out = []
        for item in items:
            key = tuple(item["key"])
            try:
                replica = self._replica(key)
                lead = replica.leadership
                if lead.leader != self.me:
                    raise NotLeader(f"server {self.me} does not lead it")
                epoch, end = replica.epoch_end(int(item["epoch"]))
                out.append({"key": list(key), "epoch": epoch, "end": end})
            except FlightstoreError as exc:
                out.append({"key": list(key), "error": str(exc)})
        return out

    def _fetch_answer(self, follower: int, request: dict, cancelled: Callable[[], bool]) -> tuple[bytes, dict]:
        """The records part (:func:`protocol.encode_records`) and metadata of the answer to a fetch."""
        wanted: list[tuple[ReplicaKey, Replica, int]] = []
        errors = []
        for item in request["fetch"]:
            key = tuple(item["key"])
            try:
                replica = self._replica(key)
                lead = replica.leadership
                if lead.leader != self.me:
                    raise NotLeader(f"server {self.me} does not lead it (server {lead.leader} does)")
                if int(item["epoch"]) != lead.epoch:
                    raise NotLeader(f"the follower knows epoch {item['epoch']}, the leader is at {lead.epoch}")
                wanted.append((key, replica, int(item["offset"])))
            except FlightstoreError as exc:
                errors.append({"key": list(key), "error": str(exc)})
        max_bytes = int(request.get("max_bytes") or self.max_bytes)
        deadline = time.monotonic() + min(int(request.get("wait_ms", WAIT_MS)), 5_000) / 1000
        while True:
            records: list = []
            behind: list[dict] = []
            for key, replica, offset in wanted:
                if sum(len(memoryview(r.payload)) for _, _, r in records) >= max_bytes:
                    replica.fetched(follower, offset)
                    continue
                try:
                    found = replica.records_for(follower, offset, max_bytes)
                except OffsetOutOfRange:
                    # The follower is behind the log start (retention): it restarts from there.
                    behind.append({"key": list(key), "error": "offset out of range",
                                   "start": replica.log.start_offset})
                    continue
                records += [(key, replica.epochs.epoch_at(r.base_offset) or 0, r) for r in found]
            if records or behind or not wanted or time.monotonic() >= deadline or cancelled() or self._stop.is_set() \
                    or self._draining.is_set():
                break
            with self._appended:
                if all(replica.log.end_offset <= offset for _, replica, offset in wanted):
                    self._appended.wait(max(0.0, deadline - time.monotonic()))
        late = {tuple(b["key"]) for b in behind}
        meta = {"replicas": errors + behind + [{"key": list(key), "hw": replica.log.high_watermark,
                                                "leo": replica.log.end_offset}
                                               for key, replica, _ in wanted if key not in late]}
        return self._encoded(records, {key: replica for key, replica, _ in wanted}), meta

    def _encoded(self, records: list[tuple[ReplicaKey, int, Any]],
                 replicas: Mapping[ReplicaKey, Replica]) -> bytes:
        """``records`` as an answer's records part; the same records for another follower (every
        follower in sync asks for the log's newest records) reuse the bytes encoded for the first,
        so a write's records are encoded once, not once per follower.

        The key names each record by replica, offsets, epoch and payload CRC, with the replica's
        leader epoch and truncation count: records a truncation replaced at the same offsets
        never match."""
        if not records:
            return b""
        key = tuple((k, id(replicas[k]), replicas[k].leadership.epoch, replicas[k].log.truncations, epoch,
                     r.base_offset, r.num_rows, r.payload_crc) for k, epoch, r in records)
        with self._answers_lock:
            encoded = self._answers.get(key)
            if encoded is not None:
                self._answers.move_to_end(key)
                return encoded
        encoded = protocol.encode_records(records)
        if len(encoded) <= SHARED_ANSWER_BYTES:
            with self._answers_lock:
                self._answers[key] = encoded
                while len(self._answers) > SHARED_ANSWERS:
                    self._answers.popitem(last=False)
        return encoded

    def snapshot_files(self, key: ReplicaKey) -> tuple[int, Iterator[tuple[str, bytes]]]:
        """The newest KV snapshot of a replica this server leads, for a follower that must start
        from it: its log offset and its files."""
        replica = self._replica(key)
        if replica.leadership.leader != self.me:
            raise NotLeader(f"{replica.label}: server {self.me} does not lead it")
        snapshot = replica.kv.snapshots.newest if replica.kv is not None else None
        if snapshot is None:
            raise BucketUnavailable(f"{replica.label}: no KV snapshot to copy yet; retry")
        return snapshot.offset, replica.kv.snapshots.files(snapshot)

    # ---- in-sync replicas ---------------------------------------------------------------------
    def _maintain(self) -> None:
        interval = max(0.05, min(self.max_lag_s / 4, 1.0))
        while not self._stop.wait(interval):
            try:
                self._maintain_isr()
                with self._lock:
                    fetchers = list(self._fetchers.values())
                for fetcher in fetchers:
                    fetcher.check_alive()
            except Exception:  # noqa: BLE001 - keep maintaining whatever one bucket did
                log.exception("ISR maintenance failed")

    def _maintain_isr(self) -> None:
        with self._lock:
            groups = dict(self._groups)
        now = time.monotonic()
        for (table_id, bucket), (lead, path) in groups.items():
            if not lead.replicated or lead.leader != self.me:
                continue
            try:
                replicas = list(_partitions(self.store.local_table(path), bucket).values())
            except FlightstoreError:
                continue
            if not replicas:
                continue
            progress = [r.progress() for r in replicas]
            lagging = {f for f in lead.isr if f != self.me and any(
                now - p.get(f).caught_up_s > self.max_lag_s if f in p else
                now - r.leader_since_s > self.max_lag_s for r, p in zip(replicas, progress))}
            caught_up = {f for f in lead.replicas if f not in lead.isr and f != self.me and all(
                f in p and p[f].leo is not None and p[f].leo >= max(r.log.high_watermark, r.epoch_start)
                and now - p[f].last_fetch_s < self.max_lag_s for r, p in zip(replicas, progress))}
            if not lagging and not caught_up:
                continue
            isr = tuple(r for r in lead.replicas if (r in lead.isr and r not in lagging) or r in caught_up)
            if lagging:
                log.warning("table %s bucket %d: server(s) %s fell behind for over %.0f s; leaving the ISR",
                            path, bucket, sorted(lagging), self.max_lag_s)
            if caught_up:
                log.info("table %s bucket %d: server(s) %s caught up; rejoining the ISR", path, bucket,
                         sorted(caught_up))
            if self._adjust_isr(table_id, bucket, self.me, lead.epoch, isr):
                new = _with_isr(lead, isr)
                with self._lock:
                    self._groups[(table_id, bucket)] = (new, path)
                for replica in replicas:
                    replica.update(new)

    # ---- status -------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Per bucket held here: role, epoch, ISR, log end and high watermark (summed over
        partitions), and each follower's lag (as leader) — for ``cluster status`` and metrics."""
        with self._lock:
            groups = dict(self._groups)
            fetchers = {leader: f.last_error for leader, f in self._fetchers.items()}
        out: list[dict[str, Any]] = []
        for (table_id, bucket), (lead, path) in sorted(groups.items(), key=lambda i: (str(i[1][1]), i[0][1])):
            try:
                replicas = list(_partitions(self.store.local_table(path), bucket).values())
            except FlightstoreError:
                continue
            leo = sum(r.log.end_offset for r in replicas)
            hw = sum(r.log.high_watermark for r in replicas)
            rows = sum(r.kv.row_count if r.kv is not None else
                       r.log.high_watermark - r.log.start_offset - r.log.lost_rows for r in replicas)
            entry = {"table": str(path), "table_id": table_id, "bucket": bucket,
                     "role": "leader" if lead.leader == self.me else "follower", "leader": lead.leader,
                     "epoch": lead.epoch, "replicas": list(lead.replicas), "isr": list(lead.isr),
                     "log_start": min(r.log.start_offset for r in replicas) if replicas else 0,
                     "log_end": leo, "high_watermark": hw, "rows": rows}
            rebuilt = [r.rebuilt for r in replicas if r.rebuilt is not None]
            if rebuilt:  # never silent: what remote storage gave back, and what it could not
                entry["rebuilt_from_remote"] = [{"offset": b.offset, "log_start": b.log_start,
                                                 "lost": list(b.lost) if b.lost else None} for b in rebuilt]
            if lead.leader == self.me:
                lag: dict[str, int | None] = {}
                for follower in lead.followers:
                    ends = [r.progress().get(follower) for r in replicas]
                    known = [p.leo for p in ends if p is not None and p.leo is not None]
                    lag[str(follower)] = None if len(known) < len(replicas) else leo - sum(known)
                entry["lag"] = lag
            else:
                entry["fetch_error"] = fetchers.get(lead.leader)
            out.append(entry)
        return {"server_id": self.me, "buckets": out}


def _with_isr(lead: Leadership, isr: tuple[int, ...]) -> Leadership:
    return Leadership(me=lead.me, leader=lead.leader, epoch=lead.epoch, replicas=lead.replicas, isr=isr,
                      min_isr=lead.min_isr, replicated=lead.replicated, commit_timeout_s=lead.commit_timeout_s)
