"""``server.max-batch-rows`` caps the rows of every Flight message of a result: SQL (routed and
residual), lookups, scans, subscriptions and kept results (issue 20 item 14: it was read by nothing)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import flightstore
from flightstore.errors import InvalidOption
from tests.server.conftest import RunningServer

ROWS = 1000
CAP = 64


@pytest.fixture
def capped(tmp_path):
    running = RunningServer(tmp_path / "data", options={"server.max-batch-rows": str(CAP)})
    yield running
    running.stop()


def _sizes(batches) -> list[int]:
    return [b.num_rows for b in batches if b.num_rows]


def test_every_result_path_cuts_messages_at_max_batch_rows(capped) -> None:
    with flightstore.connect(capped.uri) as conn:
        conn.sql("CREATE TABLE pk (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '1')")
        conn.sql("CREATE TABLE ev (k BIGINT, v STRING)")
        data = pa.table({"k": pa.array(range(ROWS), pa.int64()), "v": [f"v{i % 7}" for i in range(ROWS)]})
        pk, ev = conn.table("pk"), conn.table("ev")
        pk.upsert(data)  # one stored batch of 1000 rows in each table
        ev.append(data)
        results = {
            "routed sql": conn.sql_batches("SELECT k, v FROM ev"),
            "custom sql": conn.sql("SELECT k, v FROM pk").to_batches(),
            "residual sql": conn.sql_batches("SELECT k, v, k * 2 AS d FROM ev ORDER BY k DESC"),
            "lookup": pk.lookup({"k": list(range(ROWS))}).to_batches(),
            "scan": pk.scan_batches(),
            "subscription": list(ev.subscribe("earliest", until=ev.offsets("end"))),
        }
        for what, batches in results.items():
            sizes = _sizes(batches)
            assert sum(sizes) == ROWS, what
            assert max(sizes) <= CAP, f"{what}: messages of {max(sizes)} rows"
        # the lookuper's request of every key is answered in messages of CAP rows: each key still
        # gets exactly its row (from one batch combined of the messages)
        with pk.lookuper(options={"client.lookup.max-batch-size": ROWS, "client.lookup.batch-timeout": "10s"}) as lk:
            futures = [lk.lookup_async(k) for k in range(ROWS)]
            assert [f.result(60).to_pylist() for f in futures] == [[{"k": k, "v": f"v{k % 7}"}] for k in range(ROWS)]


def test_without_the_option_the_same_answer_is_one_message(server) -> None:
    """The contrast the test above needs: the cut comes from the option, not from the data."""
    with flightstore.connect(server.uri) as conn:
        conn.sql("CREATE TABLE ev (k BIGINT)")
        conn.table("ev").append({"k": list(range(ROWS))})
        assert _sizes(conn.sql_batches("SELECT k FROM ev")) == [ROWS]


def test_a_bad_value_is_refused(tmp_path) -> None:
    with pytest.raises(InvalidOption, match="server.max-batch-rows"):
        RunningServer(tmp_path / "data", options={"server.max-batch-rows": "0"})
