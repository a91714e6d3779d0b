"""One typed registry of every option flightstore reads, server-wide and per table.

Each :class:`ConfigOption` carries its key, type, default and documentation; the CLI help and the
option table of ``docs/options.md`` are generated from this registry (``python -m flightstore options``). Table
options use the names Apache Fluss users know. Validation is strict: an unknown key or a value that
does not parse is refused with a message naming the option.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from flightstore.errors import InvalidOption

__all__ = [
    "ConfigOption",
    "TABLE_OPTIONS",
    "SERVER_OPTIONS",
    "SESSION_OPTIONS",
    "CLIENT_OPTIONS",
    "FIELD_OPTION_PATTERN",
    "ICEBERG_TABLE_PREFIX",
    "ICEBERG_CATALOG_PREFIX",
    "validate_server_options",
    "validate_client_options",
    "parse_duration_ms",
    "parse_size_bytes",
    "validate_table_options",
    "table_option",
    "server_option",
    "validate_client_options",
    "options_markdown",
]


def parse_duration_ms(text: str) -> int:
    """Parse a Fluss-style duration (``7d``, ``2 h``, ``30min``, ``500ms``, ``10s``) to milliseconds."""
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|sec|min|m|h|d|)\s*", str(text).lower())
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 7d, 12h, 30min, 10s, 500ms)")
    value, unit = int(match.group(1)), match.group(2)
    scale = {"ms": 1, "": 1, "s": 1000, "sec": 1000, "min": 60_000, "m": 60_000,
             "h": 3_600_000, "d": 86_400_000}[unit]
    return value * scale


_SIZE_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
               "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_size_bytes(text: str) -> int:
    """Parse a size (``512MB``, ``1GiB``, ``1000000``) to bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b|)\s*", str(text).lower())
    if not match:
        raise ValueError(f"not a size: {text!r} (use e.g. 512MB, 2GB, 1GiB)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def _parse_bool(text: str) -> bool:
    lowered = str(text).strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _parse_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in str(text).split(",") if part.strip())


def _parse_float(text: Any) -> float:
    value = float(str(text).strip())
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


_PARSERS: dict[str, Callable[[str], Any]] = {
    "int": lambda text: int(str(text).strip()),
    "float": _parse_float,
    "bool": _parse_bool,
    "str": str,
    "duration": parse_duration_ms,
    "size": parse_size_bytes,
    "list": _parse_list,
}


@dataclass(frozen=True)
class ConfigOption:
    """One option: ``key``, value ``type`` (int, float, bool, str, duration, size, list), default and doc."""

    key: str
    type: str
    default: Any
    doc: str
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    live: bool = False  # a table option ALTER TABLE ... SET / RESET may change on a live table

    def parse(self, raw: Any) -> Any:
        """Return the typed value of ``raw``; raise :class:`InvalidOption` naming this option."""
        try:
            value = _PARSERS[self.type](raw)
        except (ValueError, TypeError) as exc:
            raise InvalidOption(f"option '{self.key}': {exc}") from None
        if self.choices is not None:
            normalized = str(value).strip()
            matches = [c for c in self.choices if c.lower() == normalized.lower()]
            if not matches:
                raise InvalidOption(
                    f"option '{self.key}': {raw!r} is not one of {', '.join(self.choices)}")
            value = matches[0]
        if self.minimum is not None and value < self.minimum:
            raise InvalidOption(f"option '{self.key}': {value} is below the minimum {self.minimum}")
        return value


def _registry(*options: ConfigOption) -> dict[str, ConfigOption]:
    return {option.key: option for option in options}


