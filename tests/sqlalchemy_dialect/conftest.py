"""The real-server fixture of tests/server, for the dialect and Superset tests."""

from tests.server.conftest import server  # noqa: F401
