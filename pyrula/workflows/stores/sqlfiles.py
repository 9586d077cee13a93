"""SQL kept in ``.sql`` files beside the store that runs it (SQLite, the Postgres archive):
reading them from the package, and their ``-- name: x`` blocks."""

from __future__ import annotations

import re
from importlib import resources

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
