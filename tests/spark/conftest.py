"""One local SparkSession for the whole test session (local[2], 2 shuffle partitions, no UI) with the
``flightstore`` format registered, plus a real flightstore server per test, in its own process as a
Spark job meets it (the driver's Python threads in this process would compete with an in-process
server for the GIL on a busy machine)."""

from __future__ import annotations

import os
import sys

import pytest

from tests.server.conftest import ServerProcess

# The JVM options of every Spark driver the tests start: the session's below and the Spark jobs
# a test runs as commands (spark_job_env). A test's data is tiny, so a driver's time is its JVM's
# start: C1 alone compiles (C2's compiler threads take a core for code that never runs long enough
# to pay them back) and the serial collector runs no GC threads. On a loaded 2-core machine a
# session started in 18 s instead of 50, and a start and two small jobs took 36-38 s instead of 77-87.
TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_job_env(**extra: str) -> dict[str, str]:
    """The environment of a Spark job a test starts as a command (``python -m
    flightstore_spark.pipelines...``): this Python for its workers, :data:`TEST_JAVA_OPTIONS` for its
    driver's JVM (PYSPARK_SUBMIT_ARGS: the job builds its own session), the SPARK_HOME of
    :func:`flightstore_spark.spark_home.compiled_pyspark_home`, then ``extra``."""
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYSPARK_SUBMIT_ARGS": f"--driver-java-options '{TEST_JAVA_OPTIONS}' pyspark-shell",
            "SPARK_HOME": _spark_home(), **extra}


def _spark_home() -> str:
    """The tests' SPARK_HOME: pip's pyspark with its workers importing the compiled package, not
    Spark's pyspark.zip (:mod:`flightstore_spark.spark_home`; checked by tests/spark/test_session.py)."""
    from flightstore_spark.spark_home import compiled_pyspark_home

    home = compiled_pyspark_home()
    assert home is not None, "the tests expect pip's pyspark (with its python/lib/pyspark.zip)"
    return home


@pytest.fixture(scope="session")
def spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ["SPARK_HOME"] = _spark_home()
    import flightstore_spark
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("flightstore-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.stopTimeout", "10s")
               .config("spark.python.worker.reuse", "true")
               .config("spark.driver.extraJavaOptions", TEST_JAVA_OPTIONS)
               # a Python worker's connection to its task waits 15 s by default: too short on a
               # busy 2-core machine (CANNOT_OPEN_SOCKET ... timed out)
               .config("spark.python.authenticate.socketTimeout", "120s")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    _start_python_workers(session)
    flightstore_spark.register(session)
    yield session
    session.stop()


def _start_python_workers(session, attempts: int = 5) -> None:
    """Start Spark's Python worker daemon before any test needs it.

    Spark gives a starting Python worker (daemon) a fixed 10 s to connect back to the JVM; on a
    loaded 2-core machine the first start, which imports pyspark, can miss that. The daemon then
    stays up for the session (``spark.python.worker.reuse``), so the retry is needed only here."""
    for attempt in range(attempts):
        try:
            assert session.sparkContext.parallelize([1, 2], 2).map(lambda x: x + 1).collect() == [2, 3]
            return
        except Exception:  # noqa: BLE001 - Py4JJavaError "Python worker failed to connect back"
            if attempt == attempts - 1:
                raise


@pytest.fixture
def server(tmp_path):
    running = ServerProcess(tmp_path / "data")
    yield running
    running.stop()
