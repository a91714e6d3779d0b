"""Shared fixtures: a fresh embedded store per test, and a real server (tests/server/conftest.py)
for any test module."""

from __future__ import annotations

import pytest

from flightstore.store import Store
from tests.server.conftest import server  # noqa: F401

__all__ = ["server", "store"]


def pytest_collection_modifyitems(config, items):
    """``make test`` runs the suite on several pytest-xdist workers with ``--dist loadgroup``: a
    module's tests stay on one worker (its module fixtures are set up once), and every test that
    needs Spark runs on the same worker (one Spark session per run, not one per worker)."""
    for item in items:
        group = "spark" if "spark" in getattr(item, "fixturenames", ()) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def store(tmp_path):
    # Durability (fsync) is not what these tests test: tests/log/test_durability.py does.
    with Store(tmp_path / "data", fsync=False) as s:
        yield s