TABLE_OPTIONS: dict[str, ConfigOption] = _registry(
    ConfigOption("bucket.num", "int", 1, "Number of buckets of the table.", minimum=1),
    ConfigOption("bucket.key", "list", (),
                 "Columns hashed to choose the bucket; default: the primary key (minus partition "
                 "keys) for primary-key tables, round-robin by batch for log tables."),
    ConfigOption("table.merge-engine", "str", None,
                 "How a primary-key table merges rows with the same key; unset means the last row "
                 "wins.", choices=("first_row", "versioned", "aggregation")),
    ConfigOption("table.merge-engine.versioned.ver-column", "str", None,
                 "Version column of the `versioned` merge engine: a row replaces the stored one when "
                 "its version is greater or equal; rows with a null version are ignored."),
    ConfigOption("table.delete.behavior", "str", "allow",
                 "What deletes do: `allow` them, `ignore` them silently or `disable` (refuse).",
                 choices=("allow", "ignore", "disable")),
    ConfigOption("table.changelog.image", "str", "FULL",
                 "`FULL` writes -U before-images into the changelog, `WAL` only the +U after-images.",
                 choices=("FULL", "WAL")),
    ConfigOption("table.log.ttl", "duration", 7 * 86_400_000,
                 "Log segments whose newest batch is older than this are deleted; on a primary-key "
                 "table only segments below its oldest retained KV snapshot.", live=True),
    ConfigOption("table.log.arrow.compression.type", "str", "NONE",
                 "Compression of the Arrow IPC log batches.", choices=("NONE", "LZ4_FRAME", "ZSTD")),
    ConfigOption("table.log.segment.bytes", "int", 256 * 1024 * 1024,
                 "A log segment rolls to a new file past this size.", minimum=1024),
    ConfigOption("table.writer-id.expiration", "duration", 7 * 86_400_000,
                 "A writer id that has not written for this long is forgotten (its last batch "
                 "sequence, in memory, in the log's writer state and in the KV); a later batch of "
                 "it with a sequence above 0 is refused, as the retry check no longer holds.",
                 minimum=1),
    ConfigOption("kv.snapshot.interval", "duration", 10 * 60_000,
                 "How often the server takes a KV snapshot of each bucket of a primary-key table that "
                 "changed since its last one (a RocksDB checkpoint plus a columnar image of the rows, at "
                 "one log offset). The log below the oldest retained snapshot may then be deleted by "
                 "`table.log.ttl`.", minimum=1),
    ConfigOption("table.replication.factor", "int", None,
                 "How many servers hold a copy of each bucket (cluster mode): one leader and "
                 "followers that fetch its log; default the server option "
                 "`default.replication.factor`. At most the number of live servers.", minimum=1),
    ConfigOption("kv.snapshot.num-retained", "int", 2,
                 "KV snapshots kept per bucket; older ones are deleted once a newer one is complete.",
                 minimum=1),
    ConfigOption("table.log.tiered.local-segments", "int", 2,
                 "With remote storage (server option `remote.data.dir`): how many closed log segments "
                 "of each bucket stay on local disk once they are uploaded; older uploaded ones are "
                 "deleted locally and read from remote storage. A segment is never deleted locally "
                 "before it is uploaded. Without `remote.data.dir` every segment stays local.",
                 minimum=1, live=True),
    ConfigOption("table.statistics.columns", "list", ("*",),
                 "Columns with per-batch min/max/null-count statistics used to skip batches in "
                 "filtered reads; `*` means every column of a statistics-capable type."),
    ConfigOption("table.datalake.enabled", "bool", False,
                 "Tier the table's data into the lake (Apache Iceberg); its log keeps every record "
                 "until it is tiered, whatever `table.log.ttl` says."),
    ConfigOption("table.datalake.freshness", "duration", 180_000,
                 "Target lag of the lake behind the log: the server tiers the table this often.",
                 minimum=100, live=True),
    ConfigOption("table.datalake.delete-compaction-ratio", "float", 0.2,
                 "Primary-key tables tier changes merge-on-read: a round deletes the changed keys' old "
                 "rows with one Iceberg position delete file per changed bucket and appends the new "
                 "rows. Once a bucket's deleted rows would exceed this fraction of its live rows, the "
                 "round rewrites that bucket copy-on-write instead (dropping its delete files); `0` "
                 "always rewrites.", minimum=0, live=True),
    ConfigOption("table.datalake.snapshot.retention", "duration", 7 * 86_400_000,
                 "Lake snapshots older than this are expired by the server's lake upkeep (Iceberg's "
                 "`history.expire.max-snapshot-age-ms`), with the data, delete and manifest files "
                 "only they referenced; time travel reaches back this far. The newest "
                 "`table.datalake.snapshot.num-retained` snapshots and the newest tiering snapshot "
                 "always stay.", minimum=0, live=True),
    ConfigOption("table.datalake.snapshot.num-retained", "int", 1,
                 "Lake snapshots kept whatever their age (Iceberg's "
                 "`history.expire.min-snapshots-to-keep`).", minimum=1, live=True),
    ConfigOption("table.datalake.orphan-files.older-than", "duration", 3_600_000,
                 "Files under the lake table's location that no live snapshot references (e.g. "
                 "written by a tiering round that died before its commit) are deleted by the lake "
                 "upkeep once they are older than this (a grace period for rounds writing right "
                 "now).", minimum=60_000, live=True),
    ConfigOption("table.auto-partition.enabled", "bool", False,
                 "The server creates the table's time partitions ahead and drops expired ones "
                 "(checked every `auto-partition.check.interval` and at start-up)."),
    ConfigOption("table.auto-partition.key", "str", None,
                 "The STRING partition key holding the time, when the table has several partition "
                 "keys (with several, partitions are only dropped, never created ahead)."),
    ConfigOption("table.auto-partition.time-unit", "str", "DAY",
                 "Time unit of an auto partition, with Fluss's value formats: HOUR `yyyyMMddHH`, "
                 "DAY `yyyyMMdd`, MONTH `yyyyMM`, QUARTER `yyyyQ`, YEAR `yyyy`.",
                 choices=("HOUR", "DAY", "MONTH", "QUARTER", "YEAR")),
    ConfigOption("table.auto-partition.num-precreate", "int", 2,
                 "Partitions created ahead at each check, the current one included.", minimum=0,
                 live=True),
    ConfigOption("table.auto-partition.num-retention", "int", 7,
                 "Partitions kept before the current one; older ones are dropped at each check.",
                 minimum=0, live=True),
    ConfigOption("table.auto-partition.time-zone", "str", None,
                 "IANA time zone of the partition times (e.g. `UTC`); default: the server's."),
)

