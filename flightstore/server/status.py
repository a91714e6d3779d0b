"""What a client learns of a failure: a status and a message, never the server's insides.

pyarrow's Flight server sends an error raised in a Python handler with its code (ArrowInvalid ->
INVALID_ARGUMENT, ArrowKeyError -> NOT_FOUND, ...) and appends ``Detail: Python exception: ...``,
the exception formatted by :func:`traceback.format_exception`: a traceback naming the server's
source files. Only ``FlightError`` subclasses travel without one, and they cannot say
INVALID_ARGUMENT or NOT_FOUND. So while a server runs, :func:`quiet_tracebacks` holds
``sys.tracebacklimit`` at 0 (that detail then reads ``pyarrow.lib.ArrowInvalid: <message>``), and
failures are logged here with their full traceback (an explicit ``limit`` is not cut); ``serve``
gives its log handlers a :class:`TracebackFormatter` so background threads' ``log.exception`` keep
theirs too.

Messages leave through :func:`client_message`: the server's data directory becomes ``<data-dir>``
and long messages are cut. An unexpected exception (a bug) reaches the client as INTERNAL with an
incident id only; the server log has the traceback under that id.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import traceback
import uuid
from collections.abc import Iterable

import pyarrow as pa
from pyarrow import flight

__all__ = [
    "MAX_MESSAGE_CHARS",
    "InvalidArgument",
    "NotFound",
    "TracebackFormatter",
    "Unimplemented",
    "client_message",
    "full_tracebacks_in_log",
    "internal_error",
    "log_failure",
    "loud_tracebacks",
    "quiet_tracebacks",
]

log = logging.getLogger("flightstore.server")
MAX_MESSAGE_CHARS = 4000
_TRACEBACK_FRAMES = 200  # what the server log keeps of a traceback (explicit: tracebacklimit is 0)
_lock = threading.Lock()
_holders = 0
_saved: tuple[bool, object] = (False, None)  # (sys had tracebacklimit, its value)


class InvalidArgument(pa.ArrowInvalid):
    """INVALID_ARGUMENT (and ALREADY_EXISTS, which pyarrow cannot send). Named as a status in
    the detail pyarrow appends (``Python exception: InvalidArgument: ...``), not as a pyarrow or
    Python class."""

    __module__ = "builtins"


class NotFound(pa.ArrowKeyError):
    """NOT_FOUND."""

    __module__ = "builtins"


class Unimplemented(NotImplementedError):
    """UNIMPLEMENTED."""

    __module__ = "builtins"


def quiet_tracebacks() -> None:
    """Keep tracebacks out of errors sent to clients while at least one server runs (counted:
    :func:`loud_tracebacks` undoes one call; the last one restores ``sys.tracebacklimit``)."""
    global _holders, _saved
    with _lock:
        if _holders == 0:
            _saved = (hasattr(sys, "tracebacklimit"), getattr(sys, "tracebacklimit", None))
            sys.tracebacklimit = 0
        _holders += 1


def loud_tracebacks() -> None:
    global _holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            had, value = _saved
            if had:
                sys.tracebacklimit = value
            elif hasattr(sys, "tracebacklimit"):
                del sys.tracebacklimit


class TracebackFormatter(logging.Formatter):
    """A log formatter that prints whole tracebacks even while ``sys.tracebacklimit`` is 0, so
    ``log.exception`` in the server's background threads keeps its stacks."""

    def formatException(self, ei) -> str:
        return "".join(traceback.format_exception(ei[0], ei[1], ei[2], limit=_TRACEBACK_FRAMES)).rstrip("\n")


def full_tracebacks_in_log() -> None:
    """Give every handler of the root logger a :class:`TracebackFormatter` (its format kept)."""
    for handler in logging.getLogger().handlers:
        current = handler.formatter
        handler.setFormatter(TracebackFormatter(current._fmt if current is not None else None,
                                                current.datefmt if current is not None else None))


def client_message(message: str, hidden_paths: Iterable[str | os.PathLike]) -> str:
    """``message`` as a client may see it: each of ``hidden_paths`` (the data directory, as given
    and resolved) replaced by ``<data-dir>`` where it is a path, at most :data:`MAX_MESSAGE_CHARS`
    characters. Only paths are masked, never words: with ``--data-dir ./data`` (given as ``data``)
    a column ``metadata`` or a database ``database_x`` keeps its name (:func:`_path_pattern`)."""
    for path in sorted({str(p) for p in hidden_paths if str(p) not in ("", "/", ".")}, key=len,
                       reverse=True):
        message = _path_pattern(path).sub("<data-dir>", message)
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + f"... ({len(message)} characters)"
    return message


_PATH_CHAR = r"[\w.~+-]"  # a character that may continue a path's file name


def _path_pattern(path: str) -> re.Pattern[str]:
    """Where ``path`` appears as a path in a message: not inside a longer name on either side, and,
    for a relative path (``data``, ``./data``), only with a file below it (``data/...``): a relative
    path alone is indistinguishable from a word."""
    path = path.rstrip("/") or path
    tail = r"(?=/|$|[^\w.~+-])" if os.path.isabs(path) else r"(?=/)"
    return re.compile(rf"(?<!{_PATH_CHAR})(?<!/){re.escape(path)}{tail}")


def log_failure(what: str, exc: BaseException, level: int = logging.ERROR) -> None:
    """Log ``exc`` with its whole traceback (``sys.tracebacklimit`` is 0 while serving)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=_TRACEBACK_FRAMES))
    log.log(level, "%s\n%s", what, text.rstrip())


def internal_error(exc: BaseException) -> flight.FlightInternalError:
    """The error a client sees for an exception nobody raised on purpose: an incident id, nothing
    of the exception (its class, message or traceback); the server log has them under that id."""
    incident = uuid.uuid4().hex[:12]
    log_failure(f"internal error, incident {incident}", exc)
    return flight.FlightInternalError(f"internal error (incident {incident}); the server log has the "
                                      "details")
