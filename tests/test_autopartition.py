"""Auto-partitioning decisions (flightstore/autopartition.py): Fluss's formats per time unit, what a
check creates ahead and drops, time zones, and the settings a table must have."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from flightstore.autopartition import auto_partition, partition_value, plan
from flightstore.errors import InvalidInput
from flightstore.partitioning import Partition
from flightstore.schema import TableDescriptor

SCHEMA = pa.schema([("dt", pa.string()), ("region", pa.string()), ("d", pa.date32()), ("v", pa.int64())])


def _descriptor(keys=("dt",), **options) -> TableDescriptor:
    return TableDescriptor.create("db.t", SCHEMA, partition_keys=keys,
                                  options={"table.auto-partition.enabled": "true", **options})


@pytest.mark.parametrize("unit, offsets", [
    ("HOUR", {0: "2026123123", 1: "2027010100", -24: "2026123023"}),
    ("DAY", {0: "20261231", 1: "20270101", -365: "20251231"}),
    ("MONTH", {0: "202612", 1: "202701", -12: "202512", -13: "202511"}),
    ("QUARTER", {0: "20264", 1: "20271", -4: "20254", -5: "20253"}),
    ("YEAR", {0: "2026", 1: "2027", -10: "2016"}),
])
def test_fluss_formats_per_time_unit(unit, offsets):
    now = dt.datetime(2026, 12, 31, 23, 30)
    assert {o: partition_value(now, unit, o) for o in offsets} == offsets


def test_hours_step_in_absolute_time_across_a_daylight_saving_change():
    from zoneinfo import ZoneInfo
    before = dt.datetime(2026, 3, 29, 1, 10, tzinfo=ZoneInfo("Europe/Paris"))  # 02:00 CET -> 03:00 CEST
    assert [partition_value(before, "HOUR", i) for i in range(3)] == ["2026032901", "2026032903", "2026032904"]


def _ms(*args, tz=dt.timezone.utc) -> int:
    return int(dt.datetime(*args, tzinfo=tz).timestamp() * 1000)


def test_a_check_precreates_and_drops_past_the_retention():
    settings = auto_partition(_descriptor(**{"table.auto-partition.time-zone": "UTC",
                                             "table.auto-partition.num-retention": "2",
                                             "table.auto-partition.num-precreate": "3"}))
    existing = [Partition(i, v, (v,)) for i, v in enumerate(
        ["20261118", "20261119", "20261120", "20261121", "20261122", "hand-made", "20261123"])]
    create, drop = plan(settings, existing, _ms(2026, 11, 23, 9))
    assert create == [("20261124",), ("20261125",)]
    assert [p.name for p in drop] == ["20261118", "20261119", "20261120"]  # 21 and 22 kept; hand-made too


def test_the_time_zone_decides_the_current_partition():
    utc = auto_partition(_descriptor(**{"table.auto-partition.time-zone": "UTC",
                                        "table.auto-partition.num-precreate": "1"}))
    tokyo = auto_partition(_descriptor(**{"table.auto-partition.time-zone": "Asia/Tokyo",
                                          "table.auto-partition.num-precreate": "1"}))
    moment = _ms(2026, 11, 23, 20)  # already the 24th in Tokyo
    assert plan(utc, [], moment)[0] == [("20261123",)]
    assert plan(tokyo, [], moment)[0] == [("20261124",)]


def test_several_partition_keys_drop_by_the_time_key_and_create_nothing():
    settings = auto_partition(_descriptor(("region", "dt"), **{"table.auto-partition.key": "DT",
                                                               "table.auto-partition.time-zone": "UTC",
                                                               "table.auto-partition.num-retention": "1"}))
    assert settings.key == "dt" and settings.key_index == 1
    existing = [Partition(0, "eu$20261120", ("eu", "20261120")), Partition(1, "us$20261122", ("us", "20261122"))]
    create, drop = plan(settings, existing, _ms(2026, 11, 23, 9))
    assert create == [] and [p.name for p in drop] == ["eu$20261120"]


@pytest.mark.parametrize("keys, options, words", [
    ((), {}, "needs PARTITIONED BY"),
    (("region", "dt"), {}, "must name the time one"),
    (("dt",), {"table.auto-partition.key": "v"}, "is not a partition key"),
    (("d",), {}, "must be a STRING column"),
    (("dt",), {"table.auto-partition.time-zone": "Mars/Olympus"}, "unknown 'table.auto-partition.time-zone'"),
    (("dt",), {"table.auto-partition.time-unit": "WEEK"}, "not one of HOUR, DAY, MONTH, QUARTER, YEAR"),
])
def test_settings_a_table_cannot_honour_are_refused_at_create(keys, options, words):
    with pytest.raises(InvalidInput, match=words):
        _descriptor(keys, **options)
