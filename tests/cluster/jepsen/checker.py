"""The checker of the Jepsen-style test: the history of a run and the cluster's final state in, a
verdict out (``{"valid": bool, "problems": {check: [...]}, "stats": {...}}``).

Final state (read once every server is back and every ISR is full; see ``test_jepsen.py``):
``lg_rows`` ``[[w, s, i]]``, ``lg_changelog`` / ``pk_changelog`` ``[[bucket, offset, change, *cols]]``,
``pk_rows`` ``[[k, a, b, op]]``, ``agg_rows`` ``[[g, v]]``, ``agg_changelog`` ``[[g, v, change]]``,
``end_offsets`` ``{table: {bucket: end}}``.

Checks (each problem names what it found):

* **log rows once**: every row of an acknowledged ``lg`` batch is in the final log exactly once,
  a row of an unknown-outcome batch at most once, of a failed (never sent) batch never, and no row
  comes from nowhere;
* **changelog well formed**: per bucket the offsets are contiguous from 0 and unique;
  the fold of the pk (and agg) changelog equals the final table (KV == fold of the log);
* **pk model**: per key (each key has one writer, so its operations apply in sequence order) the
  changelog's after-images name operations in increasing sequence, each once, each acknowledged or
  of unknown outcome, each image equal to the model's (:func:`workload.apply_pk`) applied to the
  image before; every acknowledged update is there; every acknowledged delete removed the key;
* **aggregation sums**: per group, final sum - acknowledged amounts is a sum of a subset of the
  unknown-outcome amounts (exact subset sums while there are few unknowns);
* **reads never lost**: every row a reader saw (pk scan and lookup images, agg sums, lg rows, pk
  ``$changelog`` rows) is in the final history: an after-image of the final changelog, a final lg
  row, the final changelog row at the same bucket and offset;
* **subscriptions once**: per table and bucket the delivered offsets, in delivery order, are
  exactly 0, 1, 2, ... up to the final end (each change once, none lost, none out of order), each
  row equal to the final changelog's at its offset.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from tests.cluster.jepsen.workload import apply_pk

__all__ = ["check"]

MAX_SHOWN = 20        # problems listed per check (the count is always given)
MAX_SUBSET = 22       # unknown amounts per group for which subset sums are enumerated


class Problems:
    def __init__(self) -> None:
        self.found: dict[str, list] = defaultdict(list)
        self.counts: Counter = Counter()

    def add(self, check: str, detail: Any) -> None:
        self.counts[check] += 1
        if len(self.found[check]) < MAX_SHOWN:
            self.found[check].append(detail)


def _ops(history: Iterable[dict]) -> dict[tuple[str, int], dict]:
    """Every invoked write by (writer, seq), with its outcome (no completion: unknown)."""
    ops: dict[tuple[str, int], dict] = {}
    for event in history:
        key = (event.get("writer"), event.get("seq"))
        if event["ev"] == "invoke":
            ops[key] = {**event["op"], "outcome": "unknown", "proc": event["proc"], "t": event["t"]}
        elif event["ev"] == "complete" and key in ops:
            ops[key]["outcome"] = event["outcome"]
            ops[key]["t1"] = event["t"]
    return ops


def check(history: list[dict], final: dict[str, Any]) -> dict[str, Any]:
    """The verdict of one run (see the module docstring)."""
    problems = Problems()
    ops = _ops(history)
    stats: dict[str, Any] = {"ops": Counter(f"{o['table']}:{o['outcome']}" for o in ops.values())}
    _check_log(ops, final, problems, stats)
    changelogs = _check_changelogs(final, problems)
    images = _check_pk(ops, final, changelogs, problems, stats)
    sums = _check_agg(ops, final, problems, stats)
    _check_reads(history, final, changelogs, images, sums, problems, stats)
    _check_subscriptions(history, final, changelogs, problems, stats)
    stats["ops"] = dict(stats["ops"])
    stats["nemesis"] = dict(Counter(e["what"] for e in history if e["ev"] == "nemesis"))
    return {"valid": not problems.counts, "problem_counts": dict(problems.counts),
            "problems": dict(problems.found), "stats": stats}


# ---- the log table --------------------------------------------------------------------------
def _check_log(ops: dict, final: dict, problems: Problems, stats: dict) -> None:
    present = Counter(tuple(r) for r in final["lg_rows"])
    for row, count in present.items():
        if count > 1:
            problems.add("lg: row more than once", {"row": list(row), "count": count})
    expected: set[tuple] = set()
    unknown_applied = 0
    for (writer, seq), op in ops.items():
        if op["table"] != "lg":
            continue
        rows = [(w, s, i) for w, s, i in zip(op["rows"]["w"], op["rows"]["s"], op["rows"]["i"])]
        expected.update(rows)
        found = [r for r in rows if r in present]
        if op["outcome"] == "ok" and len(found) != len(rows):
            problems.add("lg: acknowledged row lost", {"writer": writer, "seq": seq, "via": op["via"],
                                                       "missing": [list(r) for r in rows if r not in present]})
        if op["outcome"] == "fail" and found:
            problems.add("lg: row of a batch never sent", {"writer": writer, "seq": seq, "rows": found})
        if op["outcome"] == "unknown" and found:
            unknown_applied += 1
    for row in present:
        if row not in expected:
            problems.add("lg: row nobody wrote", {"row": list(row)})
    stats["lg_rows"] = len(final["lg_rows"])
    stats["lg_unknown_applied"] = unknown_applied


# ---- changelogs -----------------------------------------------------------------------------
def _check_changelogs(final: dict, problems: Problems) -> dict[str, dict[tuple[int, int], list]]:
    """Per table, ``(bucket, offset) -> row`` of the final changelog; offsets checked contiguous."""
    out: dict[str, dict[tuple[int, int], list]] = {}
    for table in ("lg", "pk"):
        rows = final[f"{table}_changelog"]
        by_offset: dict[tuple[int, int], list] = {}
        for row in rows:
            key = (int(row[0]), int(row[1]))
            if key in by_offset:
                problems.add(f"{table}: changelog offset twice", {"bucket": key[0], "offset": key[1]})
            by_offset[key] = row
        ends = final["end_offsets"][table]
        for bucket, end in ends.items():
            have = sorted(o for b, o in by_offset if b == int(bucket))
            if have != list(range(int(end))):
                missing = sorted(set(range(int(end))) - set(have))
                problems.add(f"{table}: changelog offsets not contiguous",
                             {"bucket": int(bucket), "end": int(end), "missing": missing[:20],
                              "beyond": [o for o in have if o >= int(end)][:20]})
        out[table] = by_offset
    return out


# ---- the primary-key table ------------------------------------------------------------------
def _image(row: list) -> dict:
    return {"a": row[4], "b": row[5], "op": row[6]}


def _check_pk(ops: dict, final: dict, changelogs: dict, problems: Problems, stats: dict) -> dict[int, list]:
    """The pk model check; returns every after-image per key (for the reads check)."""
    events: dict[int, list[list]] = defaultdict(list)
    for (_, _), row in sorted(changelogs["pk"].items()):
        events[int(row[3])].append(row)
    pk_ops: dict[int, dict] = {}   # op id -> op
    by_key: dict[int, list[tuple[int, dict]]] = defaultdict(list)  # key -> [(seq, op)]
    for (writer, seq), op in ops.items():
        if op["table"] != "pk":
            continue
        ident = op["proc"] * 1_000_000 + seq
        op = {**op, "seq": seq, "id": ident, "writer": writer}
        pk_ops[ident] = op
        for key in op["rows"]["k"]:
            by_key[int(key)].append((seq, op))
    final_rows = {int(r[0]): {"a": r[1], "b": r[2], "op": r[3]} for r in final["pk_rows"]}
    images: dict[int, list] = defaultdict(list)
    unknown_applied = 0
    for key in sorted(set(events) | set(by_key) | set(final_rows)):
        state: dict | None = None
        puts: list[tuple[int, int]] = []        # (seq, position) of each after-image
        deletes: list[int] = []                 # positions of -D events
        for position, row in enumerate(events.get(key, [])):
            change = row[2]
            if change in ("-U", "-D"):
                if state is None or _image(row) != state:
                    problems.add("pk: before-image differs from the state", {"key": key, "row": row, "state": state})
                if change == "-D":
                    state = None
                    deletes.append(position)
                continue
            image = _image(row)
            op = pk_ops.get(image["op"])
            if op is None or key not in op["rows"]["k"] or op["kind"] == "delete":
                problems.add("pk: after-image of no operation on this key", {"key": key, "row": row})
                state = image
                continue
            if op["outcome"] == "fail":
                problems.add("pk: after-image of a write never sent", {"key": key, "row": row})
            if op["outcome"] == "unknown":
                unknown_applied += 1
            if puts and op["seq"] <= puts[-1][0]:
                problems.add("pk: operation applied twice or out of order",
                             {"key": key, "row": row, "after_seq": puts[-1][0]})
            expected = apply_pk(state if change == "+U" else None, op["kind"], op["id"])
            if change == "+I" and state is not None:
                problems.add("pk: +I over a present row", {"key": key, "row": row, "state": state})
            if image != expected:
                problems.add("pk: image differs from the model", {"key": key, "row": row, "expected": expected})
            puts.append((op["seq"], position))
            state = image
            images[key].append(image)
        if state != final_rows.get(key):
            problems.add("pk: final row differs from the fold of the changelog",
                         {"key": key, "fold": state, "final": final_rows.get(key)})
        seqs_put = {s for s, _ in puts}
        for seq, op in by_key.get(key, []):
            if op["outcome"] != "ok":
                continue
            if op["kind"] != "delete":
                if seq not in seqs_put:
                    problems.add("pk: acknowledged update lost", {"key": key, "writer": op["writer"], "seq": seq,
                                                                  "kind": op["kind"], "via": op["via"]})
                continue
            # an acknowledged delete: after the last image written before it, a -D came (or none was there)
            before = [p for s, p in puts if s < seq]
            after = [p for s, p in puts if s > seq]
            if before and not any(before[-1] < d < (after[0] if after else 1 << 60) for d in deletes):
                problems.add("pk: acknowledged delete lost", {"key": key, "writer": op["writer"], "seq": seq})
    stats["pk_keys"] = len(final_rows)
    stats["pk_unknown_applied"] = unknown_applied
    return images


# ---- the aggregation table ------------------------------------------------------------------
def _subset_sums(values: list[int]) -> set[int]:
    sums = {0}
    for value in values:
        sums |= {s + value for s in sums}
    return sums


def _check_agg(ops: dict, final: dict, problems: Problems, stats: dict) -> dict[int, set]:
    """The sums check; returns every sum each group had (after-images of its changelog)."""
    acked: Counter = Counter()
    unknown: dict[int, list[int]] = defaultdict(list)
    for op in ops.values():
        if op["table"] != "agg" or op["outcome"] == "fail":
            continue
        for group, value in zip(op["rows"]["g"], op["rows"]["v"]):
            if op["outcome"] == "ok":
                acked[int(group)] += int(value)
            else:
                unknown[int(group)].append(int(value))
    totals = {int(g): int(v) for g, v in final["agg_rows"]}
    for group in sorted(set(acked) | set(totals) | set(unknown)):
        extra = totals.get(group, 0) - acked.get(group, 0)
        amounts = unknown.get(group, [])
        if len(amounts) <= MAX_SUBSET:
            fits = extra in _subset_sums(amounts)
        else:
            fits = 0 <= extra <= sum(amounts)
        if not fits:
            problems.add("agg: sum is not the acknowledged amounts plus some unknown ones",
                         {"group": group, "final": totals.get(group), "acknowledged": acked.get(group, 0),
                          "unknown": amounts})
    seen: dict[int, set] = defaultdict(set)
    state: dict[int, int] = {}
    for g, v, change in final["agg_changelog"]:
        if change in ("+I", "+U"):
            seen[int(g)].add(int(v))
            state[int(g)] = int(v)
        elif change == "-D":
            state.pop(int(g), None)
    if state != totals:
        problems.add("agg: final table differs from the fold of its changelog", {"fold": state, "final": totals})
    stats["agg_unknown"] = sum(len(v) for v in unknown.values())
    return seen


# ---- reads and subscriptions ----------------------------------------------------------------
def _check_reads(history: list[dict], final: dict, changelogs: dict, images: dict, sums: dict,
                 problems: Problems, stats: dict) -> None:
    lg = {tuple(r) for r in final["lg_rows"]}
    reads = Counter()
    for event in history:
        if event["ev"] != "read":
            continue
        reads[event["kind"]] += 1
        table = event["table"]
        if event.get("changelog"):
            for row in event["rows"]:
                known = changelogs["pk"].get((int(row[0]), int(row[1])))
                if known != row:
                    problems.add("read: a $changelog row differs from the final changelog",
                                 {"read": row, "final": known, "via": event["via"], "t": event["t"]})
        elif table == "pk":
            for k, a, b, op in event["rows"]:
                if {"a": a, "b": b, "op": op} not in images.get(int(k), []):
                    problems.add("read: a pk row that the final changelog never had",
                                 {"row": [k, a, b, op], "kind": event["kind"], "via": event["via"], "t": event["t"]})
        elif table == "lg":
            for row in event["rows"]:
                if tuple(row) not in lg:
                    problems.add("read: an lg row that is not in the final log",
                                 {"row": row, "via": event["via"], "t": event["t"]})
        elif table == "agg":
            for g, v in event["rows"]:
                if int(v) not in sums.get(int(g), set()):
                    problems.add("read: an agg sum that the final changelog never had",
                                 {"group": g, "sum": v, "via": event["via"], "t": event["t"]})
    stats["reads"] = dict(reads)
    stats["read_errors"] = sum(1 for e in history if e["ev"] == "read_error")


def _check_subscriptions(history: list[dict], final: dict, changelogs: dict, problems: Problems,
                         stats: dict) -> None:
    delivered: dict[tuple[str, int], list[int]] = defaultdict(list)
    for event in history:
        if event["ev"] != "sub":
            continue
        table = event["table"]
        for row in event["rows"]:
            bucket, offset = int(row[0]), int(row[1])
            delivered[(table, bucket)].append(offset)
            known = changelogs[table].get((bucket, offset))
            if known is None or _comparable(table, known) != _comparable(table, row):
                problems.add(f"subscription: a {table} row differs from the final changelog",
                             {"delivered": row, "final": known, "t": event["t"]})
    for table in ("lg", "pk"):
        for bucket, end in final["end_offsets"][table].items():
            got = delivered.get((table, int(bucket)), [])
            if got != list(range(len(got))):
                duplicates = [o for o, n in Counter(got).items() if n > 1]
                problems.add("subscription: offsets not delivered once and in order",
                             {"table": table, "bucket": int(bucket), "delivered": len(got),
                              "duplicates": duplicates[:20], "first_break": next(
                                  (i for i, o in enumerate(got) if o != i), None)})
            elif len(got) < int(end):
                problems.add("subscription: did not deliver every change",
                             {"table": table, "bucket": int(bucket), "delivered": len(got), "end": int(end)})
    stats["subscribed_rows"] = {f"{t}:{b}": len(v) for (t, b), v in sorted(delivered.items())}
    stats["subscriptions"] = sum(1 for e in history if e["ev"] == "subscribe")


def _comparable(table: str, row: list) -> list:
    """A changelog row as both sides have it: ``[bucket, offset, change, *columns]``."""
    return [int(row[0]), int(row[1]), row[2], *row[3:]]
