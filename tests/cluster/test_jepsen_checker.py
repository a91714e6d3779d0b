"""The Jepsen-style checker on small made-up histories: a clean one passes, and each anomaly it
exists to find (a lost or duplicated write, a read of a lost row, a subscription gap) is named."""

from __future__ import annotations

import copy

from tests.cluster.jepsen.checker import check
from tests.cluster.jepsen.client_process import bucket_of


def _op(proc: int, writer: str, seq: int, op: dict, outcome: str) -> list[dict]:
    return [{"ev": "invoke", "t": 1.0, "proc": proc, "writer": writer, "seq": seq, "op": op},
            {"ev": "complete", "t": 2.0, "proc": proc, "writer": writer, "seq": seq, "outcome": outcome}]


def _pk_change(offset: int, change: str, key: int, op: int | None, a: int | None, b: str | None) -> list:
    return [bucket_of([key])[0], offset, change, key, a, b, op]


def _clean() -> tuple[list[dict], dict]:
    """Writer 0: lg batch 0 (ok), pk upsert 0 then set_b 1 on key 1 (ok), a delete of key 2 (2,
    unknown), agg +5 (ok) and +7 (unknown, applied); a reader and a subscription that saw it all."""
    history = []
    history += _op(0, "p0-lg", 0, {"table": "lg", "kind": "append", "via": "client",
                                   "rows": {"k": [10, 11], "w": ["p0-lg"] * 2, "s": [0, 0], "i": [0, 1]}}, "ok")
    history += _op(0, "p0-pk", 0, {"table": "pk", "kind": "upsert", "via": "client",
                                   "rows": {"k": [1], "a0": [0], "b0": ["0"], "op0": [0]}}, "ok")
    history += _op(0, "p0-pk", 1, {"table": "pk", "kind": "set_b", "via": "server",
                                   "rows": {"k": [1], "b0": ["1"], "op0": [1]}}, "ok")
    history += _op(0, "p0-pk", 2, {"table": "pk", "kind": "delete", "via": "server", "rows": {"k": [2]}}, "unknown")
    history += _op(0, "p0-agg", 0, {"table": "agg", "kind": "add", "via": "client",
                                    "rows": {"g": [3], "v": [5]}}, "ok")
    history += _op(0, "p0-agg", 1, {"table": "agg", "kind": "add", "via": "client",
                                    "rows": {"g": [3], "v": [7]}}, "unknown")
    lg_changes = [[bucket_of([10])[0], 0, "+A", 10, "p0-lg", 0, 0], [bucket_of([11])[0], 0, "+A", 11, "p0-lg", 0, 1]]
    if lg_changes[0][0] == lg_changes[1][0]:
        lg_changes[1][1] = 1
    pk_changes = [_pk_change(0, "+I", 1, 0, 0, "0"), _pk_change(1, "-U", 1, 0, 0, "0"),
                  _pk_change(2, "+U", 1, 1, 0, "1")]
    history.append({"ev": "read", "t": 3.0, "kind": "pk_scan", "table": "pk", "via": "s1", "rows": [[1, 0, "0", 0]]})
    history.append({"ev": "read", "t": 3.0, "kind": "agg_scan", "table": "agg", "via": "s1", "rows": [[3, 5]]})
    history.append({"ev": "read", "t": 3.0, "kind": "lg_scan", "table": "lg", "via": "s2", "rows": [["p0-lg", 0, 1]]})
    history.append({"ev": "sub", "t": 3.0, "table": "pk", "via": "s1", "rows": copy.deepcopy(pk_changes)})
    history.append({"ev": "sub", "t": 3.0, "table": "lg", "via": "s1", "rows": copy.deepcopy(lg_changes)})
    ends = {}
    for table, changes in (("lg", lg_changes), ("pk", pk_changes)):
        ends[table] = {str(b): 0 for b in range(3)}
        for row in changes:
            ends[table][str(row[0])] = max(ends[table][str(row[0])], row[1] + 1)
    final = {"lg_rows": [["p0-lg", 0, 0], ["p0-lg", 0, 1]], "lg_changelog": lg_changes,
             "pk_rows": [[1, 0, "1", 1]], "pk_changelog": pk_changes,
             "agg_rows": [[3, 12]], "agg_changelog": [[3, 5, "+I"], [3, 5, "-U"], [3, 12, "+U"]],
             "end_offsets": ends}
    return history, final


def test_a_clean_history_is_valid():
    history, final = _clean()
    verdict = check(history, final)
    assert verdict["valid"], verdict["problems"]


def test_each_anomaly_is_named():
    cases = {
        "lg: acknowledged row lost": lambda h, f: f["lg_rows"].pop(),
        "lg: row more than once": lambda h, f: f["lg_rows"].append(["p0-lg", 0, 0]),
        "pk: acknowledged update lost": lambda h, f: (f["pk_changelog"].__delitem__(slice(1, 3)),
                                                      f.__setitem__("pk_rows", [[1, 0, "0", 0]])),
        "pk: final row differs from the fold of the changelog": lambda h, f: f.__setitem__("pk_rows", []),
        "agg: sum is not the acknowledged amounts plus some unknown ones":
            lambda h, f: f.__setitem__("agg_rows", [[3, 10]]),
        "read: a pk row that the final changelog never had":
            lambda h, f: h.append({"ev": "read", "t": 4.0, "kind": "pk_lookup", "table": "pk", "via": "s3",
                                   "rows": [[1, 9, "9", 9]]}),
        "read: an agg sum that the final changelog never had":
            lambda h, f: h.append({"ev": "read", "t": 4.0, "kind": "agg_scan", "table": "agg", "via": "s3",
                                   "rows": [[3, 6]]}),
        "subscription: offsets not delivered once and in order":
            lambda h, f: next(e for e in h if e["ev"] == "sub" and e["table"] == "pk")["rows"].pop(1),
    }
    for name, damage in cases.items():
        history, final = _clean()
        damage(history, final)
        verdict = check(history, final)
        assert not verdict["valid"] and name in verdict["problem_counts"], (name, verdict["problem_counts"])
