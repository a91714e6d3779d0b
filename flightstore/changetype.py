"""Change types of the changelog, with their fixed wire values (as Apache Fluss defines them).

The log stores the byte value in the int8 column ``_change_type``; clients see the short strings.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "INSERT", "UPDATE_BEFORE", "UPDATE_AFTER", "DELETE", "APPEND_ONLY",
    "SHORT_STRINGS", "CHANGE_TYPE_COLUMN", "LOG_OFFSET_COLUMN", "COMMIT_TIMESTAMP_COLUMN",
    "META_FIELDS", "META_COLUMNS", "changelog_schema", "snapshot_schema", "to_strings", "from_strings",
]

INSERT = 0          # +I
UPDATE_BEFORE = 1   # -U
UPDATE_AFTER = 2    # +U
DELETE = 3          # -D
APPEND_ONLY = 4     # +A: a row of a log table

SHORT_STRINGS = ("+I", "-U", "+U", "-D", "+A")

CHANGE_TYPE_COLUMN = "_change_type"
LOG_OFFSET_COLUMN = "_log_offset"
COMMIT_TIMESTAMP_COLUMN = "_commit_timestamp"

#: The columns a changelog read adds to a table's columns, in order.
META_FIELDS: tuple[pa.Field, ...] = (
    pa.field(CHANGE_TYPE_COLUMN, pa.string(), nullable=False),
    pa.field(LOG_OFFSET_COLUMN, pa.int64(), nullable=False),
    pa.field(COMMIT_TIMESTAMP_COLUMN, pa.timestamp("ms", tz="UTC"), nullable=False),
)
META_COLUMNS = frozenset(f.name for f in META_FIELDS)


def changelog_schema(schema: pa.Schema) -> pa.Schema:
    """Schema of ``t$changelog``: the table's columns, then the :data:`META_FIELDS`."""
    return pa.schema(list(schema) + list(META_FIELDS))


def snapshot_schema(schema: pa.Schema) -> pa.Schema:
    """Schema of a KV snapshot read as changelog rows: every row ``+I``, with a null offset and
    commit time (a snapshot holds rows, not the changes that produced them)."""
    return pa.schema(list(schema) + [META_FIELDS[0]] + [f.with_nullable(True) for f in META_FIELDS[1:]])

_STRINGS = pa.array(SHORT_STRINGS, pa.string())


def to_strings(codes: pa.Array) -> pa.Array:
    """Map int8 change-type codes to their short strings (``+I``, ``-U``, ...)."""
    return pc.take(_STRINGS, pc.cast(codes, pa.int32()))


def from_strings(strings: pa.Array) -> pa.Array:
    """Map short strings back to int8 codes; unknown strings raise ``ValueError``."""
    codes = pc.index_in(strings, value_set=_STRINGS)
    if codes.null_count:
        bad = pc.filter(strings, pc.is_null(codes))[0].as_py()
        raise ValueError(f"unknown change type {bad!r}; expected one of {', '.join(SHORT_STRINGS)}")
    return pc.cast(codes, pa.int8())
