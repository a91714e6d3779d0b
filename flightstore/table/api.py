"""The one interface of a table, wherever its buckets' replicas live.

Three kinds of table implement it: :class:`~flightstore.store.Table` (a table of one server),
:class:`~flightstore.partitioned.PartitionedTable` (its partitions, each a Table) and
:class:`~flightstore.cluster.table.ClusterTable` (a table of a cluster as one server sees it: each
bucket served by its leader). Every operation listed here either works on each kind or is refused
by name with :class:`~flightstore.errors.Unsupported`: a kind never inherits an operation by
accident, and callers (the server, SQL, the lake) never ask which kind they hold.

Storage internals (``logs``, ``kvs``, ``replicas``, ``tablets()``, ``upkeep``, ``directory``) are
not part of it: only the local kinds have them, and code that needs them (housekeeping, metrics,
tiering, verify) asks the store for the local table (:meth:`Store.local_table`).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from flightstore.expressions import Predicate
from flightstore.schema import TableDescriptor, TablePath

__all__ = ["TableApi"]


class TableApi(abc.ABC):
    """See the module docstring. ``path``, ``descriptor``, ``schema`` and ``table_id`` are
    attributes."""

    path: TablePath
    descriptor: TableDescriptor
    schema: pa.Schema
    #: The id of this incarnation of the table, the same on every server of a cluster (a table
    #: dropped and created again gets a new one): the lake and remote storage name its data by it.
    table_id: str

    #: Whether other servers serve some of the table's buckets (a cluster table): work that
    #: must see every row in one place (a fused aggregate) cannot run here alone.
    distributed: bool = False

    # ---- shape --------------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def num_buckets(self) -> int: ...

    @property
    @abc.abstractmethod
    def has_primary_key(self) -> bool: ...

    @abc.abstractmethod
    def projection(self, columns: Sequence[str]) -> pa.Schema: ...

    @abc.abstractmethod
    def bucket_ids(self, partitions: Sequence[str] | None = None) -> list[int]:
        """The table's buckets as offsets, endpoints and ``scan(buckets=...)`` number them."""

    def leader_uri(self, bucket: int) -> str | None:
        """Where a client reads ``bucket`` directly: its leader's URI in a cluster (UNAVAILABLE
        when it is down); None on a single server (this one)."""
        return None

    # ---- writes -------------------------------------------------------------------------------
    @abc.abstractmethod
    def append(self, data: Any, *, writer_id: str | None = None, sequence: int | None = None) -> Any: ...

    @abc.abstractmethod
    def upsert(self, data: Any, columns: Sequence[str] | None = None, *, writer_id: str | None = None,
               sequence: int | None = None) -> Any: ...

    @abc.abstractmethod
    def delete(self, keys: Any, columns: Sequence[str] | None = None, *, writer_id: str | None = None,
               sequence: int | None = None) -> Any: ...

    @abc.abstractmethod
    def write(self, data: Any, kinds: Any = None, columns: Sequence[str] | None = None, *,
              writer_id: str | None = None, sequence: int | None = None, overwrite: bool = False,
              conformed: bool = False) -> Any: ...

    @abc.abstractmethod
    def writer_sequence(self, writer_id: str) -> int | None:
        """The last batch sequence of ``writer_id`` the table applied (None: unknown writer)."""

    # ---- reads --------------------------------------------------------------------------------
    @abc.abstractmethod
    def lookup(self, keys: Any, columns: Sequence[str] | None = None) -> pa.Table: ...

    @abc.abstractmethod
    def prefix_lookup(self, prefix: Any, columns: Sequence[str] | None = None,
                      limit: int | None = None) -> pa.Table: ...

    @abc.abstractmethod
    def scan(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
             limit: int | None = None, buckets: Sequence[int] | None = None, key_range: Any = None, *,
             exact: bool = True) -> Iterator[pa.RecordBatch]: ...

    @abc.abstractmethod
    def scan_table(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
                   limit: int | None = None, *, exact: bool = True) -> pa.Table: ...

    @abc.abstractmethod
    def row_count(self, partitions: Sequence[str] | None = None) -> int: ...

    @abc.abstractmethod
    def partial_aggregates(self, buckets: Sequence[int], local: Any, remote: Mapping[str, Any]) -> list[pa.Table]:
        """Partial aggregates over ``buckets``, each computed where its rows are: ``local(table,
        buckets)`` over a table held here; ``remote`` is the peer command for the others."""

    # ---- the changelog ------------------------------------------------------------------------
    @abc.abstractmethod
    def start_offsets(self) -> dict[int, int]: ...

    @abc.abstractmethod
    def end_offsets(self) -> dict[int, int]:
        """Per bucket, the offset after the last committed record."""

    @abc.abstractmethod
    def offsets_for_timestamp(self, timestamp_ms: int) -> dict[int, int]: ...

    @abc.abstractmethod
    def resolve_start(self, start: Any) -> dict[int, int]: ...

    @abc.abstractmethod
    def read_changelog(self, bucket: int, from_offset: int | None = None, *,
                       columns: Sequence[str] | None = None, to_offset: int | None = None,
                       max_rows: int | None = None) -> Iterator[pa.RecordBatch]: ...

    @abc.abstractmethod
    def read_snapshot(self, bucket: int, at: int, columns: Sequence[str] | None = None
                      ) -> Iterator[pa.RecordBatch]: ...

    @abc.abstractmethod
    def read_log(self, bucket: int, from_offset: int, columns: Sequence[str], *,
                 filter: Predicate | None = None, limit: int | None = None,
                 exact: bool = True) -> Iterator[pa.RecordBatch]:
        """The committed rows of ``bucket``'s log (table-wide number) from ``from_offset`` on,
        only ``columns``, pruned and filtered by ``filter`` (bound to the table's schema): the log
        part of a union read (:mod:`flightstore.lake.union`). A bucket of a dropped partition has
        none; DataLoss when retention deleted records at or above ``from_offset``."""

    @abc.abstractmethod
    def subscribe(self, start: Any = "earliest", *, columns: Sequence[str] | None = None,
                  stop: Any = None, heartbeat_s: float | None = 1.0,
                  until: Mapping | None = None) -> Iterator[pa.RecordBatch]: ...

    # ---- upkeep -------------------------------------------------------------------------------
    def run_upkeep(self, task: str, **args: Any) -> dict[int | None, Any]:
        """Run upkeep ``task`` (:data:`flightstore.table.upkeep.TASKS`: undo, release, snapshot,
        retention, usage, expire_writers) and answer what each server that did it found, by
        server id: here, ``{None: answer}``; in a cluster, every leader of the table over the
        buckets it leads (:meth:`flightstore.cluster.table.ClusterTable.run_upkeep`).
        :func:`flightstore.table.upkeep.merged` makes the table-wide answer of them."""
        from flightstore.table.upkeep import run_task
        return {None: run_task(self, task, args)}

    @abc.abstractmethod
    def snapshot(self, *, force: bool = False, stop: Any = None) -> dict[int, Any]: ...

    @abc.abstractmethod
    def enforce_retention(self, now_ms: int | None = None) -> int: ...

    @abc.abstractmethod
    def disk_usage(self) -> dict[str, int]: ...

    @abc.abstractmethod
    def undo(self, writer_id: str, after_sequence: int) -> int: ...

    @abc.abstractmethod
    def release(self, writer_id: str) -> None:
        """End ``writer_id``'s claim on the columns its partial updates wrote."""

    @abc.abstractmethod
    def expire_writers(self, now_ms: int | None = None) -> list[str]: ...

    @abc.abstractmethod
    def rows_at(self, bucket: int, at: int, columns: Sequence[str] | None = None,
                limit: int | None = None) -> Iterator[pa.RecordBatch]: ...

    @abc.abstractmethod
    def partition_stats(self) -> list[tuple[Any, int]]:
        """Every partition with its row count (an unpartitioned table has none)."""
