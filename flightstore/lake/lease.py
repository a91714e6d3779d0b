"""Tiering leases: at most one tierer (the server's or a tiering job) works on a table at a time.

A lease is a row of ``flightstore_tiering_leases`` in the lake's catalog database (the database every
tierer of the lake already shares): table, holder, expiry. Taking it is one conditional UPDATE
(``WHERE holder = me OR expired``) or, for a table never leased, one INSERT whose primary key
refuses a second taker: atomic in any SQL database, across processes and hosts. A holder renews it
every round; a holder that died frees the table when its lease expires. Holder names are stable
per tierer (``server:<host>:<data dir>``), so a restarted server takes its own lease back at once.

The lease keeps tierers from wasting rounds on each other; correctness does not rest on it: a
tiering commit also asserts the snapshot it started from, so a second commit on the same base fails
instead of doubling rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import BigInteger, Column, MetaData, String, Table, and_, delete, insert, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from flightstore.errors import TieringLeaseHeld
from flightstore.lake.catalog import lake_failures

__all__ = ["Lease", "LeaseStore"]

_METADATA = MetaData()
_LEASES = Table(
    "flightstore_tiering_leases", _METADATA,
    Column("table_name", String(512), primary_key=True),
    Column("holder", String(512), nullable=False),
    Column("expires_at_ms", BigInteger, nullable=False),
)


@dataclass(frozen=True)
class Lease:
    """A held lease: ``holder`` owns ``table_name`` until ``expires_at_ms`` (wall clock)."""

    table_name: str
    holder: str
    expires_at_ms: int


class LeaseStore:
    """The lease table of one catalog database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        with lake_failures("creating the tiering lease table"):
            _METADATA.create_all(engine, tables=[_LEASES])

    def acquire(self, table_name: str, holder: str, ttl_ms: int, now_ms: int | None = None) -> Lease:
        """Take or renew the lease of ``table_name`` for ``ttl_ms``.

        Raises :class:`TieringLeaseHeld` naming the other holder while its lease runs.
        """
        now = int(time.time() * 1000) if now_ms is None else int(now_ms)
        expires = now + int(ttl_ms)
        with lake_failures(f"taking the tiering lease of {table_name}"):
            with self.engine.begin() as connection:
                taken = connection.execute(
                    update(_LEASES)
                    .where(and_(_LEASES.c.table_name == table_name,
                                or_(_LEASES.c.holder == holder, _LEASES.c.expires_at_ms < now)))
                    .values(holder=holder, expires_at_ms=expires)).rowcount
            if not taken:
                try:
                    with self.engine.begin() as connection:
                        connection.execute(insert(_LEASES).values(
                            table_name=table_name, holder=holder, expires_at_ms=expires))
                except IntegrityError:
                    current = self.current(table_name)
                    if current is None or current.holder != holder:
                        other = current.holder if current else "another tierer"
                        until = current.expires_at_ms if current else 0
                        raise TieringLeaseHeld(
                            f"table {table_name} is being tiered by {other} (lease until "
                            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(until / 1000))} UTC); "
                            "stop that tierer or wait for its lease to expire") from None
        return Lease(table_name, holder, expires)

    def release(self, table_name: str, holder: str) -> None:
        """Give the lease up (no-op unless ``holder`` holds it)."""
        with lake_failures(f"releasing the tiering lease of {table_name}"), self.engine.begin() as connection:
            connection.execute(delete(_LEASES).where(
                and_(_LEASES.c.table_name == table_name, _LEASES.c.holder == holder)))

    def current(self, table_name: str) -> Lease | None:
        """The lease row of ``table_name`` (expired or not), or None."""
        with lake_failures(f"reading the tiering lease of {table_name}"), self.engine.connect() as connection:
            row = connection.execute(select(_LEASES).where(_LEASES.c.table_name == table_name)).first()
        return None if row is None else Lease(row.table_name, row.holder, int(row.expires_at_ms))
