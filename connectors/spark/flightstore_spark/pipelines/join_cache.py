"""The delta join's lookup caches (FLIP-486's ``cache-enabled``, ``left.cache-size``,
``right.cache-size``), kept in the Python worker between micro-batches and invalidated by the
changelog.

A cache maps a join key to the rows the other side's lookups answer for it: the **right cache**
holds ``right``'s row of a key (or that it has none), the **left cache** every ``left`` row of a
key. Before a task looks anything up, the changes it is about to apply update its caches: a right
change replaces (or, for ``-D``, empties) the key's entry; a left change replaces or removes that
row in the entry of its key when the key is cached (a left entry is only ever filled whole, by a
lookup). An entry is therefore the table's rows at some log position at or after the stream's, and
every later change of the key reaches it, so once both streams are drained every entry equals the
table: the sink equals the batch join with caches on or off.

That argument needs every change of a key to pass through the cache that holds it. Spark sends all
changes of a key to one shard (a hash of the join key), but runs a shard's task in any Python
worker; so each worker has a token, the driver records which worker last applied changes to each
shard (``owners``, from the tasks' results) and hands the map to the next micro-batch: a worker
that was not the last to change a shard drops its entries of that shard first. A new run of the
query (a restart) starts with no owners, hence empty caches.

Caches are bounded per shard (entries = join keys), least recently used first out. Everything is
vectorized (Arrow tables, numpy): a lookup of a micro-batch's keys is a few array operations.
"""

from __future__ import annotations

import os
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore_spark.pipelines._common import distinct_keys, match_rows

__all__ = ["WORKER_CACHES", "CacheRegistry", "CacheSettings", "LookupCache", "ShardCaches"]


def _new_token() -> str:
    """A worker's identity for the driver's owner map (a pid can be reused; the uuid cannot)."""
    return f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


_USED = "__used"


@dataclass(frozen=True)
class CacheSettings:
    """FLIP-486's knobs: ``enabled`` (default on), entries per shard of each side (10,000)."""

    enabled: bool = True
    left_size: int = 10_000
    right_size: int = 10_000

    def __post_init__(self) -> None:
        if self.enabled and (self.left_size <= 0 or self.right_size <= 0):
            raise ValueError("delta join cache sizes must be positive when the cache is enabled "
                             f"(left {self.left_size}, right {self.right_size})")


def _member(probe: pa.Table, build: pa.Table, key: Sequence[str]) -> np.ndarray:
    """For every row of ``probe``, whether ``build`` (unique on ``key``) has its key."""
    if probe.num_rows == 0 or build.num_rows == 0:
        return np.zeros(probe.num_rows, dtype=bool)
    return match_rows(probe.select(list(key)), build.select(list(key)), key).is_valid().to_numpy(
        zero_copy_only=False)


class LookupCache:
    """Entries (join keys) and their rows. ``row_key`` identifies a row within an entry (the left
    table's primary key; for the right table it is the join key itself: one row per entry)."""

    def __init__(self, key: Sequence[str], row_key: Sequence[str], capacity: int) -> None:
        self.key, self.row_key, self.capacity = list(key), list(row_key), capacity
        self.entries: pa.Table | None = None  # key columns + __used (a clock)
        self.rows: pa.Table | None = None
        self._clock = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return 0 if self.entries is None else self.entries.num_rows

    def split(self, keys: pa.Table) -> tuple[pa.Table, pa.Table]:
        """``keys`` (distinct) as (cached, not cached); the cached entries count as used now."""
        if self.entries is None:
            self.misses += keys.num_rows
            return keys.slice(0, 0), keys
        cached = _member(keys, self.entries, self.key)
        hit, missed = keys.filter(pa.array(cached)), keys.filter(pa.array(~cached))
        self._touch(hit)
        self.hits += hit.num_rows
        self.misses += missed.num_rows
        return hit, missed

    def rows_for(self, keys: pa.Table) -> pa.Table | None:
        """The cached rows of the entries of ``keys`` (None: nothing cached yet)."""
        if self.rows is None:
            return None
        return self.rows.filter(pa.array(_member(self.rows, keys, self.key)))

    def fill(self, keys: pa.Table, rows: pa.Table) -> None:
        """Make ``keys`` (distinct) entries holding exactly ``rows`` (the rows of those keys)."""
        if keys.num_rows == 0:
            return
        keys = keys.select(self.key)
        self._drop_entries(keys)
        self._clock += 1
        used = pa.array(np.full(keys.num_rows, self._clock, dtype=np.int64))
        added = keys.append_column(_USED, used)
        self.entries = added if self.entries is None else pa.concat_tables(
            [self.entries, added.cast(self.entries.schema)])
        if rows.num_rows or self.rows is None:
            self.rows = rows if self.rows is None else pa.concat_tables(
                [self.rows, rows.select(self.rows.column_names).cast(self.rows.schema)])
        self._evict()

    def replace_rows(self, rows: pa.Table) -> None:
        """Rows changed by the changelog: each replaces the row with its ``row_key`` in its
        entry, when its key is cached (an uncached key stays uncached)."""
        if self.entries is None or rows.num_rows == 0:
            return
        rows = rows.filter(pa.array(_member(rows, self.entries, self.key)))
        if rows.num_rows == 0:
            return
        self.remove_rows(rows.select(self.row_key))
        self.rows = rows if self.rows is None else pa.concat_tables(
            [self.rows, rows.select(self.rows.column_names).cast(self.rows.schema)])

    def remove_rows(self, row_keys: pa.Table) -> None:
        """Rows deleted by the changelog (``row_key`` columns, distinct) leave their entries."""
        if self.rows is None or self.rows.num_rows == 0 or row_keys.num_rows == 0:
            return
        self.rows = self.rows.filter(pa.array(~_member(self.rows, row_keys, self.row_key)))

    def _touch(self, keys: pa.Table) -> None:
        if keys.num_rows == 0:
            return
        self._clock += 1
        used = self.entries.column(_USED).to_numpy().copy()
        used[_member(self.entries, keys, self.key)] = self._clock
        self.entries = self.entries.set_column(self.entries.schema.get_field_index(_USED), _USED, pa.array(used))

    def _drop_entries(self, keys: pa.Table) -> None:
        if self.entries is None:
            return
        self.entries = self.entries.filter(pa.array(~_member(self.entries, keys, self.key)))
        if self.rows is not None and self.rows.num_rows:
            self.rows = self.rows.filter(pa.array(~_member(self.rows, keys, self.key)))

    def _evict(self) -> None:
        """Keep the ``capacity`` most recently used entries (ties: the newest)."""
        if self.entries is None or self.entries.num_rows <= self.capacity:
            return
        used = self.entries.column(_USED).to_numpy()
        order = np.lexsort((np.arange(len(used)), used))  # oldest first
        gone = self.entries.take(pa.array(order[:len(used) - self.capacity])).select(self.key)
        self._drop_entries(gone)


