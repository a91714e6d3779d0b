"""Shared fixtures: a fresh embedded store per test."""

from __future__ import annotations

import pytest

from flightstore.store import Store


@pytest.fixture
def store(tmp_path):
    # Durability (fsync) is not what these tests test: tests/log/test_durability.py does.
    with Store(tmp_path / "data", fsync=False) as s:
        yield s
