"""The Archive protocol: where an :class:`~.archiving.ArchivingStore` keeps ended runs.

An archive holds terminal runs with their journals, for reading after the live store
has let them go. It is written by the reconcile loop (``write_runs``, idempotent) and
read through the read subset of :class:`~pyrula.workflows.stores.base.Store`. It also
keeps the reconcile loop's cursor, so that a restarted worker resumes where the last
one stopped and several workers may reconcile at once.

Errors are pyrula's: :class:`~pyrula.workflows.errors.StoreUnavailable` when the
archive cannot be reached, :class:`~pyrula.workflows.errors.ArchiveSchemaMismatch`
when its schema is missing or another pyrula version's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pyrula.workflows.records import JournalEntry, RunRecord, RunStatus


@dataclass(frozen=True)
class ArchiveCursor:
    """How far archival got: the last ended run copied, by ``(finished_at, run_id)``,
    and ``archived_before``, a time (store clock, epoch seconds) before which every run
    that had ended in the live store was copied."""

    finished_at: float
    run_id: str
    archived_before: float


@dataclass(frozen=True)
class ArchivedStamp:
    """When an archived run was created and when it ended. ``created_at`` tells the
    archived run from another run under the same id (a retried run keeps it)."""

    created_at: float
    finished_at: float


@dataclass(frozen=True)
class PurgeCandidate:
    """An archived run that ended before a purge's cutoff."""

    run_id: str
    finished_at: float
    parent_run_id: str | None


@runtime_checkable
class Archive(Protocol):
    """Durable storage for ended runs and their journals."""

    url: str
    """Where the archive lives, any password masked; used in messages."""

    async def open(self) -> None:
        """Check the schema (ArchiveSchemaMismatch when missing or another version's)."""

    async def close(self) -> None:
        """Release connections. Idempotent."""

    async def migrate(self) -> None:
        """Create the schema, or check it (idempotent); refuses another version's."""

    async def check(self) -> None:
        """Raise unless the archive is reachable and its schema is this version's."""

    async def write_runs(self, runs: Sequence[tuple[RunRecord, list[JournalEntry]]]) -> int:
        """Store each ended run with its journal, in one transaction; how many were
        written. A run already archived is replaced, journal and all, only when this copy
        is the same run (the same ``created_at``) and ended later (it was retried and
        ended again); otherwise it is left as it is: another run under an archived run's
        id never replaces it."""

    async def finished_times(self, run_ids: Sequence[str]) -> dict[str, float]:
        """``finished_at`` of those of ``run_ids`` that are archived."""

    async def archived_stamps(self, run_ids: Sequence[str]) -> dict[str, ArchivedStamp]:
        """``created_at`` and ``finished_at`` of those of ``run_ids`` that are archived."""

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The archived run, or None."""

    async def load_journal(self, run_id: str) -> list[JournalEntry]:
        """The archived run's journal in position order ([] when not archived)."""

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        """Archived runs matching every given filter, newest first (``created_at``, then
        ``run_id``), at most ``limit``."""

    async def delete_run(self, run_id: str) -> bool:
        """Forget an archived run and its journal; False when it was not archived."""

    async def purge_candidates(
        self, ended_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[PurgeCandidate]:
        """Up to ``limit`` archived runs that ended before ``ended_before`` and after the
        ``(finished_at, run_id)`` cursor ``after``, first ended first, leaving out runs
        whose parent is archived."""

    async def load_cursor(self) -> ArchiveCursor | None:
        """The reconcile cursor, or None before the first archival."""

    async def save_cursor(self, cursor: ArchiveCursor) -> None:
        """Move the cursor forward (a cursor behind the stored one changes nothing)."""