# Per-field options of the aggregation merge engine: fields.<field>.agg and
# fields.<field>.<function>.<param>.
FIELD_OPTION_PATTERN = re.compile(r"^fields\.([^.]+)\.(agg|[a-z_0-9]+\.[a-z_0-9-]+)$")

# Table options ``iceberg.<property>`` become Iceberg table property ``<property>`` of the lake table;
# server options ``datalake.iceberg.<property>`` become property ``<property>`` of the Iceberg catalog.
ICEBERG_TABLE_PREFIX = "iceberg."
ICEBERG_CATALOG_PREFIX = "datalake.iceberg."

SERVER_OPTIONS: dict[str, ConfigOption] = _registry(
    ConfigOption("data-dir", "str", "./data", "Directory holding the catalog, logs and KV stores."),
    ConfigOption("host", "str", "127.0.0.1", "Address the Flight SQL server listens on."),
    ConfigOption("port", "int", 8815, "Port the Flight SQL server listens on.", minimum=0),
    ConfigOption("log.fsync", "bool", True,
                 "A write is acknowledged once its changelog is fsynced (it survives a power loss, "
                 "not only a crash of the process); concurrent writers share one fsync (group "
                 "commit). Off (`--no-fsync`): a write is in the OS when acknowledged; a crash of "
                 "the process loses nothing, a power loss may lose the last seconds of writes."),
    ConfigOption("log.retention.check-interval", "duration", 60_000,
                 "How often the server deletes log segments past their table's `table.log.ttl`."),
    ConfigOption("server.max-batch-rows", "int", 65_536,
                 "Most rows of one Flight message of a result (queries, lookups, scans, "
                 "subscriptions, metadata): larger batches are cut (zero-copy); a message also "
                 "stays below 2 MiB whatever this says.", minimum=1),
    ConfigOption("query.memory-limit", "size", 1_000_000_000,
                 "Memory the embedded SQL engine (DuckDB) may use for residual SQL (GROUP BY, joins, "
                 "ORDER BY...) across all queries; beyond it, operators spill to `DATA_DIR/.spill` and "
                 "a query that still does not fit fails with RESOURCE_EXHAUSTED. Every other read path "
                 "sizes its batches by it (a 16th of it, 1 to 16 MiB each) and holds at most a quarter "
                 "of it at once (a lookup's answer, a changelog tail being folded), else answers "
                 "RESOURCE_EXHAUSTED.", minimum=1_000_000),
    ConfigOption("query.materialize-input-limit", "size", 256_000_000,
                 "A table input of residual SQL whose estimated size (its maintained row count times "
                 "the read columns' widths) is at most this (and at most a quarter of "
                 "`query.memory-limit`) is read whole before the embedded engine runs, so DuckDB "
                 "scans it in parallel and pushes filters into it (joins with small dimension "
                 "tables); bigger inputs are streamed batch by batch in bounded memory (`0`: always "
                 "stream).", minimum=0),
    ConfigOption("query.spill-limit", "size", 10_000_000_000,
                 "Disk the embedded SQL engine may spill to under `DATA_DIR/.spill`; a query that "
                 "needs more fails with RESOURCE_EXHAUSTED.", minimum=0),
    ConfigOption("query.timeout", "duration", 600_000,
                 "A query running longer than this is stopped and answers DEADLINE_EXCEEDED (`0`: "
                 "no limit). A client that cancels (CancelFlightInfo), disconnects or passes its own "
                 "gRPC deadline stops its query too.", minimum=0),
    ConfigOption("query.max-result-rows", "int", 1_000_000_000,
                 "Most rows one residual-SQL query may return; past it the stream ends with "
                 "RESOURCE_EXHAUSTED (`0`: no cap).", minimum=0),
    ConfigOption("server.workers", "int", 1,
                 "Server processes on this machine (`serve --workers N`): worker 0 serves the port given "
                 "and starts the others, each leading buckets `b % N` in `DATA_DIR/worker-<k>`; clients "
                 "find them as in cluster mode. Fixed at a data directory's first start.", minimum=1),
    ConfigOption("server.shutdown-grace", "duration", 10_000,
                 "On SIGTERM/SIGINT the server stops accepting calls and waits this long for running "
                 "ones, then stops them (UNAVAILABLE: server shutting down) and exits.", minimum=0),
    ConfigOption("sql.cache.entries", "int", 1024,
                 "Entries each SQL cache keeps (query plans, point-lookup templates, residual result "
                 "schemas, prepared statements' schemas), least recently used forgotten first. "
                 "Literal point lookups of a known shape are not cached per literal.", minimum=1),
    ConfigOption("write.chunk-rows", "int", 262_144,
                 "A DoPut upload (bulk ingest, parameter rows, client writes) is read message by "
                 "message and applied in chunks of about this many rows: the server holds one chunk, "
                 "not the upload, and readers go on between chunks. A message is never split.",
                 minimum=1),
    ConfigOption("write.chunk-bytes", "int", 16 * 1024 * 1024,
                 "A DoPut chunk is also closed once its messages hold this many bytes.", minimum=1),
    ConfigOption("write.max-message-bytes", "int", 16 * 1024 * 1024,
                 "Largest Flight message (decoded record batch) a DoPut may send; a larger one is "
                 "refused with INVALID_ARGUMENT before any of it is written.", minimum=1),
    ConfigOption("zookeeper.address", "str", None,
                 "ZooKeeper `HOST:PORT[,HOST:PORT...][/chroot]` of the cluster this server joins; "
                 "unset runs one server alone, with no coordination."),
    ConfigOption("server.id", "int", None,
                 "This server's id in its cluster: unique among live servers and kept across "
                 "restarts (its buckets follow the id).", minimum=0),
    ConfigOption("advertised-uri", "str", None,
                 "The URI other servers and clients reach this server at; default "
                 "`grpc://HOST:PORT` of the listening address."),
    ConfigOption("zookeeper.session-timeout", "duration", 10_000,
                 "How long ZooKeeper keeps a silent server registered: a killed server's buckets are "
                 "reported unavailable, and a killed coordinator replaced, after about this long.",
                 minimum=1000),
    ConfigOption("default.replication.factor", "int", 1,
                 "Replication factor of a new table that sets no `table.replication.factor` "
                 "(cluster mode; the coordinator's value counts).", minimum=1),
    ConfigOption("log.replica.min-in-sync-replicas-number", "int", 1,
                 "A write to a replicated bucket is refused (UNAVAILABLE, nothing acknowledged) while "
                 "fewer replicas than this are in sync; with replication factor 3 set it to 2 so "
                 "that every acknowledged write is on two servers.", minimum=1),
    ConfigOption("log.replica.max-lag-time", "duration", 30_000,
                 "A follower that has not fetched, or not caught up with its leader's log end, for "
                 "this long leaves the in-sync replica set; it rejoins once caught up.", minimum=100),
    ConfigOption("log.replica.write-timeout", "duration", 30_000,
                 "How long a leader waits for its in-sync replicas to confirm a write before "
                 "answering UNAVAILABLE (not acknowledged; a retry with the same writer id and "
                 "sequence is applied once).", minimum=100),
    ConfigOption("log.replica.fetch-backoff-interval", "duration", 1_000,
                 "How long a follower waits before fetching again after a fetch failed; a replica that "
                 "cannot append what its leader sent waits this long, doubled at each failure in a row "
                 "(up to 8 s), before truncating again.", minimum=10),
    ConfigOption("log.fetch.max-bytes", "size", 16 * 1024 * 1024,
                 "At most about this many bytes of records per replication fetch answer (at least "
                 "one record).", minimum=1024),
    ConfigOption("unclean.leader.election.enable", "bool", False,
                 "Elect a leader that is not in the in-sync replica set when none of them is alive "
                 "(writes acknowledged by the lost replicas may be lost; off by default)."),
    ConfigOption("cluster.replica.dead-timeout", "duration", 300_000,
                 "A server down for longer than this has its replicas recreated on live servers "
                 "(copied from the leader) so every bucket gets back to its replication factor.",
                 minimum=1000),
    ConfigOption("cluster.ddl-timeout", "duration", 30_000,
                 "How long a server waits for the coordinator to answer a DDL statement before "
                 "answering UNAVAILABLE (having changed nothing).", minimum=100),
    ConfigOption("datalake.format", "str", "iceberg",
                 "Table format of the lake that datalake-enabled tables are tiered into.",
                 choices=("iceberg",)),
    ConfigOption("datalake.iceberg.uri", "str", None,
                 "SQLAlchemy URI of the Iceberg SQL catalog (sqlite, PostgreSQL...); default "
                 "`sqlite:///DATA_DIR/lake/catalog.db`, which needs no other process. Cluster mode: "
                 "required with any `datalake.*` option, the same on every server."),
    ConfigOption("datalake.iceberg.warehouse", "str", None,
                 "Where the lake's data and metadata files go: a local path or `file://` URI, or "
                 "`s3://bucket/prefix` on S3-compatible storage; default `DATA_DIR/lake/warehouse`. "
                 "Cluster mode: required with any `datalake.*` option, the same on every server."),
    ConfigOption("datalake.iceberg.s3.endpoint", "str", None,
                 "Endpoint URI of the S3-compatible object storage (MinIO, Ceph...); unset: AWS."),
    ConfigOption("datalake.iceberg.s3.access-key-id", "str", None,
                 "Access key of the object storage; unset: the AWS_ACCESS_KEY_ID environment."),
    ConfigOption("datalake.iceberg.s3.secret-access-key", "str", None,
                 "Secret key of the object storage; unset: the AWS_SECRET_ACCESS_KEY environment."),
    ConfigOption("datalake.iceberg.s3.region", "str", None, "Region of the object storage bucket."),
    ConfigOption("datalake.tiering.enabled", "bool", True,
                 "The server tiers datalake-enabled tables itself (cluster mode: while it holds the "
                 "cluster's tiering lease in ZooKeeper); `false` leaves them to an "
                 "external tiering job (the server then follows its commits: log retention, status)."),
    ConfigOption("datalake.tiering.lease", "duration", 60_000,
                 "How long a tierer's lease on a table lasts without renewal: a crashed tierer's "
                 "table is free for another after this long.", minimum=1000),
    ConfigOption("datalake.tiering.retry-backoff.max", "duration", 60_000,
                 "Longest wait between tiering retries while the lake is unavailable (the wait "
                 "doubles from 1 s up to this).", minimum=10),
    ConfigOption("datalake.tiering.max-round-rows", "int", 8_000_000,
                 "Most rows one tiering round reads into memory and commits; a longer backlog takes "
                 "several rounds.", minimum=1),
    ConfigOption("datalake.maintenance.interval", "duration", 3_600_000,
                 "How often the server's tierer runs the lake upkeep of a table (after a successful "
                 "round): expiring old lake snapshots and deleting unreferenced and orphan files "
                 "(`table.datalake.snapshot.*`, `table.datalake.orphan-files.older-than`); `0` "
                 "after every round.", minimum=0),
    ConfigOption("datalake.read-cache.size", "size", 4 * 1024**3,
                 "Disk the server may use under `DATA_DIR/lake/read-cache` for lake data files it "
                 "read, kept decoded (uncompressed Arrow IPC, memory-mapped) so union reads of tiered "
                 "rows cost what log reads cost; least recently used files go first, `0` disables "
                 "it. About 1.5x to 3x the lake's compressed Parquet bytes hold all of it.",
                 minimum=0),
    ConfigOption("remote.data.dir", "str", None,
                 "Remote storage of closed log segments and KV snapshots: a local path or `file://` "
                 "URI, or `s3://bucket/prefix` (see `remote.s3.*`). Set, the server uploads each "
                 "bucket's closed log segments (`table.log.tiered.local-segments` then bounds the "
                 "local ones) and completed KV snapshots, reads older offsets from there, and "
                 "rebuilds a lost bucket directory from it. Unset: everything stays local."),
    ConfigOption("remote.log.task-interval-duration", "duration", 60_000,
                 "How often the server uploads closed log segments and KV snapshots to remote "
                 "storage and deletes uploaded local segments (Fluss's remote log task); `0` "
                 "uploads nothing (remote data already there is still read).", minimum=0),
    ConfigOption("remote.log.cache-size", "size", 1024**3,
                 "Disk the server may use under `DATA_DIR/remote-cache` for remote log segments "
                 "downloaded to serve reads of old offsets (verified against their checksums); "
                 "least recently used segments go first (a segment being read stays).", minimum=0),
    ConfigOption("remote.s3.endpoint", "str", None,
                 "Endpoint URI of the S3-compatible object storage of an `s3://` `remote.data.dir` "
                 "(MinIO, Ceph...); unset: AWS."),
    ConfigOption("remote.s3.access-key-id", "str", None,
                 "Access key of the remote storage; unset: the AWS_ACCESS_KEY_ID environment."),
    ConfigOption("remote.s3.secret-access-key", "str", None,
                 "Secret key of the remote storage; unset: the AWS_SECRET_ACCESS_KEY environment."),
    ConfigOption("remote.s3.region", "str", None, "Region of the remote storage's S3 bucket."),
    ConfigOption("max.partition.num", "int", 1000,
                 "Most partitions one partitioned table may hold; creating more is refused, "
                 "nothing written.", minimum=1),
    ConfigOption("max.bucket.num", "int", 128_000,
                 "Most buckets one table may hold (`bucket.num` times its partitions).", minimum=1),
    ConfigOption("max.table-bucket.num", "int", 1024,
                 "Most buckets (`bucket.num`) CREATE TABLE may give a table (each partition of a "
                 "partitioned one); more is refused at once. Each bucket of a primary-key table is "
                 "a RocksDB instance opened with the table: about 7 MB of memory and 70 ms to "
                 "create each.", minimum=1),
    ConfigOption("client.writer.dynamic-create-partition.enabled", "bool", True,
                 "A write to a partition that does not exist creates it (within `max.partition.num` "
                 "and `max.bucket.num`); `false` refuses such writes."),
    ConfigOption("auto-partition.check.interval", "duration", 600_000,
                 "How often the server creates auto partitions ahead and drops expired ones.",
                 minimum=10),
    ConfigOption("tls.cert", "str", None,
                 "PEM certificate chain of the server; with `tls.key` the server speaks "
                 "`grpc+tls://` only."),
    ConfigOption("tls.key", "str", None, "PEM private key of `tls.cert`."),
    ConfigOption("tls.client-ca", "str", None,
                 "PEM CA certificates for mutual TLS: a client must present a certificate signed by "
                 "one of them, or its connection is refused."),
    ConfigOption("tls.root", "str", None,
                 "PEM CA certificates the servers of a cluster verify each other's certificates "
                 "against when they call each other over TLS (each presents its own `tls.cert`, which "
                 "a server with `tls.client-ca` checks as mutual TLS); default `tls.client-ca`, else "
                 "the system's roots."),
    ConfigOption("cluster.secret-file", "str", None,
                 "A file of at least 32 random bytes, the same on every server of a cluster: the "
                 "secret that signs bearer tokens and peer credentials is derived from it and never "
                 "stored (ZooKeeper keeps a verifier only). Needed once the cluster has users; "
                 "without it the cluster keeps a random secret in ZooKeeper and refuses users."),
    ConfigOption("auth.users-file", "str", None,
                 "Users file of salted password hashes (`flightstore user add`); set, every call must "
                 "authenticate (HTTP Basic, then a bearer token) and is authorized by grants. Unset, "
                 "the server is open and every caller is a super user."),
    ConfigOption("auth.token-ttl", "duration", 3_600_000,
                 "A bearer token expires this long after it was minted; the client authenticates "
                 "again (flightstore's Python client does so by itself).", minimum=1000),
    ConfigOption("auth.max-tokens", "int", 10_000,
                 "Most bearer tokens held at once; minting one more forgets the oldest.", minimum=1),
    ConfigOption("auth.max-concurrent-checks", "int", 2,
                 "Most password checks run at once (each is an Argon2id computation: about 64 MiB "
                 "and tens of milliseconds of CPU with the users file's profile), on threads of "
                 "their own at a lower CPU priority.", minimum=1),
    ConfigOption("auth.max-waiting-checks", "int", 16,
                 "Password checks that may wait for a free slot; more are refused at once "
                 "(UNAVAILABLE).", minimum=0),
    ConfigOption("auth.check-wait", "duration", 10_000,
                 "How long a password check waits for a free slot before it is refused "
                 "(UNAVAILABLE).", minimum=0),
    ConfigOption("auth.failed-logins.burst", "int", 5,
                 "Consecutive failed logins of one user name before further attempts wait: each "
                 "further failure doubles the wait (from 0.5 s); attempts within it are refused "
                 "(UNAVAILABLE) without a check. A successful login clears it.", minimum=1),
    ConfigOption("auth.failed-logins.max-delay", "duration", 30_000,
                 "Longest wait between login attempts of a user name that keeps failing.", minimum=0),
    ConfigOption("authorizer.super-users", "list", (),
                 "Users allowed every operation on every resource, grants or not (they run the "
                 "first GRANTs)."),
    ConfigOption("metrics.port", "int", None,
                 "Port of the Prometheus metrics endpoint (`http://HOST:PORT/metrics`); unset, no "
                 "endpoint.", minimum=0),
    ConfigOption("metrics.auth", "str", "auto",
                 "Who may scrape the metrics endpoint: `basic` asks HTTP Basic credentials of the "
                 "users file and admits users allowed DESCRIBE on the cluster (super users "
                 "included); `none` admits anyone; `auto` is `basic` when the server has a users "
                 "file.", choices=("auto", "basic", "none")),
    ConfigOption("metrics.tls", "bool", False,
                 "Serve the metrics endpoint over HTTPS with the server's `tls.cert` / `tls.key` "
                 "(and, with `tls.client-ca`, require a client certificate signed by it)."),
    ConfigOption("metrics.table-labels", "bool", True,
                 "Label row and byte counters with their table and export per-bucket offsets; "
                 "`false` exports table-wide totals only and no series names a table."),
    ConfigOption("console.port", "int", None,
                 "Port of the web console (`http://HOST:PORT/`: tables, buckets, lake, cluster, "
                 "rates, running queries); unset, no console. It admits the server's users (a "
                 "login page, or HTTP Basic) and shows each only what DESCRIBE allows.", minimum=0),
)

