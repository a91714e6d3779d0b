"""What the Jepsen-style test writes and reads: three tables, the operations on them, and the model
of each operation's effect (shared by the client processes, which generate operations, and the
checker, which folds them).

Tables (3 buckets each, replication factor 3, min in-sync replicas 2):

* ``lg``: a log table ``(k, w, s, i)`` bucketed by ``k``: a batch of writer ``w`` at sequence ``s``
  holds rows ``i = 0..n-1`` with random ``k``, so it spreads over buckets (and leaders). Every row
  is identified by ``(w, s, i)``: it must be in the final log once if acknowledged, at most once
  otherwise.
* ``pk``: a primary-key table ``(k, a0, b0, op0, a1, b1, op1, ...)``. Writer process ``p`` owns
  its own keys (so the order of the operations on a key is its sequence order) and its own
  columns ``a<p>, b<p>, op<p>`` (partial updates claim their columns for their writer, so two
  writers cannot share them). Operations on 1-4 keys: an upsert of all its columns (``a = op``,
  ``b = str(op)``), a partial update of ``a`` or of ``b`` (with ``op``), a delete of whole rows.
  ``op`` is the operation's unique id, so every after-image in the changelog names the
  operation that produced it. :func:`pk_row` reads a row as ``[k, a, b, op]`` of its owner.
* ``agg``: an aggregation table ``(g, v)`` with ``sum`` on ``v``; writers add random amounts to a
  few shared groups. The final sum of a group is the acknowledged amounts plus a subset of the
  unknown-outcome ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["DDL", "GROUPS", "KEYS_PER_WRITER", "Op", "PK_COLUMNS", "WRITERS", "apply_pk", "generate", "op_id",
           "op_table", "pk_keys", "pk_row"]

BUCKETS = 3
GROUPS = 8
KEYS_PER_WRITER = 12
WRITERS = 3
PK_COLUMNS = ["k"] + [f"{c}{p}" for p in range(WRITERS) for c in ("a", "b", "op")]

DDL = {
    "lg": f"CREATE TABLE lg (k BIGINT, w STRING, s BIGINT, i BIGINT) "
          f"WITH ('bucket.num' = '{BUCKETS}', 'bucket.key' = 'k')",
    "pk": "CREATE TABLE pk (k BIGINT, "
          + "".join(f"a{p} BIGINT, b{p} STRING, op{p} BIGINT, " for p in range(WRITERS))
          + f"PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '{BUCKETS}')",
    "agg": f"CREATE TABLE agg (g BIGINT, v BIGINT, PRIMARY KEY (g) NOT ENFORCED) "
           f"WITH ('bucket.num' = '{BUCKETS}', 'table.merge-engine' = 'aggregation', 'fields.v.agg' = 'sum')",
}


@dataclass(frozen=True)
class Op:
    """One batch of one writer: ``kind`` is ``append`` (lg), ``upsert`` / ``set_a`` / ``set_b`` /
    ``delete`` (pk) or ``add`` (agg); ``rows`` its rows as plain values (JSON-able)."""

    table: str
    kind: str
    rows: dict[str, list]
    via: str  # "client" (the Python client's direct-to-leader path), "server" (any server forwards), "sql"

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "kind": self.kind, "rows": self.rows, "via": self.via}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Op:
        return cls(data["table"], data["kind"], data["rows"], data["via"])

    @property
    def columns(self) -> list[str] | None:
        """The columns of a pk write (None: whole rows, or keys of a delete)."""
        return None if self.table != "pk" or self.kind == "delete" else list(self.rows)

    def data(self) -> pa.Table:
        if self.table == "lg":
            return pa.table({"k": pa.array(self.rows["k"], pa.int64()), "w": pa.array(self.rows["w"], pa.string()),
                             "s": pa.array(self.rows["s"], pa.int64()), "i": pa.array(self.rows["i"], pa.int64())})
        if self.table == "agg":
            return pa.table({"g": pa.array(self.rows["g"], pa.int64()), "v": pa.array(self.rows["v"], pa.int64())})
        return pa.table({name: pa.array(values, pa.string() if name[0] == "b" else pa.int64())
                         for name, values in self.rows.items()})


def op_id(proc: int, seq: int) -> int:
    """A unique id per (writer process, sequence): the ``op`` column of pk rows."""
    return proc * 1_000_000 + seq


def pk_keys(proc: int) -> list[int]:
    """The pk keys writer process ``proc`` owns (no other process writes them)."""
    return [proc * 1000 + n for n in range(KEYS_PER_WRITER)]


def op_table(rng: random.Random) -> str:
    return rng.choice(("lg", "pk", "pk", "agg"))


def generate(rng: random.Random, table: str, proc: int, writer: str, seq: int) -> Op:
    """The next operation of ``writer`` (process ``proc``) at sequence ``seq`` on ``table``."""
    if table == "lg":
        n = rng.randint(1, 6)
        via = rng.choice(("client", "client", "server", "sql"))
        return Op("lg", "append", {"k": [rng.randrange(1 << 40) for _ in range(n)], "w": [writer] * n,
                                   "s": [seq] * n, "i": list(range(n))}, via)
    via = rng.choice(("client", "server"))
    if table == "agg":
        groups = rng.sample(range(GROUPS), rng.randint(1, 3))
        return Op("agg", "add", {"g": groups, "v": [rng.randint(1, 1_000_000) for _ in groups]}, via)
    keys = rng.sample(pk_keys(proc), rng.randint(1, 4))
    ident = op_id(proc, seq)
    kind = rng.choice(("upsert", "upsert", "set_a", "set_b", "delete"))
    n = len(keys)
    a, b, o = f"a{proc}", f"b{proc}", f"op{proc}"
    if kind == "upsert":
        rows = {"k": keys, a: [ident] * n, b: [str(ident)] * n, o: [ident] * n}
    elif kind == "set_a":
        rows = {"k": keys, a: [ident] * n, o: [ident] * n}
    elif kind == "set_b":
        rows = {"k": keys, b: [str(ident)] * n, o: [ident] * n}
    else:
        rows = {"k": keys}
    return Op("pk", kind, rows, via)


def pk_row(row: dict[str, Any]) -> list:
    """``[k, a, b, op]`` of a pk row (a dict of :data:`PK_COLUMNS`) from its owner's columns; a
    value in another writer's columns (which nobody writes on this key) makes ``op`` -1, which
    names no operation."""
    k = int(row["k"])
    owner = k // 1000
    others = [row[f"{c}{p}"] for p in range(WRITERS) if p != owner for c in ("a", "b", "op")]
    op = row[f"op{owner}"] if all(v is None for v in others) else -1
    return [k, row[f"a{owner}"], row[f"b{owner}"], op]


def apply_pk(state: dict | None, kind: str, ident: int) -> dict | None:
    """The pk row of one key after operation ``ident`` of ``kind`` (None: absent): the last-row
    merge engine, a partial update of an absent key inserting a row with the other columns null."""
    if kind == "delete":
        return None
    base = dict(state) if state is not None else {"a": None, "b": None, "op": None}
    if kind == "upsert":
        return {"a": ident, "b": str(ident), "op": ident}
    if kind == "set_a":
        base.update(a=ident, op=ident)
    else:
        base.update(b=str(ident), op=ident)
    return base
