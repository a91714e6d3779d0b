"""Tiering as a Spark job: the server's tiering core, run by Spark against a flightstore server.

For deployments that keep compute on Spark (and run the server with
``datalake.tiering.enabled=false``). Each round of each table is the same crash-safe
:func:`flightstore.lake.tiering.tier_round` the server runs, distributed over Spark executors, one
task per bucket with a backlog, each with its own Flight connection:

* log tables: each task reads its bucket's backlog and writes the bucket's Iceberg data files
  straight to the warehouse, returning only their metadata (``DataFile``); the driver commits
  every task's files in ONE snapshot recording every bucket's offset. Files of a task whose round
  never commits (a failed or killed job, a retried task) are orphans no snapshot references; a
  re-run starts from the committed offsets and commits no duplicate;
* primary-key tables: each task reads its bucket's changelog; the driver folds it and rewrites the
  changed buckets' files (the fold needs every change of a key together), then commits likewise.

The job takes each table's tiering
lease first: a table the server (or another job) is tiering is refused with a clear error and the
job exits non-zero. Rounds repeat until the backlog seen at the start is in the lake.

    python -m flightstore_spark.pipelines.tiering --uri grpc://127.0.0.1:8815 \\
        --data-dir /srv/flightstore [--tables db.orders,db.users] [--lake-option KEY=VALUE ...]

The lake is found like the server finds it: ``--data-dir`` gives the embedded default
(``DATA_DIR/lake/catalog.db`` and ``DATA_DIR/lake/warehouse``), ``--lake-option`` any
``datalake.*`` server option (``datalake.iceberg.uri``, ``datalake.iceberg.warehouse``, S3 keys...).
"""

from __future__ import annotations

import argparse
import functools
import socket
import sys
from collections.abc import Callable, Sequence

from pyspark.accumulators import AccumulatorParam

__all__ = ["SparkBucketWriter", "main", "spark_bucket_reader", "tier_tables"]


def _read_on_executor(uri: str, name: str, descriptor_json: str, read: tuple) -> tuple[int, bytes, int]:
    import flightstore
    from flightstore.lake.remote import read_bucket_changes
    from flightstore.schema import TableDescriptor

    with flightstore.connect(uri) as connection:
        return read_bucket_changes(connection, name, TableDescriptor.from_json(descriptor_json), read)


def spark_bucket_reader(spark, uri: str, name: str, descriptor_json: str) -> Callable:
    """A ``map_buckets`` for :class:`~flightstore.lake.remote.FlightSource`: one Spark task per
    bucket read, each with its own Flight connection; results come back to the driver."""

    def map_buckets(reads: Sequence[tuple]) -> list[tuple[int, bytes, int]]:
        if not reads:
            return []
        rdd = spark.sparkContext.parallelize(list(reads), len(reads))
        return rdd.map(lambda read: _read_on_executor(uri, name, descriptor_json, read)).collect()

    return map_buckets


def _write_on_executor(uri: str, name: str, descriptor_json: str, target, read: tuple) -> tuple:
    import flightstore
    from flightstore.lake.remote import write_bucket_files
    from flightstore.schema import TableDescriptor

    with flightstore.connect(uri) as connection:
        return write_bucket_files(connection, name, TableDescriptor.from_json(descriptor_json), read, target)


class _ListAccumulator(AccumulatorParam):
    """Accumulates lists."""

    def zero(self, value: list) -> list:
        return []

    def addInPlace(self, left: list, right: list) -> list:  # noqa: N802 - Spark's name
        left.extend(right)
        return left


class SparkBucketWriter:
    """A ``map_writes`` for :class:`~flightstore.lake.remote.FlightSource`: one Spark task per
    bucket read, which writes that bucket's data files to the warehouse itself.

    ``written`` is a Spark accumulator every task adds ``(task partition id, file path)`` of each
    file it wrote to: what ran where, as Spark saw it."""

    def __init__(self, spark, uri: str, name: str, descriptor_json: str) -> None:
        self._spark, self._uri, self._name, self._descriptor = spark, uri, name, descriptor_json
        self.written = spark.sparkContext.accumulator([], _ListAccumulator())

    def __call__(self, reads: Sequence[tuple], target) -> list[tuple]:
        if not reads:
            return []
        uri, name, descriptor, written = self._uri, self._name, self._descriptor, self.written

        def task(read: tuple) -> tuple:
            from pyspark import TaskContext

            answer = _write_on_executor(uri, name, descriptor, target, read)
            written.add([(TaskContext.get().partitionId(), f.file_path) for f in answer[1]])
            return answer

        rdd = self._spark.sparkContext.parallelize(list(reads), len(reads))
        return rdd.map(task).collect()