# Flight session options (SetSessionOptions / GetSessionOptions), held per client connection.
# "catalog" and "schema" are the keys the ADBC Flight SQL driver uses for adbc_current_catalog and
# adbc_current_db_schema; "schema" is the connection's default database, the one USE sets.
SESSION_OPTIONS: dict[str, ConfigOption] = _registry(
    ConfigOption("catalog", "str", "flightstore",
                 "Current catalog; flightstore has one, `flightstore` (ADBC `adbc_current_catalog`)."),
    ConfigOption("schema", "str", "default",
                 "Current database of the connection: what unqualified table names resolve in; `USE db` "
                 "sets it too (ADBC `adbc_current_db_schema`)."),
    ConfigOption("flightstore.per-bucket-endpoints", "bool", False,
                 "Answer a scan with one Flight endpoint per bucket (parallel readers such as Spark); by "
                 "default every query has one endpoint that streams all buckets, so clients that read "
                 "only the first endpoint still get every row."),
)


# Options of the Python client (``flightstore.connect(uri, options={...})`` for writes, and
# ``TableClient.lookuper(options=...)`` for batched lookups: Apache Fluss's client options of the
# same names and defaults).
CLIENT_OPTIONS: dict[str, ConfigOption] = _registry(
    ConfigOption("client.writer.delivery-timeout", "duration", 120_000,
                 "How long a `TableClient` write keeps retrying a batch the server did not "
                 "acknowledge (it is unreachable, restarting, or answers UNAVAILABLE) before it "
                 "raises `DeliveryTimeout`; every retry carries the batch's writer sequence, so it is "
                 "applied once (Kafka's `delivery.timeout.ms`). The default covers a server restart.",
                 minimum=0),
    ConfigOption("client.writer.retry-backoff.max", "duration", 1_000,
                 "Longest wait between two retries of a write (the wait doubles from 50 ms up to "
                 "this); also the longest the connection waits before reconnecting to a server that "
                 "went away.", minimum=10),
    ConfigOption("client.connect-timeout", "duration", 5_000,
                 "Longest one connection attempt waits for the server's HTTP/2 handshake. A server "
                 "that accepts the connection but does not answer within it (paused, or starved on a "
                 "loaded machine) counts as unreachable, and the call moves on to the next server of "
                 "`uris`. gRPC's own default is 20 s; far below a second, a busy server is taken for "
                 "a dead one.", minimum=100),
    ConfigOption("client.lookup.queue-size", "int", 25_600,
                 "Most lookups a lookuper holds before sending them; `lookup_async` blocks (the "
                 "asyncio `lookup` waits) while it is full.", minimum=1),
    ConfigOption("client.lookup.max-batch-size", "int", 128,
                 "Most lookups merged into one lookup request.", minimum=1),
    ConfigOption("client.lookup.max-inflight-requests", "int", 128,
                 "Most lookup requests of a lookuper sent and not yet answered.", minimum=1),
    ConfigOption("client.lookup.batch-timeout", "duration", 100,
                 "Longest a lookup waits for its batch to fill before the batch is sent anyway.",
                 minimum=0),
)