class ShardCaches:
    """The two caches of one shard of one run of a delta join, in one worker."""

    def __init__(self, key: Sequence[str], left_key: Sequence[str], settings: CacheSettings) -> None:
        self.right = LookupCache(key, key, settings.right_size)
        self.left = LookupCache(key, left_key, settings.left_size)

    def observe(self, left: pa.Table, right: pa.Table, left_columns: Sequence[str],
                right_columns: Sequence[str], upsert_kinds: pa.Array) -> None:
        """Apply one task's folded changes (last change per key, ``_change_type``) to the caches
        before any lookup: right rows (``right_columns``: key and values) replace their key's
        entry (``-D``: an entry with no row), left rows replace or leave the entry of their key."""
        if right.num_rows:
            kinds = right.column("_change_type")
            upserts = right.filter(pc.is_in(kinds, upsert_kinds)).select(list(right_columns))
            deleted = right.filter(pc.equal(kinds, "-D"))
            self.right.fill(distinct_keys(upserts, self.right.key), upserts)
            self.right.fill(distinct_keys(deleted, self.right.key), upserts.slice(0, 0))
        if left.num_rows:
            kinds = left.column("_change_type")
            self.left.remove_rows(left.filter(pc.equal(kinds, "-D")).select(self.left.row_key))
            self.left.replace_rows(left.filter(pc.is_in(kinds, upsert_kinds)).select(list(left_columns)))


class CacheRegistry:
    """A worker's caches of every shard of the delta join runs it served (the last few runs: a
    stopped query's caches go when newer runs need room)."""

    MAX_RUNS = 4

    def __init__(self, token: str | None = None) -> None:
        self._given = token
        self._pid = os.getpid()
        self._token = token or _new_token()
        self._runs: OrderedDict[str, dict[int, ShardCaches]] = OrderedDict()

    @property
    def token(self) -> str:
        """This worker's identity; a process forked from one that had caches starts afresh."""
        if self._given is None and os.getpid() != self._pid:
            self._pid, self._token = os.getpid(), _new_token()
            self._runs.clear()
        return self._token

    def shard(self, run: str, shard: int, owner: str | None, key: Sequence[str], left_key: Sequence[str],
              settings: CacheSettings) -> ShardCaches | None:
        """This worker's caches of ``shard`` of ``run``, emptied unless this worker is ``owner``
        (the last to apply changes to the shard); None when caching is off."""
        if not settings.enabled:
            return None
        token = self.token
        shards = self._runs.setdefault(run, {})
        self._runs.move_to_end(run)
        while len(self._runs) > self.MAX_RUNS:
            self._runs.popitem(last=False)
        caches = shards.get(shard)
        if caches is None or owner != token:
            caches = shards[shard] = ShardCaches(key, left_key, settings)
        return caches


WORKER_CACHES = CacheRegistry()  # this Python worker's (module state outlives a task in a reused worker)
