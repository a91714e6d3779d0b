"""The exception tree of flightstore.

One root, :class:`FlightstoreError`; each subclass names one Flight status code in ``flight_status``
so the server translates errors in exactly one place (``server/rpc.py``). Messages say what is
wrong and, where it helps, what to do instead.
"""

from __future__ import annotations

__all__ = [
    "FlightstoreError",
    "InvalidInput",
    "SqlError",
    "SchemaMismatch",
    "InvalidOption",
    "NotFound",
    "DatabaseNotFound",
    "TableNotFound",
    "PartitionNotFound",
    "AlreadyExists",
    "Unsupported",
    "Unauthorized",
    "Unauthenticated",
    "OutOfOrderSequence",
    "WriterExpired",
    "WriterConflict",
    "CorruptData",
    "DataLoss",
    "Cancelled",
    "DeadlineExceeded",
    "ResourceExhausted",
    "DataDirectoryInUse",
    "OffsetOutOfRange",
    "Unavailable",
    "WriteIncomplete",
    "DeliveryTimeout",
    "BucketUnavailable",
    "CoordinatorUnavailable",
    "LakeUnavailable",
    "RemoteStorageUnavailable",
    "TieringLeaseHeld",
    "ServerIdInUse",
]


class FlightstoreError(Exception):
    """Root of every error flightstore raises on purpose."""

    flight_status = "internal"


class InvalidInput(FlightstoreError):
    """The request is malformed or contradicts the table (maps to INVALID_ARGUMENT)."""

    flight_status = "invalid_argument"


class SqlError(InvalidInput):
    """SQL text that cannot be parsed or planned."""


class SchemaMismatch(InvalidInput):
    """Written data does not fit the table's schema."""


class InvalidOption(InvalidInput):
    """An unknown or ill-typed configuration option."""


class NotFound(FlightstoreError):
    """Something named does not exist (maps to NOT_FOUND)."""

    flight_status = "not_found"


class LakeFileMissing(NotFound):
    """A lake file a read was planned on is gone: the snapshot it reads was expired (and its files
    deleted) meanwhile. Plan the read again on a live snapshot."""


class DatabaseNotFound(NotFound):
    """An unknown database."""


class TableNotFound(NotFound):
    """An unknown table."""


class PartitionNotFound(NotFound):
    """A partition named by DROP PARTITION (or a read) that the table does not have."""


class AlreadyExists(FlightstoreError):
    """Creating something that exists (maps to ALREADY_EXISTS)."""

    flight_status = "already_exists"


class Unsupported(FlightstoreError):
    """A well-formed request flightstore does not implement (maps to UNIMPLEMENTED)."""

    flight_status = "unimplemented"


class Unauthenticated(FlightstoreError):
    """Missing or wrong credentials (maps to UNAUTHENTICATED)."""

    flight_status = "unauthenticated"


class Unauthorized(FlightstoreError):
    """Authenticated but not allowed (maps to UNAUTHORIZED)."""

    flight_status = "unauthorized"


class OutOfOrderSequence(InvalidInput):
    """A writer skipped batch sequence numbers; earlier batches were lost."""


class WriterExpired(OutOfOrderSequence):
    """A batch (sequence above 0) from a writer whose state expired ('table.writer-id.expiration')."""


class WriterConflict(FlightstoreError):
    """Another live writer owns a column this writer wants to write (maps to ALREADY_EXISTS)."""

    flight_status = "already_exists"


class CorruptData(FlightstoreError):
    """Files on disk that fail their checks (maps to INTERNAL)."""

    flight_status = "internal"


class DataLoss(CorruptData):
    """Stored data failed its checks while being read or recovered: the answer would be short or
    wrong, so none is given. The message names the table and bucket (and the file or offsets).

    pyarrow's Flight server cannot send gRPC's DATA_LOSS code; the server answers INTERNAL with a
    message that starts ``DATA_LOSS:``."""

    flight_status = "data_loss"