def validate_client_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every client option of :data:`CLIENT_OPTIONS`, typed (``options`` given, else the default);
    raises :class:`InvalidOption` naming the first unknown or ill-typed one."""
    typed = {key: option.default for key, option in CLIENT_OPTIONS.items()}
    for key, raw in (options or {}).items():
        option = CLIENT_OPTIONS.get(str(key))
        if option is None:
            raise InvalidOption(f"unknown client option '{key}' (known: {', '.join(CLIENT_OPTIONS)})")
        if raw is not None:
            typed[option.key] = option.parse(raw)
    return typed


def validate_table_options(options: Mapping[str, Any]) -> dict[str, str]:
    """Check every table option; return them normalized as strings (the persisted form).

    Raises :class:`InvalidOption` naming the first unknown or ill-typed option.
    """
    normalized: dict[str, str] = {}
    for key, raw in options.items():
        key = str(key)
        if key in TABLE_OPTIONS:
            value = TABLE_OPTIONS[key].parse(raw)
            normalized[key] = ",".join(value) if isinstance(value, tuple) else str(raw).strip()
            if TABLE_OPTIONS[key].choices:
                normalized[key] = value
        elif FIELD_OPTION_PATTERN.match(key):
            normalized[key] = str(raw)
        elif key.startswith(ICEBERG_TABLE_PREFIX) and len(key) > len(ICEBERG_TABLE_PREFIX):
            normalized[key] = str(raw)
        else:
            raise InvalidOption(f"unknown table option '{key}'")
    return normalized


def validate_server_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Check server options given as ``key=value`` (``serve --option``); return them typed.

    Keys under ``datalake.iceberg.`` that the registry does not list pass through to the Iceberg
    catalog as strings. Raises :class:`InvalidOption` naming the first unknown or ill-typed option.
    """
    typed: dict[str, Any] = {}
    for key, raw in options.items():
        key = str(key)
        if key in SERVER_OPTIONS:
            typed[key] = SERVER_OPTIONS[key].parse(raw)
        elif key.startswith(ICEBERG_CATALOG_PREFIX) and len(key) > len(ICEBERG_CATALOG_PREFIX):
            typed[key] = str(raw)
        else:
            raise InvalidOption(f"unknown server option '{key}'")
    return typed


