"""JDBC escape sequences, as JDBC tools (Tableau's generic JDBC connector, DBeaver) send them.

JDBC defines ``{fn f(...)}`` (a scalar function), ``{d '2024-01-31'}``, ``{t '10:00:00'}`` and
``{ts '2024-01-31 10:00:00'}`` (literals), ``{oj ...}`` (an outer join) and ``{escape '\\'}`` (a
LIKE escape). Drivers may pass them through to the server; :func:`expand` turns them into the
plain SQL they stand for, from the token stream (a ``{`` inside a string or a DuckDB struct literal
``{'a': 1}`` is left alone). Inside ``{fn ...}`` a function keeps its JDBC meaning where DuckDB's
differs: ``DAYOFWEEK`` counts 1 (Sunday) to 7. The other JDBC date functions (``TIMESTAMPADD``,
``TIMESTAMPDIFF`` with ``SQL_TSI_*`` units, ``CURDATE``...) are read by :mod:`.dates`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import tokens
from sqlglot.tokens import TokenType

from flightstore.errors import SqlError

__all__ = ["expand"]

_OPENERS = {"fn": "", "oj": "", "d": "DATE ", "t": "TIME ", "ts": "TIMESTAMP ", "escape": "ESCAPE "}
# {fn NAME(...)}: JDBC's meaning -> (text before the call, text after it).
_JDBC_MEANING = {"DAYOFWEEK": ("(", " + 1)")}


def expand(sql: str, toks: Sequence[tokens.Token]) -> str:
    """``sql`` with its JDBC escapes replaced (``toks`` are its tokens); ``sql`` itself when it has
    none. Raises SqlError for an escape that is not closed."""
    if not any(t.token_type == TokenType.L_BRACE for t in toks):
        return sql
    edits: list[tuple[int, int, str]] = []  # (start, end exclusive, replacement)
    stack: list[str | None] = []  # per open brace: the text its closing brace becomes (None: not an escape)
    for index, token in enumerate(toks):
        if token.token_type == TokenType.L_BRACE:
            following = toks[index + 1] if index + 1 < len(toks) else None
            keyword = following.text.lower() if following is not None and following.token_type in (
                TokenType.VAR, TokenType.ESCAPE) else None
            if keyword not in _OPENERS:
                stack.append(None)
                continue
            before, after = "", ""
            call = toks[index + 2] if keyword == "fn" and index + 2 < len(toks) else None
            if call is not None:
                before, after = _JDBC_MEANING.get(call.text.upper(), ("", ""))
            edits.append((token.start, following.end + 1, before + _OPENERS[keyword]))
            stack.append(after)
        elif token.token_type == TokenType.R_BRACE:
            closing = stack.pop() if stack else None
            if closing is not None:
                edits.append((token.start, token.end + 1, closing))
    if any(closing is not None for closing in stack):
        raise SqlError("a JDBC escape ({fn ...}, {d ...}, {ts ...}) is not closed with '}'")
    if not edits:
        return sql
    pieces, last = [], 0
    for start, end, replacement in sorted(edits):
        pieces.append(sql[last:start])
        pieces.append(replacement)
        last = end
    pieces.append(sql[last:])
    return "".join(pieces)