def _enabled_tables(connection) -> list[str]:
    from flightstore.schema import TableDescriptor

    names = []
    for database in connection.sql("SHOW DATABASES").column(0).to_pylist():
        for table in connection.sql(f"SHOW TABLES IN {database}").column(0).to_pylist():
            described = connection.table(f"{database}.{table}").describe()
            if TableDescriptor.from_json(described["descriptor"]).option("table.datalake.enabled"):
                names.append(f"{database}.{table}")
    return names


def tier_tables(spark, uri: str, settings, tables: Sequence[str] | None = None, *,
                holder: str | None = None, hook: Callable[[str], None] | None = None,
                writer: Callable[..., SparkBucketWriter] = SparkBucketWriter, steps=None) -> dict:
    """Tier ``tables`` (default: every datalake-enabled table) until each is caught up with the
    log end it saw. Returns ``{table: [RoundResult, ...] or the error (a FlightstoreError)}``.
    ``writer(spark, uri, name, descriptor_json)`` makes the log tables' ``map_writes``; ``steps``
    (:class:`flightstore.progress.Steps`) hears of each table and round."""
    import flightstore
    from flightstore.errors import FlightstoreError, InvalidInput, TieringLeaseHeld
    from flightstore.lake.catalog import LakeCatalog
    from flightstore.lake.lease import LeaseStore
    from flightstore.lake.remote import FlightSource
    from flightstore.lake.tiering import tier_round
    from flightstore.progress import QUIET

    steps = steps or QUIET

    holder = holder or f"spark-job:{socket.gethostname()}:{spark.sparkContext.applicationId}"
    catalog = LakeCatalog(settings)
    outcome: dict = {}
    with flightstore.connect(uri) as connection:
        names = list(tables) if tables else _enabled_tables(connection)
        steps.start(len(names))
        for name in names:
            steps.advance(0, f"tier {name}")
            leases = None
            try:
                source = FlightSource(connection, name)
                if not source.descriptor.option("table.datalake.enabled"):
                    raise InvalidInput(f"table {name} is not datalake-enabled ('table.datalake.enabled')")
                leases = LeaseStore(catalog.catalog.engine)
                leases.acquire(name, holder, settings.lease_ms)
                rounds = []
                while True:
                    descriptor_json = source.descriptor.to_json()
                    source = FlightSource(connection, name,
                                          map_buckets=spark_bucket_reader(spark, uri, name, descriptor_json),
                                          map_writes=writer(spark, uri, name, descriptor_json))
                    lake_table = catalog.ensure_table(source.descriptor, source.table_id)
                    result = tier_round(source, lake_table, max_rows=settings.max_round_rows, hook=hook,
                                        before_commit=functools.partial(leases.acquire, name, holder,
                                                                        settings.lease_ms))
                    rounds.append(result)
                    steps.advance(0, f"tier {name}: {sum(r.rows for r in rounds):,} rows in {len(rounds)} round(s)")
                    if not result.backlog_left:
                        break
                outcome[name] = rounds
                leases.release(name, holder)
            except FlightstoreError as exc:
                outcome[name] = exc
                if leases is not None and not isinstance(exc, TieringLeaseHeld):
                    leases.release(name, holder)
            steps.advance()
    catalog.reset()
    return outcome


def main(argv: Sequence[str] | None = None) -> int:
    from flightstore.lake.settings import LakeSettings
    from flightstore.progress import progress
    from flightstore_spark.pipelines._common import local_spark

    parser = argparse.ArgumentParser(prog="python -m flightstore_spark.pipelines.tiering",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--tables", help="comma-separated tables (default: every datalake-enabled table)")
    parser.add_argument("--data-dir", default=".", help="the server's data directory (embedded lake default)")
    parser.add_argument("--lake-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a datalake.* server option (repeatable)")
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)
    options = dict(item.split("=", 1) for item in args.lake_option)
    settings = LakeSettings.from_options(args.data_dir, options)
    spark = local_spark(args.master, "flightstore-tiering")
    try:
        with progress("tiering", unit="tables") as steps:  # on a terminal only
            outcome = tier_tables(spark, args.uri, settings, args.tables.split(",") if args.tables else None,
                                  steps=steps)
    finally:
        spark.stop()
    failed = 0
    for name, result in outcome.items():
        if isinstance(result, Exception):
            failed += 1
            print(f"{name}: not tiered: {type(result).__name__}: {result}", file=sys.stderr)
        else:
            print(f"{name}: {sum(r.rows for r in result)} rows in {sum(r.committed for r in result)} commit(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
