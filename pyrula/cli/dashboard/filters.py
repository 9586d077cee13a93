"""The runs filter as a page's query string (or a bulk action's JSON, or the CLI's
options) gives it: field names, times, paging. A value that cannot be used raises
:class:`~pyrula.cli.dashboard.queries.QueryError` saying which and why."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from pyrula.cli.dashboard.queries import DEFAULT_PAGE_SIZE, PAGE_SIZES, QueryError, RunFilter
from pyrula.workflows.records import DEFAULT_OWNER, RunStatus

DEFAULT_OWNER_SHOWN = "(default)"
"""How a page's owner filter names the default owner (an empty field is no filter)."""


def parse_time(text: str, name: str) -> float:
    """An ISO-8601 time (UTC unless it says otherwise) or epoch seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip().removesuffix("UTC").strip())
    except ValueError:
        raise QueryError(
            f"{name} must be an ISO-8601 time (2026-01-31T09:00, UTC) or epoch seconds, "
            f"got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def run_filter(fields: Mapping[str, str | None], now: float) -> RunFilter:
    """A :class:`~.RunFilter` from query (or JSON) fields; bad values: 400."""
    status_text = fields.get("status") or None
    try:
        status = RunStatus(status_text) if status_text else None
    except ValueError:
        raise QueryError("status must be one of " + ", ".join(s.value for s in RunStatus)) from None
    since_text, until_text = fields.get("since"), fields.get("until")
    owner = fields.get("owner")  # None: any; '' (or "(default)" in a form): the default
    since = parse_time(since_text, "since") if since_text else None
    within = fields.get("within")
    if within:
        try:
            since = now - float(within)
        except ValueError:
            raise QueryError("within takes seconds") from None
    return RunFilter(
        workflow=fields.get("workflow") or None,
        status=status,
        owner=DEFAULT_OWNER if owner == DEFAULT_OWNER_SHOWN else owner,
        worker=fields.get("worker") or None,
        since=since,
        until=parse_time(until_text, "until") if until_text else None,
        search=(fields.get("q") or "").strip() or None,
    )


def flat_query(query: Mapping[str, list[str]]) -> dict[str, str]:
    """Each filter field's last non-empty value (an empty form field is no filter; the
    default owner is written ``(default)``)."""
    flat = {k: v[-1] for k, v in query.items() if v and v[-1] != ""}
    return {k: v for k, v in flat.items() if k in FILTER_FIELDS}


FILTER_FIELDS = ("workflow", "status", "owner", "worker", "since", "until", "within", "q",
                  "page", "size")  # fmt: skip


def paging(query: Mapping[str, str]) -> tuple[int, int]:
    try:
        page = int(query.get("page") or 0)
        size = int(query.get("size") or DEFAULT_PAGE_SIZE)
    except ValueError:
        raise QueryError("page and size are whole numbers") from None
    if page < 0 or not 1 <= size <= max(PAGE_SIZES):
        raise QueryError(f"page must be >= 0 and size 1 to {max(PAGE_SIZES)}")
    return page, size
