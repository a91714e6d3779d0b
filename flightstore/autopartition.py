"""Auto-partitioning (Fluss's ``table.auto-partition.*``): which time partitions to create ahead and
which to drop, at a given moment. Pure: the server's check (:mod:`flightstore.server.housekeeping`)
applies the answer through the store.

A table with ``'table.auto-partition.enabled' = 'true'`` is partitioned by a STRING column (the
``table.auto-partition.key``, needed only when there are several partition keys) whose values are
times formatted per ``table.auto-partition.time-unit``, as Fluss does:

========  ============  ==========
unit      format        example
========  ============  ==========
HOUR      yyyyMMddHH    2026112314
DAY       yyyyMMdd      20261123
MONTH     yyyyMM        202611
QUARTER   yyyyQ         20264
YEAR      yyyy          2026
========  ============  ==========

At each check, with ``now`` in ``table.auto-partition.time-zone`` (default: the server's):

* the current and the next ``num-precreate - 1`` partitions are created (only with a single
  partition key: other keys' values cannot be guessed);
* every partition whose time value is earlier than ``now`` minus ``num-retention`` units is dropped
  (``num-retention`` = 7 keeps the 7 partitions before the current one). Values that are not times
  of the unit's format (added by hand) are left alone.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from flightstore.errors import InvalidInput
from flightstore.partitioning import Partition

__all__ = ["TIME_UNITS", "AutoPartition", "auto_partition", "partition_value", "plan"]

TIME_UNITS: dict[str, tuple[str, str]] = {  # unit -> (Fluss format, regex of a valid value)
    "HOUR": ("yyyyMMddHH", r"\d{10}"),
    "DAY": ("yyyyMMdd", r"\d{8}"),
    "MONTH": ("yyyyMM", r"\d{6}"),
    "QUARTER": ("yyyyQ", r"\d{4}[1-4]"),
    "YEAR": ("yyyy", r"\d{4}"),
}


@dataclass(frozen=True)
class AutoPartition:
    """A table's auto-partitioning settings, validated."""

    key: str
    key_index: int
    time_unit: str
    num_precreate: int
    num_retention: int
    time_zone: str | None
    single_key: bool

    def zone(self) -> _dt.tzinfo | None:
        return ZoneInfo(self.time_zone) if self.time_zone else None


def auto_partition(descriptor) -> AutoPartition | None:
    """The settings of ``descriptor`` (None when auto-partitioning is off). Raises InvalidInput for
    a table that cannot be auto-partitioned as configured."""
    if not descriptor.option("table.auto-partition.enabled"):
        return None
    where = f"table {descriptor.path}"
    keys = descriptor.partition_keys
    if not keys:
        raise InvalidInput(f"{where}: 'table.auto-partition.enabled' needs PARTITIONED BY (...)")
    key = descriptor.option("table.auto-partition.key")
    if key is None:
        if len(keys) > 1:
            raise InvalidInput(f"{where}: with several partition keys, 'table.auto-partition.key' "
                               f"must name the time one ({', '.join(keys)})")
        key = keys[0]
    matches = [k for k in keys if k.lower() == str(key).lower()]
    if not matches:
        raise InvalidInput(f"{where}: 'table.auto-partition.key' {key!r} is not a partition key "
                           f"({', '.join(keys)})")
    key = matches[0]
    arrow_type = descriptor.schema.field(key).type
    if str(arrow_type) not in ("string", "large_string"):
        raise InvalidInput(f"{where}: the auto-partition key {key!r} must be a STRING column, not "
                           f"{arrow_type}")
    zone = descriptor.option("table.auto-partition.time-zone")
    if zone:
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidInput(f"{where}: unknown 'table.auto-partition.time-zone' {zone!r} (use an "
                               "IANA name such as UTC or Europe/Paris)") from None
    return AutoPartition(key=key, key_index=keys.index(key),
                         time_unit=descriptor.option("table.auto-partition.time-unit"),
                         num_precreate=descriptor.option("table.auto-partition.num-precreate"),
                         num_retention=descriptor.option("table.auto-partition.num-retention"),
                         time_zone=zone or None, single_key=len(keys) == 1)


def _add_months(moment: _dt.datetime, months: int) -> _dt.datetime:
    index = moment.year * 12 + moment.month - 1 + months
    return moment.replace(year=index // 12, month=index % 12 + 1, day=1)


def partition_value(now: _dt.datetime, unit: str, offset: int = 0) -> str:
    """The partition value of the ``unit`` that is ``offset`` units after the one holding ``now``
    (an aware or local datetime, already in the table's time zone)."""
    if unit == "HOUR":
        base = now.replace(minute=0, second=0, microsecond=0)
        if base.tzinfo is not None:  # step in absolute hours, then back to local wall time
            moment = (base.astimezone(_dt.timezone.utc) + _dt.timedelta(hours=offset)).astimezone(now.tzinfo)
        else:
            moment = base + _dt.timedelta(hours=offset)
        return moment.strftime("%Y%m%d%H")
    if unit == "DAY":
        return (now.date() + _dt.timedelta(days=offset)).strftime("%Y%m%d")
    if unit == "MONTH":
        return _add_months(now, offset).strftime("%Y%m")
    if unit == "QUARTER":
        moment = _add_months(now.replace(month=(now.month - 1) // 3 * 3 + 1), 3 * offset)
        return f"{moment.year:04d}{(moment.month - 1) // 3 + 1}"
    if unit == "YEAR":
        return f"{now.year + offset:04d}"
    raise InvalidInput(f"unknown auto-partition time unit {unit!r}; use one of {', '.join(TIME_UNITS)}")


def plan(settings: AutoPartition, partitions: Sequence[Partition], now_ms: int
         ) -> tuple[list[tuple[str, ...]], list[Partition]]:
    """``(values of partitions to create, partitions to drop)`` at ``now_ms`` (epoch ms)."""
    zone = settings.zone()
    now = _dt.datetime.fromtimestamp(now_ms / 1000, tz=zone) if zone is not None else \
        _dt.datetime.fromtimestamp(now_ms / 1000)
    unit = settings.time_unit
    existing = {p.values for p in partitions}
    create: list[tuple[str, ...]] = []
    if settings.single_key:
        for offset in range(settings.num_precreate):
            values = (partition_value(now, unit, offset),)
            if values not in existing:
                create.append(values)
    boundary = partition_value(now, unit, -settings.num_retention)
    valid = re.compile(TIME_UNITS[unit][1])
    drop = [p for p in partitions
            if valid.fullmatch(p.values[settings.key_index]) and p.values[settings.key_index] < boundary]
    return create, sorted(drop)
