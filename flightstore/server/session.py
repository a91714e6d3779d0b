"""What one client connection set: its current database and its Flight session options.

A :class:`Session` lives per client connection (the service keys it by gRPC peer). Its options are
the registry's :data:`~flightstore.config.SESSION_OPTIONS`, read and written with the Flight core
actions SetSessionOptions / GetSessionOptions:

* ``catalog`` and ``schema`` are what the ADBC Flight SQL driver gets and sets for
  ``adbc_current_catalog`` / ``adbc_current_db_schema``. ``schema`` *is* the database ``USE`` sets:
  one field, so the two can never disagree;
* ``flightstore.per-bucket-endpoints`` asks for one Flight endpoint per bucket on scans (Spark reads
  them in parallel). It is off by default, because clients such as flightsql-dbapi (and Superset
  over it) read only a FlightInfo's first endpoint: one endpoint that streams every bucket keeps
  their answers whole.

An unknown option name is refused in the result's ``errors`` map (INVALID_NAME: clients name the
option). A bad value fails the call with a message saying what is wrong (``database 'nope' does not
exist``): the result's INVALID_VALUE cannot carry a reason, and ADBC would show only "invalid
value". Either way nothing of that request is applied, so a client never believes a setting took
that did not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flightstore.catalog import DEFAULT_DATABASE
from flightstore.config import SESSION_OPTIONS
from flightstore.errors import FlightstoreError, InvalidOption, NotFound
from flightstore.server import protocol
from flightstore.server.sql_info import CATALOG_NAME

__all__ = ["PER_BUCKET_ENDPOINTS", "Session", "apply_options", "option_values"]

PER_BUCKET_ENDPOINTS = "flightstore.per-bucket-endpoints"
_INVALID_NAME = 1  # SetSessionOptionsResult.ErrorValue


@dataclass
class Session:
    """One connection's state: the default database (``USE``, option ``schema``) and whether scans
    answer one endpoint per bucket."""

    database: str = DEFAULT_DATABASE
    per_bucket_endpoints: bool = False


def _python(value: Any) -> Any:
    """The Python value of a ``SessionOptionValue`` (None when it is unset: erase the option)."""
    kind = value.WhichOneof("option_value")
    if kind is None:
        return None
    if kind == "string_list_value":
        return list(value.string_list_value.values)
    return getattr(value, kind)


def apply_options(session: Session, options: Mapping[str, Any],
                  resolve_database: Callable[[str], str]) -> dict[str, int]:
    """Apply a SetSessionOptions request to ``session``; return the errors by option name.

    ``resolve_database`` returns the catalog's spelling of a database or raises NotFound. Either
    every option of the request is applied or (when any is refused) none is: unknown names are
    returned (INVALID_NAME); a refused value raises the error that says why (NOT_FOUND when every
    refused value names something missing, else INVALID_ARGUMENT), naming the unknown names too.
    """
    errors: dict[str, int] = {}
    reasons: dict[str, FlightstoreError] = {}
    changes: dict[str, Any] = {}
    for name, raw in options.items():
        option = SESSION_OPTIONS.get(name)
        if option is None:
            errors[name] = _INVALID_NAME
            continue
        value = _python(raw)
        if value is None:  # erased: back to the default
            changes[name] = option.default
            continue
        try:
            parsed = option.parse(value)
            if name == "catalog" and parsed != CATALOG_NAME:
                raise InvalidOption(f"the only catalog is {CATALOG_NAME!r}")
            if name == "schema":
                parsed = resolve_database(parsed)
        except FlightstoreError as exc:
            reasons[name] = exc
            continue
        changes[name] = parsed
    if reasons:
        _refuse(reasons, [name for name in errors])
    if errors:
        return errors
    if "schema" in changes:
        session.database = changes["schema"]
    if PER_BUCKET_ENDPOINTS in changes:
        session.per_bucket_endpoints = changes[PER_BUCKET_ENDPOINTS]
    return {}


def _refuse(reasons: Mapping[str, FlightstoreError], unknown: list[str]) -> None:
    """Raise the error of a request with refused values: each option and why, in one message."""
    parts = [f"session option '{name}': {exc}" for name, exc in reasons.items()]
    parts += [f"unknown session option '{name}'" for name in unknown]
    message = "; ".join(parts) + " (nothing was set)"
    if all(isinstance(exc, NotFound) for exc in reasons.values()) and not unknown:
        raise NotFound(message)
    raise InvalidOption(message)


def option_values(session: Session) -> dict[str, Any]:
    """Every session option's current value, as ``SessionOptionValue`` messages."""
    return {
        "catalog": protocol.SessionOptionValue(string_value=CATALOG_NAME),
        "schema": protocol.SessionOptionValue(string_value=session.database),
        PER_BUCKET_ENDPOINTS: protocol.SessionOptionValue(bool_value=session.per_bucket_endpoints),
    }
