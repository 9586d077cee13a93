"""The Postgres archive's statements and row mapping.

Statements live in ``queries.sql`` and ``schema.sql`` next to this module and are read
once, at import. Runs are written with every :class:`~pyrula.workflows.records.RunRecord`
field as a column (``flow`` flattened into ``rate_*`` and ``owner_concurrency``) and read
back by column name.
"""

from __future__ import annotations

import dataclasses
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pyrula.workflows.records import JournalEntry, RunRecord, RunStatus
from pyrula.workflows.stores.sqlfiles import flow_of_row, parse_named, read_sql


def _read(filename: str) -> str:
    return read_sql(__package__ or __name__, filename)


Q = parse_named(_read("queries.sql"))
SCHEMA = _read("schema.sql")

RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunRecord) if f.name not in ("flow",))
"""RunRecord fields stored as a column of the same name (``status`` as its value)."""


def pyrula_version() -> str:
    """The installed pyrula's version: what ``pyrula db migrate`` records and every
    archive checks against."""
    try:
        return version("pyrula")
    except PackageNotFoundError:  # a source tree that is not installed
        return "unknown"


def run_params(run: RunRecord) -> dict[str, Any]:
    """The ``upsert_run`` parameters of an ended run."""
    params: dict[str, Any] = {name: getattr(run, name) for name in RUN_FIELDS}
    params["status"] = run.status.value
    flow = run.flow
    params.update(
        rate_key=flow.rate_key,
        rate_per_second=flow.rate_per_second,
        rate_burst=flow.rate_burst,
        owner_concurrency=flow.owner_concurrency,
    )
    return params


def to_run(row: dict[str, Any]) -> RunRecord:
    """A RunRecord from a ``pyrula_runs`` row."""
    values = {name: row[name] for name in RUN_FIELDS}
    values["status"] = RunStatus(row["status"])
    return RunRecord(**values, flow=flow_of_row(row))


def entry_params(entry: JournalEntry) -> dict[str, Any]:
    return dataclasses.asdict(entry)


def to_entry(row: dict[str, Any]) -> JournalEntry:
    return JournalEntry(
        run_id=row["run_id"],
        position=row["position"],
        kind=row["kind"],
        name=row["name"],
        ok=row["ok"],
        value=row["value"],
        attempts=row["attempts"],
        token=row["token"],
        recorded_at=row["recorded_at"],
    )
