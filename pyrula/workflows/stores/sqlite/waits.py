"""Durable waits in SQL: suspending a run, timers, signals and child runs.

Each function runs inside one write transaction (:class:`Tx`); the store wraps them.
"""

from __future__ import annotations

from dataclasses import replace

from pyrula.workflows.records import JournalEntry, NewRun, RunRecord, RunStatus, Wait
from pyrula.workflows.stores.notify import run_key, work_key
from pyrula.workflows.stores.sqlite.tx import Tx


def suspend(tx: Tx, run_id: str, token: int, wait: Wait) -> bool:
    """Release a running run until ``wait`` is over; False (no change) if it already is."""
    tx.fence(run_id, token)
    if wait.signal is not None and tx.one("first_signal", run_id=run_id, name=wait.signal):
        return False
    if wait.child is not None and tx.require(wait.child).is_terminal:
        return False
    if wait.wake_at is not None and wait.wake_at <= tx.now:
        return False
    sleeping = wait.signal is None and wait.child is None
    row = tx.one(
        "suspend_run",
        run_id=run_id,
        now=tx.now,
        status=(RunStatus.SLEEPING if sleeping else RunStatus.WAITING).value,
        wake_at=wait.wake_at,
        wait_signal=wait.signal,
        wait_child=wait.child,
    )
    assert row is not None
    tx.note(run_key(run_id))
    if row["owner_concurrency"] is not None:  # a slot of its owner is free again
        tx.note(work_key(row["workflow"]))
    return True


def fire_timers(tx: Tx, limit: int) -> int:
    """Queue up to ``limit`` sleeping or waiting runs whose ``wake_at`` has passed."""
    due = tx.many("due_timers", now=tx.now, limit=max(limit, 0))
    for row in due:
        tx.enqueue(row["run_id"], row["workflow"], tx.now)
    return len(due)


def send_signal(tx: Tx, run_id: str, name: str, payload: str) -> None:
    """Keep a signal; a run waiting for that name is queued."""
    run = tx.require_live(run_id)
    tx.run("insert_signal", run_id=run_id, name=name, payload=payload)
    if tx.run("signal_waiter", run_id=run_id, name=name, now=tx.now):
        tx.note(work_key(run.workflow))


def consume_signal(tx: Tx, token: int, entry: JournalEntry) -> str | None:
    """Take the oldest pending signal named ``entry.name`` and journal it, at once."""
    tx.fence(entry.run_id, token)
    row = tx.one("journal_entry", run_id=entry.run_id, position=entry.position)
    if row is not None and row["kind"] == entry.kind and row["name"] == entry.name:
        value: str = row["value"]
        return value  # a retried call: already consumed and journaled
    pending = tx.one("first_signal", run_id=entry.run_id, name=entry.name)
    if pending is None:
        return None
    payload: str = pending["payload"]
    tx.append(token, replace(entry, value=payload))
    tx.run("delete_signal", seq=pending["seq"])
    return payload


def start_child(tx: Tx, token: int, entry: JournalEntry, child: NewRun) -> RunRecord:
    """Create ``child`` and journal ``entry`` in the parent's journal, fenced, at once."""
    tx.fence(entry.run_id, token)
    tx.check_entry(entry)
    record, _ = tx.create(child)
    tx.append(token, entry)
    return record
