"""Shared fixtures: a fresh embedded store per test, and a real server (tests/server/conftest.py)
for any test module."""

from __future__ import annotations

import pytest

from flightstore.store import Store
from tests import client_venvs
from tests.server.conftest import server  # noqa: F401

__all__ = ["server", "store"]


@pytest.fixture
def store(tmp_path):
    # Durability (fsync) is not what these tests test: tests/log/test_durability.py does.
    with Store(tmp_path / "data", fsync=False) as s:
        yield s


# The longest files, longest first (`make test` lists the slowest tests at its end). Under
# `--dist loadfile --no-loadscope-reorder` workers take files in this order: a long file taken last
# would keep one worker busy long after the others ran out of work. Superset's file comes a few
# files in, not first: by then the background build of its venv (tests/client_venvs.py) is done.
LONGEST_FIRST = [
    "tests/cluster/test_jepsen.py", "tests/lake/test_crash.py", "tests/spark/test_backfill.py",
    "tests/cluster/test_failover_scenarios.py", "tests/cluster/test_data_path.py",
    "tests/sqlalchemy_dialect/test_superset.py", "tests/spark/test_delta_join.py",
    "tests/server/test_bounded_changelog.py", "tests/cluster/test_servers.py", "tests/kv/test_snapshot_crash.py",
    "tests/cluster/test_lake.py", "tests/cluster/test_cluster_upkeep.py", "tests/server/test_harlequin.py",
    "tests/spark/test_aggregation.py", "tests/cluster/test_replication.py", "tests/spark/test_read.py",
    "tests/test_alter_crash.py", "tests/spark/test_tiering_job.py", "tests/server/test_logins.py",
    "tests/spark/test_write.py",
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


# The client venvs the collected tests need, built in the background from the moment the collection
# is known (tests/client_venvs.py): by the main process, once, whether or not xdist runs the tests.
_venv_builder: list = []


def _build_client_venvs(nodeids) -> None:
    if not _venv_builder:
        _venv_builder.append(client_venvs.start_building(client_venvs.needed(nodeids)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    _build_client_venvs(ids)


def pytest_collection_finish(session) -> None:
    if not hasattr(session.config, "workerinput"):  # not an xdist worker: the tests run here
        _build_client_venvs(item.nodeid for item in session.items)


def pytest_sessionfinish(session) -> None:
    for process in _venv_builder:
        client_venvs.stop_building(process)
