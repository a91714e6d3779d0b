"""Shared fixtures: a fresh embedded store per test, and a real server (tests/server/conftest.py)
for any test module."""

from __future__ import annotations

import pytest

from flightstore.store import Store
from tests.server.conftest import server  # noqa: F401

__all__ = ["server", "store"]


@pytest.fixture
def store(tmp_path):
    # Durability (fsync) is not what these tests test: tests/log/test_durability.py does.
    with Store(tmp_path / "data", fsync=False) as s:
        yield s


# The longest files, longest first (`make test` lists the slowest tests at its end). Under
# `--dist loadfile --no-loadscope-reorder` workers take files in this order: a long file taken last
# would keep one worker busy long after the others ran out of work.
LONGEST_FIRST = [
    "tests/cluster/test_jepsen.py", "tests/lake/test_crash.py", "tests/sqlalchemy_dialect/test_superset.py",
    "tests/cluster/test_data_path.py", "tests/kv/test_snapshot_crash.py", "tests/cluster/test_lake.py",
    "tests/spark/test_backfill.py", "tests/cluster/test_replication.py", "tests/spark/test_read.py",
    "tests/cluster/test_failover_scenarios.py", "tests/spark/test_tiering_job.py",
]


def pytest_collection_modifyitems(config, items) -> None:
    """Files in ``LONGEST_FIRST`` order, then the other files with a slow test, then the rest; a file's
    tests stay together and in their order (some build on a module fixture's state)."""
    rank: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path in LONGEST_FIRST:
            rank[path] = LONGEST_FIRST.index(path)
        elif item.get_closest_marker("slow") is not None:
            rank[path] = len(LONGEST_FIRST)
        else:
            rank.setdefault(path, len(LONGEST_FIRST) + 1)
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])
