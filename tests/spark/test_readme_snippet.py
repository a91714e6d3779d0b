"""The Spark snippet of docs/spark.md runs as written (after the README's tour): it reads, filters, and writes a
partial row with ``option("columns", ...)`` that keeps the other columns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import flightstore

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md").read_text() + (ROOT / "docs" / "spark.md").read_text()


def _block(marker: str) -> str:
    [code] = [b for b in re.findall(r"```python\n(.*?)```", PAGES, flags=re.S) if marker in b]
    return code


def test_readme_spark_snippet(spark, server) -> None:
    exec(compile(_block("CREATE TABLE IF NOT EXISTS").replace("grpc://127.0.0.1:8815", server.uri),
                 "README.md", "exec"), {})
    scope: dict = {}
    snippet = _block("SparkSession").replace("grpc://127.0.0.1:8815", server.uri)
    exec(compile(snippet, "docs/spark.md", "exec"), scope)
    assert scope["spark"] is spark  # getOrCreate: the test session
    assert scope["df"].count() == 2
    with flightstore.connect(server.uri) as conn:
        rows = conn.table("shop.orders").scan().sort_by("order_id").to_pylist()
    assert [(r["order_id"], r["status"], r["amount"]) for r in rows] == [
        (1, "paid", 5.5), (2, "returned", 7.0)]
    assert scope["changes"].isStreaming
