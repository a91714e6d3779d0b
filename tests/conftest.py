"""Shared fixtures: a fresh embedded store per test, and a real server (tests/server/conftest.py)
for any test module."""

from __future__ import annotations

import pytest

from flightstore.store import Store
from tests.server.conftest import server  # noqa: F401

__all__ = ["server", "store"]


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "data") as s:
        yield s
