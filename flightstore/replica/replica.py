"""One server's copy of one bucket: its log and KV, its role, the leader epoch it knows, its high
watermark, and (as a leader) what each follower has fetched.

Every :class:`~flightstore.store.Table` holds one :class:`Replica` per bucket (per partition for a
partitioned table). On a single server, and for a bucket with replication factor 1, the replica
is a *solo* leader: its log has no separate high watermark (every appended record is committed)
and writes wait for nothing. In a cluster the replica manager
(:mod:`flightstore.replica.manager`) gives it a :class:`Leadership` (ZooKeeper's leader, epoch and
in-sync replica set, as this server applies it) and moves it between roles:

* **leader**: takes writes (:meth:`check_writable` before, :meth:`await_commit` after) and answers
  its followers' fetches (:meth:`records_for` / :meth:`fetched`); its high watermark is the lowest
  log end of its in-sync replicas, and never goes back;
* **follower**: appends what its leader sends (:meth:`append_fetched`), verbatim, sets its high
  watermark to the leader's (never past its own end), and applies its KV up to it: the same fold
  as recovery, so its KV equals its leader's at every committed offset.

Changing role (:meth:`become_leader`, :meth:`become_follower`) and truncation (:meth:`truncate`)
hold the replica's lock; so do the fetch paths, so a role change never interleaves with them.
See ``docs/replication.md``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flightstore.errors import NotEnoughReplicas, NotLeader
from flightstore.log import LogTablet
from flightstore.log.record import RawRecord
from flightstore.replica.epochs import LeaderEpochCache, divergence

__all__ = ["FollowerProgress", "Leadership", "Replica", "SOLO"]

log = logging.getLogger("flightstore.replica")


@dataclass(frozen=True)
class Leadership:
    """Who leads a bucket, at which epoch, with which in-sync replicas, as seen by ``me``.
    ``replicated`` is False for a solo replica (one server, or replication factor 1)."""

    me: int | None = None
    leader: int | None = None
    epoch: int = 0
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    min_isr: int = 1
    replicated: bool = False
    commit_timeout_s: float = 30.0

    @property
    def is_leader(self) -> bool:
        return not self.replicated or self.leader == self.me

    @property
    def followers(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r != self.me)


SOLO = Leadership()


@dataclass
class FollowerProgress:
    """What a leader knows of one follower of one replica."""

    leo: int | None = None                 # the follower's log end (its last fetch offset)
    last_fetch_s: float = 0.0              # monotonic time of its last fetch
    caught_up_s: float = field(default_factory=time.monotonic)  # last time it had our log end
    sent_leo: int = 0                      # our log end when we last answered it


class Replica:
    """One bucket (of one partition) of a table on this server: see the module docstring."""

    def __init__(self, log_tablet: LogTablet, kv: object | None, bucket: int, *, fsync: bool = True,
                 leadership: Leadership = SOLO) -> None:
        self.log = log_tablet
        self.kv = kv
        self.bucket = bucket
        self.epochs = LeaderEpochCache(log_tablet.directory, fsync=fsync)
        self.leadership: Leadership = leadership
        log_tablet.leading = leadership.is_leader
        self.lock = threading.RLock()
        self._progress: dict[int, FollowerProgress] = {}
        self.leader_since_s = time.monotonic()
        self.on_append: Callable[[], None] | None = None  # the replica manager wakes fetch answers
        self.rebuilt: Any = None  # flightstore.remote.RebuiltBucket when rebuilt from remote storage
        # A follower's high watermark its KV was last seen to hold (None: unknown, read the KV's
        # applied offset): an answer that moves neither the log nor the HW costs no KV read.
        self._kv_at: int | None = None

    @property
    def epoch_start(self) -> int:
        """Where the current leader epoch's records begin in this log (0 when unknown)."""
        entries = self.epochs.entries
        return entries[-1][1] if entries else 0

    def appended(self) -> None:
        """A write appended records: followers waiting on their fetch get them now, and a leader
        that is its bucket's only in-sync replica (its followers dropped out) commits them at
        once (no follower fetch would ever advance its high watermark)."""
        if not self.leadership.replicated:
            return
        with self.lock:
            self._advance_high_watermark()
        callback = self.on_append
        if callback is not None:
            callback()

    @property
    def label(self) -> str:
        return self.log.label

    # ---- writes (leader) ----------------------------------------------------------------------
    def check_writable(self) -> None:
        """Refuse a write this replica must not take: it does not lead, or too few replicas are
        in sync (nothing is written then)."""
        lead = self.leadership
        if not lead.replicated:
            return
        if lead.leader != lead.me:
            raise NotLeader(f"{self.label}: server {lead.me} does not lead this bucket (server "
                            f"{lead.leader} does, epoch {lead.epoch}); retry at the leader")
        if len(lead.isr) < lead.min_isr:
            raise NotEnoughReplicas(
                f"{self.label}: only {len(lead.isr)} replica(s) in sync ({', '.join(map(str, lead.isr))}), "
                f"fewer than log.replica.min-in-sync-replicas-number = {lead.min_isr}; nothing was written")

    def await_commit(self, end_offset: int, truncations: int | None = None) -> None:
        """Return once every in-sync replica holds the log below ``end_offset`` (acks = all);
        :class:`NotEnoughReplicas` after the leadership's commit timeout (not acknowledged).

        ``truncations`` is :attr:`LogTablet.truncations` when the write was appended: if this
        replica was deposed meanwhile and its log cut below ``end_offset``, the offsets the high
        watermark now covers hold the new leader's records, not the write's: :class:`NotLeader`
        (not acknowledged; a retry with the same writer id and sequence applies it once)."""
        if not self.log.replicated or end_offset <= 0:
            return
        timeout = self.leadership.commit_timeout_s
        committed = self.log.wait_for(end_offset - 1, timeout)
        if truncations is not None and self.log.cut_below(end_offset, truncations):
            raise NotLeader(f"{self.label}: this server stopped leading the bucket before the write was "
                            f"committed, and its log was cut below offset {end_offset} to follow the new "
                            f"leader (server {self.leadership.leader}); not acknowledged (a retry with the "
                            "same writer id and sequence is applied once)")
        lead = self.leadership
        if committed and lead.leader == lead.me and len(lead.isr) < lead.min_isr:
            # The in-sync replicas shrank below the minimum after the write was appended (the view
            # that dropped them came after check_writable): the high watermark passed it with too few
            # copies (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND).
            raise NotEnoughReplicas(
                f"{self.label}: the in-sync replicas shrank to {len(lead.isr)} "
                f"({', '.join(map(str, lead.isr))}) after the write was appended, fewer than "
                f"log.replica.min-in-sync-replicas-number = {lead.min_isr}; it is not acknowledged (a retry "
                "with the same writer id and sequence is applied once)")
        if not committed:
            if lead.leader != lead.me:
                raise NotLeader(f"{self.label}: this server stopped leading the bucket before the write "
                                f"was replicated (the leader is now server {lead.leader}); not acknowledged")
            raise NotEnoughReplicas(
                f"{self.label}: the in-sync replicas ({', '.join(map(str, lead.isr))}) did not confirm the "
                f"write within {timeout:g} s; it is not acknowledged (a retry with the same writer id "
                "and sequence is applied once)")

    # ---- the leader's side of replication -----------------------------------------------------
    def records_for(self, follower: int, offset: int, max_bytes: int) -> list[RawRecord]:
        """Records from ``offset`` for ``follower`` (whose log ends there); notes its progress."""
        with self.lock:
            self.fetched(follower, offset)
            # Nothing new (most replicas of a fetch, most of the time): no read.
            records = [] if offset == self.log.end_offset else self.log.read_raw(offset, max_bytes)
            progress = self._progress.setdefault(follower, FollowerProgress())
            progress.sent_leo = self.log.end_offset
            return records

    def fetched(self, follower: int, offset: int) -> None:
        """``follower`` holds our log below ``offset``: advance the high watermark if it can."""
        now = time.monotonic()
        with self.lock:
            progress = self._progress.setdefault(follower, FollowerProgress())
            progress.last_fetch_s = now
            progress.leo = offset
            if offset >= progress.sent_leo or offset >= self.log.end_offset:
                progress.caught_up_s = now
            self._advance_high_watermark()

    def _advance_high_watermark(self) -> None:
        lead = self.leadership
        if not lead.replicated or lead.leader != lead.me:
            return
        ends = [self.log.end_offset]
        for member in lead.isr:
            if member == lead.me:
                continue
            progress = self._progress.get(member)
            ends.append(progress.leo if progress is not None and progress.leo is not None else 0)
        hw = min(ends)
        if hw > self.log.high_watermark:
            self.log.set_high_watermark(hw)

    def progress(self) -> dict[int, FollowerProgress]:
        with self.lock:
            return {k: FollowerProgress(**vars(v)) for k, v in self._progress.items()}

    def epoch_end(self, epoch: int) -> tuple[int | None, int]:
        """The leader's answer to a follower's truncation question (see :mod:`.epochs`)."""
        return self.epochs.end_for(epoch, self.log.end_offset)

    # ---- the follower's side ------------------------------------------------------------------
    def append_fetched(self, records: list[RawRecord], epochs: list[int], leader_hw: int,
                       source: int | None = None) -> bool:
        """Append records fetched from the leader (each with the leader epoch that wrote it) and
        follow the leader's high watermark; True when the KV has changes to apply
        (:meth:`apply_committed`). ``source``: the server that sent them; an answer from a server
        that no longer leads this replica (a fetch answered late by a deposed leader) is dropped."""
        with self.lock:
            if self.leadership.leader == self.leadership.me:
                return False  # became leader meanwhile: an answer of the old stream
            if source is not None and source != self.leadership.leader:
                return False  # follows another leader now: the old one's records may be cut there
            for record, epoch in zip(records, epochs):
                if record.base_offset != self.log.end_offset:
                    continue  # a duplicate of what an earlier answer brought (or a stale answer)
                self.epochs.assign(epoch, record.base_offset)
                self.log.append_raw(record)
            self.log.set_high_watermark(min(leader_hw, self.log.end_offset))
            hw = self.log.high_watermark
            if self.kv is None or hw == self._kv_at:
                return False  # the KV holds this high watermark already (no read of its offset)
            if self.kv.applied_offset < hw:
                return True
            self._kv_at = hw
            return False

    def apply_committed(self) -> None:
        """A follower's KV takes the changelog up to the high watermark (the fold recovery does)."""
        with self.lock:
            if self.kv is not None and self.leadership.leader != self.leadership.me:
                self._kv_at = None
                self.kv.recover()
                self._kv_at = self.log.high_watermark if self.kv.applied_offset >= self.log.high_watermark else None

    def restart_from(self, start: int, snapshot: Callable[[], tuple[int, Iterable[tuple[str, bytes]]]]) -> None:
        """The leader's log no longer reaches back to this follower's end: start over from the
        leader's log start (a log table), or from a copy of the leader's newest KV snapshot (a
        primary-key table: its KV needs the rows the deleted changelog made)."""
        with self.lock:
            self._kv_at = None
            if self.kv is None:
                log.warning("%s: the leader's log starts at %d, after this replica's end %d: restarting "
                            "the replica there", self.label, start, self.log.end_offset)
                self.log.reset(start)
                self.epochs.truncate_from(start)
                return
            offset, files = snapshot()
            info = self.kv.snapshots.install(files)
            log.warning("%s: the leader's log starts at %d, after this replica's end %d: restarting the "
                        "replica from the leader's KV snapshot %d (log offset %d)", self.label, start,
                        self.log.end_offset, info.id, offset)
            with self.kv.exclusive():  # reads that began before see the reset (see truncate)
                self.kv.snapshots.drop_after(offset)
                self.log.reset(offset)
                self.epochs.truncate_from(offset)
                self.kv.rebuild()

    def truncation_point(self, leader_epoch: int | None, leader_end: int) -> int:
        return divergence(self.epochs, self.log.end_offset, leader_epoch, leader_end)

    def truncate(self, offset: int) -> None:
        """Cut the log at ``offset`` (where it diverges from the leader's) and forget the epochs
        that start there or later (Kafka's ``truncateFromEnd``); a KV that applied past it is
        rebuilt (from a snapshot at or below it, or the log).

        The epochs are cut even when the log has nothing past ``offset``: an entry at or after the
        log's end covers no record of it (an epoch this server led without appending, say from an
        empty log), and kept it would refuse the leader's older epoch at those offsets forever."""
        with self.lock:
            self._kv_at = None
            if offset >= self.log.end_offset:
                self.epochs.truncate_from(self.log.end_offset)
                return
            log.warning("%s: truncating the log from offset %d to %d (it diverged from the leader's)",
                        self.label, self.log.end_offset, offset)
            with self.kv.exclusive() if self.kv is not None else contextlib.nullcontext():
                end = self.log.truncate_to(offset)
                self.epochs.truncate_from(end)
                if self.kv is not None and self.kv.applied_offset > end:
                    self.kv.snapshots.drop_after(end)
                    self.kv.rebuild()

    # ---- roles --------------------------------------------------------------------------------
    def become_leader(self, leadership: Leadership) -> None:
        """Lead at ``leadership.epoch``: the records appended from now on belong to it; the KV
        takes the log's uncommitted tail (it was applied up to the old high watermark)."""
        with self.lock:
            self._kv_at = None
            previous = self.leadership
            self.log.following = False
            self.log.leading = True
            if self.log.remote is not None:  # what the previous leader uploaded
                self.log.remote.refresh()
            if leadership.replicated:
                self.epochs.assign(leadership.epoch, self.log.end_offset)
                self.log.read_floor = self.log.end_offset  # no answer shorter than what was acknowledged
                if not self.log.replicated:
                    # What the in-sync replicas hold is not known yet (a restart): nothing is
                    # readable until they say so with their first fetch.
                    self.log.set_high_watermark(self.log.start_offset)
            if self.kv is not None:
                self.kv.recover(uncommitted=True)
            if previous.leader != leadership.me or previous.epoch != leadership.epoch:
                self._progress = {}
                self.leader_since_s = time.monotonic()
            self.leadership = leadership
            if not leadership.replicated:
                self.log.set_high_watermark(None)  # solo: everything appended is committed
            else:
                self._advance_high_watermark()

    def become_follower(self, leadership: Leadership) -> None:
        """Follow ``leadership.leader``: no writes and no reads here; the fetcher truncates the log
        to where it agrees with the leader's, then appends what the leader sends."""
        with self.lock:
            self._kv_at = None
            self.leadership = leadership
            self._progress = {}
            self.log.following = True
            self.log.leading = False
            hw = self.log.high_watermark
            self.log.set_high_watermark(min(hw, self.log.end_offset))

    def update(self, leadership: Leadership) -> None:
        """The same role with a new in-sync replica set (or limits): the high watermark may move."""
        with self.lock:
            self.leadership = leadership
            self._advance_high_watermark()
