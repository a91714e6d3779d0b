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
