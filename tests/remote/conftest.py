"""Fixtures of the remote storage tests: ``remote.data.dir`` on a local path or on a real S3 API
endpoint (moto's server, shared with the lake tests). Their tables are in ``tables.py``."""

from __future__ import annotations

import os

import pytest

from tests.lake.conftest import moto  # noqa: F401 - the session's moto S3 server, as a fixture here


@pytest.fixture
def local_remote(tmp_path) -> dict[str, str]:
    """Server options putting remote storage in a local directory."""
    return {"remote.data.dir": str(tmp_path / "remote")}


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def remote_options(request, tmp_path) -> dict[str, str]:
    """Server options putting remote storage in a local directory, then on moto's S3 server."""
    if request.param == "local":
        return {"remote.data.dir": str(tmp_path / "remote")}
    server = request.getfixturevalue("moto")
    bucket = f"remote-{os.getpid()}-{abs(hash(str(tmp_path))) % 10**8}"
    server.create_bucket(bucket)
    return {"remote.data.dir": f"s3://{bucket}/fs", "remote.s3.endpoint": server.endpoint,
            "remote.s3.access-key-id": "testing", "remote.s3.secret-access-key": "testing",
            "remote.s3.region": "us-east-1"}