def table_option(options: Mapping[str, str], key: str) -> Any:
    """The typed value of table option ``key`` in ``options``, or its default."""
    option = TABLE_OPTIONS[key]
    if key in options:
        return option.parse(options[key])
    return option.default


def server_option(options: Mapping[str, Any], key: str) -> Any:
    """The typed value of server option ``key`` in ``options``, or its default."""
    option = SERVER_OPTIONS[key]
    if options.get(key) is not None:
        return option.parse(options[key])
    return option.default


OPTIONS_PAGE_HEAD = """# Options

<!-- Generated from flightstore/config.py by `python -m flightstore options --page > docs/options.md`:
edit the registry, not this page (tests/test_docs.py checks that the page is current). -->

Every option flightstore knows. `table` options go in `CREATE TABLE ... WITH ('key' = 'value')`
(some may change later with `ALTER TABLE ... SET`); `server` options are flags or
`flightstore serve -o key=value`; `session` options are Flight session options of a connection;
`client` options are given to `flightstore.connect(uri, options=...)` or
`table.lookuper(options=...)`. Durations are in milliseconds unless they carry a unit.
"""


def options_page() -> str:
    """``docs/options.md``: :func:`options_markdown` under the page's title and introduction."""
    return OPTIONS_PAGE_HEAD + "\n" + options_markdown() + "\n"


def options_markdown() -> str:
    """The option table (``docs/options.md``, ``flightstore options``), generated from the registry."""
    lines = ["| option | scope | type | default | description |", "|---|---|---|---|---|"]
    for scope, registry in (("table", TABLE_OPTIONS), ("server", SERVER_OPTIONS),
                            ("session", SESSION_OPTIONS), ("client", CLIENT_OPTIONS)):
        for option in registry.values():
            default = ",".join(option.default) if isinstance(option.default, tuple) else option.default
            kind = " / ".join(option.choices) if option.choices else option.type  # "|" would end the cell
            lines.append(f"| `{option.key}` | {scope} | {kind} | {default} | {option.doc} |")
    lines.append("| `fields.<field>.agg` | table | str | last_value_ignore_nulls | Aggregate function of "
                 "a field under the aggregation merge engine. |")
    lines.append("| `iceberg.<property>` | table | str |  | Iceberg table property `<property>` of the "
                 "table's lake table (e.g. `iceberg.write.parquet.compression-codec`). |")
    lines.append("| `datalake.iceberg.<property>` | server | str |  | Iceberg catalog property "
                 "`<property>` (pyiceberg's names, e.g. `datalake.iceberg.s3.path-style-access`). |")
    return "\n".join(lines)
