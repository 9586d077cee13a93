"""Retrying a run: the step that failed it runs again, and so does a child that failed it.

The engine decides what a retry removes from the journal (:func:`retry_edit`): the entry
of the step that ended the run, the one at its ``failed_position`` (with that step's
backoff entries), else its last entry, if that entry is an error; ``store.retry_run``
requeues the run and removes those positions in one atomic step, provided the run was not
claimed again since the journal was read (``seen_claims``).
A parent's ``ctx.run_child`` journals two entries: ``child`` (the child's id) and
``child_result`` (the child's outcome, journaled as an error when the child did not
complete). When the entry the store removes is such a ``child_result``, the retried
parent asks the child again; so the child is retried first (recursively: its own failed
child before it), and the parent continues from its outcome. A child the parent never
saw end (a ``child`` entry without its ``child_result``: the parent was cancelled or
terminated while it waited) is retried too if it ended unsuccessfully, as the parent's
replay would otherwise meet its old end. Other recorded child outcomes stay as they
are: the parent handled them, and a replay must see what the first run saw.

This uses only the store's ordinary operations, so every store behaves the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from pyrula.workflows.errors import InvalidRunState
from pyrula.workflows.records import RETRYABLE_STATUSES, JournalEntry, RunRecord
from pyrula.workflows.serialization import decode
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.rules import backoff_range

CHILD = "child"
"""Journal kind of a child run's start; its value is the child's run id."""
CHILD_RESULT = "child_result"
"""Journal kind of a child run's outcome, one position after its ``child`` entry."""


async def retry_run(store: Store, run_id: str) -> RunRecord:
    """Requeue a failed, cancelled, terminated or dead run, after retrying the children
    whose unsuccessful end ended it (see the module's docstring).

    Raises as ``store.retry_run`` does (RunNotFound, InvalidRunState); a run that cannot
    be retried is refused before any child is touched.
    """
    run = await store.get_run(run_id)
    if run is None or run.status not in RETRYABLE_STATUSES:
        return await store.retry_run(run_id)  # raises RunNotFound or InvalidRunState
    journal = await store.load_journal(run_id)
    for child_id in children_to_rerun(run, journal):
        await _retry_child(store, run_id, child_id)
    return await store.retry_run(run_id, retry_edit(run, journal), seen_claims=run.claims)


def retry_edit(run: RunRecord, journal: Sequence[JournalEntry]) -> list[int]:
    """The journal positions a retry of ``run`` removes, so that the step that failed it
    runs again, with fresh attempts, while the others replay: with a
    ``failed_position``, that position's entry if it is an error and the step's backoff
    entries (``rules.backoff_range``); without one, the entry at the journal's highest
    position if it is an error. An entry that succeeded is never removed."""
    entries = {entry.position: entry for entry in journal}
    remove: list[int] = []
    if run.failed_position is not None:
        low, high = backoff_range(run.failed_position)
        remove += sorted(p for p in entries if low <= p <= high)
    failed = _failed_entry(run, entries)
    if failed is not None:
        remove.append(failed.position)
    return remove


def children_to_rerun(run: RunRecord, journal: Sequence[JournalEntry]) -> list[str]:
    """Ids of the children of ``run`` whose outcome the parent must ask again on retry."""
    entries = {entry.position: entry for entry in journal}
    found: list[str] = []
    failed = _failed_entry(run, entries)
    if failed is not None and failed.kind == CHILD_RESULT:
        start = entries.get(failed.position - 1)
        if start is not None and start.kind == CHILD and start.name == failed.name:
            found.append(str(decode(start.value)))
    for entry in journal:
        if entry.kind == CHILD and entry.position + 1 not in entries:
            found.append(str(decode(entry.value)))
    return list(dict.fromkeys(found))


def _failed_entry(run: RunRecord, entries: Mapping[int, JournalEntry]) -> JournalEntry | None:
    """The error entry of the step that ended the run: the one at its
    ``failed_position``, else its last entry; None when that entry succeeded (or there
    is none)."""
    position = run.failed_position
    if position is None:
        position = max(entries, default=None)
    entry = entries.get(position) if position is not None else None
    return entry if entry is not None and not entry.ok else None


async def _retry_child(store: Store, parent_id: str, child_id: str) -> None:
    child = await store.get_run(child_id)
    if child is None or child.parent_run_id != parent_id:
        return  # forgotten: the parent's replay reports it
    if child.status not in RETRYABLE_STATUSES:
        return  # completed, or already going again
    with contextlib.suppress(InvalidRunState):  # retried by someone else since we looked
        await retry_run(store, child_id)
