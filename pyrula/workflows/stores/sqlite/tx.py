"""One write transaction of the SQLite store, and the run transitions operations share.

A :class:`Tx` lives inside one ``BEGIN IMMEDIATE`` transaction on the store thread: it
runs named statements, collects the wake-up keys to notify once the commit is done, and
carries the moves every operation makes the same way (queue a run, end a run and wake a
parent waiting for it, write a journal entry). The semantics mirror MemoryStore's.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

from pyrula.workflows.errors import InvalidRunState, LeaseLost, NondeterminismError, RunNotFound
from pyrula.workflows.records import JournalEntry, NewRun, RunRecord, RunStatus
from pyrula.workflows.stores.notify import run_key, work_key
from pyrula.workflows.stores.rules import idempotency_conflict, idempotency_matches, same_entry
from pyrula.workflows.stores.sqlite import sql
from pyrula.workflows.stores.sqlite.sql import to_entry, to_run


@dataclass
class Tx:
    """The connection, the store time of this transaction and the keys to notify."""

    conn: sqlite3.Connection
    now: float
    url: str
    keys: list[str] = field(default_factory=list)

    # -- statements --------------------------------------------------------------------
    def one(self, name: str, /, **params: Any) -> sqlite3.Row | None:
        return sql.one(self.conn, name, **params)

    def many(self, name: str, /, **params: Any) -> list[sqlite3.Row]:
        return sql.many(self.conn, name, **params)

    def run(self, name: str, /, **params: Any) -> int:
        return sql.run(self.conn, name, **params)

    def scalar(self, name: str, /, **params: Any) -> Any:
        return sql.scalar(self.conn, name, **params)

    def note(self, *keys: str) -> None:
        """Wake waiters on ``keys`` once the transaction has committed."""
        self.keys.extend(keys)

    # -- lookups -----------------------------------------------------------------------
    def require(self, run_id: str) -> RunRecord:
        row = self.one("get_run", run_id=run_id)
        if row is None:
            raise RunNotFound(f"no run with id {run_id!r} in {self.url}")
        return to_run(row)

    def require_live(self, run_id: str) -> RunRecord:
        run = self.require(run_id)
        if run.is_terminal:
            raise InvalidRunState(f"run {run_id!r} already ended as {run.status.value}")
        return run

    def fence(self, run_id: str, token: int) -> bool:
        """Check the lease with a narrow read; return ``cancel_requested``."""
        row = self.one("lease_state", run_id=run_id)
        if row is None or row["status"] != RunStatus.RUNNING.value or row["lease_token"] != token:
            raise self.lease_lost(run_id, token, row)
        return bool(row["cancel_requested"])

    def lease_lost(
        self, run_id: str, token: int, row: sqlite3.Row | None = None
    ) -> RunNotFound | LeaseLost:
        """The error for a fenced write that found no lease (reads the run if not given)."""
        row = row if row is not None else self.one("lease_state", run_id=run_id)
        if row is None:
            return RunNotFound(f"no run with id {run_id!r} in {self.url}")
        return LeaseLost(
            f"run {run_id!r} is no longer held with token {token} "
            f"(status {row['status']}, token {row['lease_token']})"
        )

    # -- transitions -------------------------------------------------------------------
    def create(self, new: NewRun) -> tuple[RunRecord, bool]:
        """Insert a queued run, or find the one its idempotency key or id names."""
        flow = new.flow
        row = self.one(
            "insert_run",
            run_id=new.run_id,
            workflow=new.workflow,
            params=new.params,
            owner=new.owner,
            idempotency_key=new.idempotency_key,
            now=self.now,
            available_at=new.start_at if new.start_at is not None else self.now + new.delay,
            parent_run_id=new.parent_run_id,
            rate_key=flow.rate_key,
            rate_per_second=flow.rate_per_second,
            rate_burst=flow.rate_burst,
            owner_concurrency=flow.owner_concurrency,
            expires_at=new.expires_at,
        )
        if row is not None:
            # The runs_queued_insert trigger records (or reactivates) the owner.
            self.note(work_key(new.workflow))
            return to_run(row), True
        if new.idempotency_key is not None:
            by_key = self.one("get_run_by_key", key=new.idempotency_key)
            if by_key is not None:
                existing = to_run(by_key)
                if not idempotency_matches(existing, new):
                    raise idempotency_conflict(new.idempotency_key, existing, new)
                return existing, False
        existing = self.require(new.run_id)
        if new.parent_run_id is not None and existing.parent_run_id == new.parent_run_id:
            return existing, False
        raise InvalidRunState(f"a run with id {new.run_id!r} already exists")

    def enqueue(self, run_id: str, workflow: str, available_at: float) -> None:
        """Make the run queued, claimable from ``available_at``."""
        self.run("enqueue_run", run_id=run_id, now=self.now, available_at=available_at)
        self.note(work_key(workflow))

    def ended(self, run: RunRecord, was: RunStatus) -> RunRecord:
        """After ``run`` (formerly ``was``) became terminal: wake its waiters, a parent
        waiting for it, and claimers when it freed an owner-concurrency slot."""
        self.note(run_key(run.run_id))
        if was is RunStatus.RUNNING and run.flow.owner_concurrency is not None:
            self.note(work_key(run.workflow))
        if run.parent_run_id is not None:
            parent = self.one(
                "wake_parent", parent=run.parent_run_id, child=run.run_id, now=self.now
            )
            if parent is not None:
                self.note(work_key(parent["workflow"]))
        return run

    def end(self, statement: str, run: RunRecord, **params: Any) -> RunRecord:
        """Make ``run`` terminal with ``statement`` (which returns the row)."""
        row = self.one(statement, run_id=run.run_id, now=self.now, **params)
        assert row is not None
        return self.ended(to_run(row), run.status)

    def live_descendants(self, run_id: str) -> list[RunRecord]:
        """Non-terminal descendants, depth first, children in run id order."""
        out: list[RunRecord] = []
        for row in self.many("children", run_id=run_id):
            child = to_run(row)
            if not child.is_terminal:
                out.append(child)
            out.extend(self.live_descendants(child.run_id))
        return out

    def append(self, token: int, entry: JournalEntry) -> bool:
        """Write ``entry`` unless an identical one is there; True if it was written.
        A different entry at its position: NondeterminismError."""
        written = self.run(
            "insert_journal",
            run_id=entry.run_id,
            position=entry.position,
            kind=entry.kind,
            name=entry.name,
            ok=entry.ok,
            value=entry.value,
            attempts=entry.attempts,
            token=token,
            recorded_at=self.now,
        )
        if written:
            return True
        self.check_entry(entry)
        return False

    def check_entry(self, entry: JournalEntry) -> None:
        """Refuse ``entry`` if its position holds a different one."""
        row = self.one("journal_entry", run_id=entry.run_id, position=entry.position)
        if row is None:
            return
        existing = to_entry(row)
        if not same_entry(existing, entry):
            raise NondeterminismError(
                f"run {entry.run_id!r} already recorded {existing.kind} {existing.name!r} "
                f"at position {entry.position}, not {entry.kind} {entry.name!r}"
            )
