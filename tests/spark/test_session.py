"""The tests' Spark session itself: its Python workers import the installed (compiled) pyspark,
not Spark's ``pyspark.zip`` (:mod:`flightstore_spark.spark_home`, which tests/spark/conftest.py uses)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyspark
from flightstore_spark.spark_home import compiled_pyspark_home, use_compiled_pyspark
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition


def _pyspark_file() -> str:
    import pyspark
    return pyspark.__file__


class _WhereReader(DataSourceStreamReader):
    """Its offsets say where the streaming source runner (a new Python process per query)
    imported pyspark from."""

    def initialOffset(self) -> dict:
        return {"pyspark": ""}

    def latestOffset(self) -> dict:
        return {"pyspark": _pyspark_file()}

    def partitions(self, start: dict, end: dict) -> list:
        return [InputPartition(0)]

    def read(self, partition):
        yield (_pyspark_file(),)


class _WhereSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pyspark_where"

    def schema(self) -> str:
        return "file string"

    def streamReader(self, schema):
        return _WhereReader()


def test_python_workers_import_the_compiled_pyspark_not_the_zip(spark, tmp_path) -> None:
    installed = pyspark.__file__
    assert ".zip" not in installed
    # an executor's Python worker (the daemon's)
    assert spark.sparkContext.parallelize([0], 1).map(lambda _: _pyspark_file()).collect() == [installed]
    # a streaming query's source runner on the driver, and its read task
    spark.dataSource.register(_WhereSource)
    query = (spark.readStream.format("pyspark_where").load().writeStream.format("memory")
             .queryName("pyspark_where").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None
    ends = [json.loads(progress["sources"][0]["endOffset"]) for progress in query.recentProgress
            if progress["sources"] and progress["sources"][0]["endOffset"]]
    assert ends and all(end == {"pyspark": installed} for end in ends), ends
    assert [row.file for row in spark.sql("SELECT file FROM pyspark_where").collect()] == [installed]


def test_the_pipelines_use_the_compiled_pyspark_unless_spark_home_names_an_installation(monkeypatch, tmp_path):
    monkeypatch.delenv("SPARK_HOME", raising=False)
    home = Path(use_compiled_pyspark())
    assert str(home) == compiled_pyspark_home() == os.environ["SPARK_HOME"]
    installed = Path(pyspark.__file__).parent
    assert (home / "jars").resolve() == (installed / "jars").resolve()
    assert (home / "bin" / "spark-submit").is_file()
    assert not (home / "python").exists()  # no pyspark.zip for the workers to find first
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))  # a Spark installation of the user's
    assert use_compiled_pyspark() == str(tmp_path)
