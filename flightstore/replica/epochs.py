"""The leader epoch cache of one log: which leader epoch wrote which offsets (Kafka's
``leader-epoch-checkpoint``, KIP-101).

A log directory's ``leader-epochs.json`` holds ``[[epoch, start_offset], ...]`` in increasing
order of both: records from ``start_offset`` on were appended by the leader of ``epoch`` (until the
next entry). A leader adds ``(epoch, its log end)`` when it takes office; a follower adds the
entries of the records it fetches, so its cache is a prefix of its leader's.

After a change of leader, a follower truncates its log to where the two logs agree: it asks the
new leader for the end of its own last epoch (:meth:`LeaderEpochCache.end_for`), and both logs agree
up to the lower of the two ends of the largest epoch both know (:func:`divergence`). Committed
records (below the high watermark) are never cut: every in-sync replica has them under the same
epochs.

Durability: the file is replaced atomically (temporary file, fsync, rename) before the records of
a new epoch are appended; truncation rewrites it after the log is cut.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from pathlib import Path

from flightstore.errors import CorruptData

__all__ = ["EPOCHS_FILE", "LeaderEpochCache", "divergence"]

EPOCHS_FILE = "leader-epochs.json"


class LeaderEpochCache:
    """The epoch entries of one log directory (thread-safe)."""

    def __init__(self, directory: str | os.PathLike, *, fsync: bool = True) -> None:
        self._file = Path(directory) / EPOCHS_FILE
        self._fsync = fsync
        self._lock = threading.Lock()
        self._entries: list[tuple[int, int]] = []
        if self._file.exists():
            try:
                entries = [(int(e), int(o)) for e, o in json.loads(self._file.read_text("utf-8"))]
            except (ValueError, TypeError) as exc:
                raise CorruptData(f"{self._file}: unreadable leader epochs: {exc}") from None
            if any(b[0] <= a[0] or b[1] < a[1] for a, b in zip(entries, entries[1:])):
                raise CorruptData(f"{self._file}: leader epochs out of order: {entries}")
            self._entries = entries

    @property
    def entries(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(self._entries)

    @property
    def latest(self) -> int | None:
        """The newest epoch (None: no record was ever appended under an epoch)."""
        with self._lock:
            return self._entries[-1][0] if self._entries else None

    def assign(self, epoch: int, start_offset: int) -> None:
        """Records from ``start_offset`` on belong to ``epoch`` (a no-op for the current epoch).
        An epoch older than the newest is corruption of the protocol: refused."""
        with self._lock:
            if self._entries:
                last_epoch, last_start = self._entries[-1]
                if epoch == last_epoch:
                    return
                if epoch < last_epoch:
                    raise CorruptData(f"{self._file}: epoch {epoch} after epoch {last_epoch}")
                if start_offset == last_start:  # the previous epoch appended nothing: replace it
                    self._entries[-1] = (epoch, start_offset)
                    self._save()
                    return
                if start_offset < last_start:
                    raise CorruptData(f"{self._file}: epoch {epoch} starts at {start_offset}, before "
                                      f"epoch {last_epoch} at {last_start}")
            self._entries.append((epoch, start_offset))
            self._save()

    def epoch_at(self, offset: int) -> int | None:
        """The epoch that wrote ``offset`` (None: before any entry)."""
        with self._lock:
            starts = [o for _, o in self._entries]
            position = bisect.bisect_right(starts, offset) - 1
            return self._entries[position][0] if position >= 0 else None

    def end_for(self, epoch: int, log_end: int) -> tuple[int | None, int]:
        """``(e, end)``: ``e`` is the largest epoch <= ``epoch`` this log knows, ``end`` the first
        offset after its records (the next epoch's start, or ``log_end``). ``(None, 0)`` when this
        log knows no epoch that old (the asker must truncate everything)."""
        with self._lock:
            known = [e for e, _ in self._entries if e <= epoch]
            if not known:
                return None, 0
            found = known[-1]
            position = [e for e, _ in self._entries].index(found)
            if position + 1 < len(self._entries):
                return found, self._entries[position + 1][1]
            return found, log_end

    def truncate_from(self, offset: int) -> None:
        """Forget the entries of offsets >= ``offset`` (after the log was cut there)."""
        with self._lock:
            kept = [(e, o) for e, o in self._entries if o < offset]
            if kept != self._entries:
                self._entries = kept
                self._save()

    def reset(self, entries: list[tuple[int, int]]) -> None:
        """Replace every entry (a replica rebuilt from another's copy)."""
        with self._lock:
            self._entries = [(int(e), int(o)) for e, o in entries]
            self._save()

    def _save(self) -> None:
        tmp = self._file.with_name(self._file.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(self._entries, handle)
            handle.flush()
            if self._fsync:
                os.fsync(handle.fileno())
        os.replace(tmp, self._file)


def divergence(mine: LeaderEpochCache, my_end: int, leader_epoch: int | None, leader_end: int) -> int:
    """Where a follower's log must be cut, given the leader's answer ``(leader_epoch, leader_end)``
    to :meth:`LeaderEpochCache.end_for` of the follower's newest epoch: both logs agree up to the
    end of ``leader_epoch`` in each of them (KIP-279)."""
    if leader_epoch is None:
        return 0
    _, my_epoch_end = mine.end_for(leader_epoch, my_end)
    return min(leader_end, my_epoch_end, my_end)
