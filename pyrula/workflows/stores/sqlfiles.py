"""What the SQL stores (SQLite, the Postgres archive) share: their statements, kept in
``.sql`` files beside them (read from the package, split into ``-- name: x`` blocks),
and the flow-control columns of a run's row."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any, Protocol

from pyrula.workflows.records import FlowControl


class Row(Protocol):
    """A result row by column name: sqlite3.Row, a psycopg dict row."""

    def __getitem__(self, key: str) -> Any: ...


_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$")


def read_sql(package: str, filename: str) -> str:
    """The text of ``filename`` in ``package`` (it ships as package data)."""
    return resources.files(package).joinpath(filename).read_text("utf-8")


def parse_named(text: str) -> dict[str, str]:
    """Split ``-- name: x`` blocks into ``{x: statement}``."""
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in [*text.splitlines(), "-- name: _end"]:
        match = _NAME.match(line)
        if match is None:
            lines.append(line)
            continue
        if name is not None:
            queries[name] = "\n".join(lines).strip()
        name, lines = match.group(1), []
    return queries


def flow_of_row(row: Row) -> FlowControl:
    """The FlowControl kept in a run row's ``rate_*`` and ``owner_concurrency`` columns."""
    return FlowControl(
        rate_key=row["rate_key"],
        rate_per_second=row["rate_per_second"],
        rate_burst=row["rate_burst"],
        owner_concurrency=row["owner_concurrency"],
    )
