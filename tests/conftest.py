"""Shared fixtures: a fresh embedded store per test."""

from __future__ import annotations

import pytest

from flightstore.store import Store


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "data") as s:
        yield s