class Cancelled(FlightstoreError):
    """The request was cancelled (maps to CANCELLED)."""

    flight_status = "cancelled"


class DeadlineExceeded(FlightstoreError):
    """The request ran past its time limit (``query.timeout``) and was stopped (maps to
    DEADLINE_EXCEEDED)."""

    flight_status = "deadline_exceeded"


class ResourceExhausted(FlightstoreError):
    """The request needs more than the server allows it (memory, spill space, result size) and
    was stopped; the server keeps serving.

    pyarrow's Flight server cannot send gRPC's RESOURCE_EXHAUSTED code; the server answers
    INTERNAL with a message that starts ``RESOURCE_EXHAUSTED:``."""

    flight_status = "resource_exhausted"


class DataDirectoryInUse(FlightstoreError):
    """Another open Store (in this or another process) holds the data directory."""


class OffsetOutOfRange(InvalidInput):
    """A reader asked for log offsets the log no longer holds (deleted by ``table.log.ttl`` once a
    KV snapshot covered them) or does not hold yet. The message names the earliest offset still
    held, where a reader that may skip ahead can start instead.

    Flight has no OUT_OF_RANGE status: it maps to INVALID_ARGUMENT like other bad requests."""


class Unavailable(FlightstoreError):
    """A part of the cluster needed for the request is not reachable now; the same request may
    succeed later (maps to UNAVAILABLE)."""

    flight_status = "unavailable"


class WriteIncomplete(Unavailable):
    """A write passed every check and was recorded as its table's write intent, but storage failed
    (a full disk, an I/O error) before every bucket applied it. It is completed, never undone,
    before the table's next write and at its next open (:mod:`flightstore.intents`); until then the
    table refuses writes with this error. A retry with the same writer id and sequence is
    acknowledged as a duplicate once it is complete."""


class DeliveryTimeout(Unavailable):
    """(Client side.) A ``TableClient`` write was not acknowledged within
    ``client.writer.delivery-timeout``: its outcome is unknown. The client keeps the batch and
    delivers it again, under the same writer sequence (applied once), before its next write or on
    ``flush()``: the caller must not send it again."""


class BucketUnavailable(Unavailable):
    """The server that leads a bucket is down; the message names the table, bucket and server."""


class NotLeader(BucketUnavailable):
    """A call reached a server that does not lead the bucket at the epoch the sender knows (a
    stale view, or a deposed leader): the sender refreshes its view and retries at the leader."""


class NotEnoughReplicas(Unavailable):
    """A write to a replicated bucket was refused or not acknowledged: fewer in-sync replicas
    than ``log.replica.min-in-sync-replicas-number``, or they did not confirm it in time (Kafka's
    NOT_ENOUGH_REPLICAS). Not acknowledged is not lost: a retry with the same writer id and
    sequence is applied once."""


class SchemaVersionUnknown(Unavailable):
    """A replicated record carries a table schema version this server's catalog has not applied
    yet; the follower retries once its catalog caught up."""


class CoordinatorUnavailable(Unavailable):
    """No coordinator answered a DDL request in time (or ZooKeeper is unreachable)."""


class LakeUnavailable(Unavailable):
    """The lake (its Iceberg catalog or warehouse) cannot be reached or written now. Tiering
    retries with backoff; the log keeps every untiered record meanwhile."""


class RemoteStorageUnavailable(Unavailable):
    """Remote storage (``remote.data.dir``) did not answer: offsets held only there cannot be
    read now (never answered with fewer rows); retry later."""


class TieringLeaseHeld(FlightstoreError):
    """Another tierer (the server or a tiering job) holds the table's tiering lease; the message
    names the holder and when its lease expires (maps to ALREADY_EXISTS)."""

    flight_status = "already_exists"


class ServerIdInUse(FlightstoreError):
    """Another live server registered the same ``--server-id`` (maps to ALREADY_EXISTS)."""

    flight_status = "already_exists"
