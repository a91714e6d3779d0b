"""The one rule for what a database or a table may be called.

Every way a name enters flightstore (SQL DDL, ``ALTER TABLE ... RENAME TO``, Flight SQL bulk ingest,
the Python client, the cluster coordinator, and the catalog file at start-up) goes through
:func:`check_name`. A name is an SQL identifier: letters, digits and ``_``, not starting with a
digit, at most :data:`MAX_NAME_BYTES` bytes. That rules out ``""``, ``"."``, ``".."``, path
separators, NUL and other control characters, quotes and spaces, so a name can always be written
in SQL without quoting. Names never become file names: table directories are made from table ids
(:mod:`flightstore.catalog`).

Refusals are :class:`~flightstore.errors.InvalidInput` with a message saying what is wrong; the
offending name is shown cut to :data:`SHOWN_CHARS` characters, so a 5,000-character name does not
come back whole.
"""

from __future__ import annotations

import re
from typing import Any

from flightstore.errors import InvalidInput

__all__ = ["IDENTIFIER", "MAX_NAME_BYTES", "SHOWN_CHARS", "check_name", "shown_name"]

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: The longest database or table name, in UTF-8 bytes (file systems' usual component limit).
MAX_NAME_BYTES = 255
#: How much of a refused name an error message repeats.
SHOWN_CHARS = 64
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def shown_name(name: Any) -> str:
    """``repr`` of ``name``, cut to :data:`SHOWN_CHARS` characters (for error messages)."""
    if isinstance(name, str) and len(name) > SHOWN_CHARS:
        return f"{name[:SHOWN_CHARS]!r}... ({len(name)} characters)"
    return repr(name)


def check_name(name: Any, kind: str = "table") -> str:
    """Return ``name`` when it is a valid ``kind`` ("database" or "table") name, else raise
    InvalidInput saying why."""
    if not isinstance(name, str):
        raise InvalidInput(f"a {kind} name must be a string, not {type(name).__name__}")
    if not name:
        raise InvalidInput(f"a {kind} name cannot be empty")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise InvalidInput(f"{kind} name {shown_name(name)} is {size} bytes long; the limit is "
                           f"{MAX_NAME_BYTES} bytes")
    if IDENTIFIER.match(name):
        return name
    if name in (".", ".."):
        reason = "is a path component"
    elif "/" in name or "\\" in name:
        reason = "contains a path separator"
    elif _CONTROL.search(name):
        reason = "contains a control character"
    else:
        reason = "is not an identifier"
    raise InvalidInput(f"invalid {kind} name {shown_name(name)}: it {reason}; use letters, digits "
                       "and _ (not starting with a digit)")
