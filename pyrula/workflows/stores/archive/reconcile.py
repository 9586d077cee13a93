"""Archival reconciliation: copy ended runs from the live store to the archive, then let
the archived ones expire from the live store.

The cursor lives in the archive (:class:`~.base.ArchiveCursor`), so a restarted worker
resumes where archival stopped, and any number of workers may reconcile at once: writes
are idempotent, so overlapping copies are harmless, and the cursor only moves forward.

Every pass re-reads ``clock_skew`` seconds behind the cursor: in a Valkey cluster each
node stamps ``finished_at`` with its own clock, so a run may become visible with an end
slightly before runs already copied. For the same reason a run leaves the live store only
once it ended ``clock_skew`` before the time up to which everything is archived.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from typing import TYPE_CHECKING

from pyrula.workflows.errors import ArchiveSchemaMismatch, InvalidRunState, StoreError
from pyrula.workflows.faults import fault_point
from pyrula.workflows.records import RunRecord
from pyrula.workflows.stores.archive.base import (
    Archive,
    ArchiveCursor,
    ArchivedStamp,
    PurgeCandidate,
)

if TYPE_CHECKING:
    from pyrula.workflows.stores.base import CompleteStore

log = logging.getLogger(__name__)

BACKOFF_MAX = 60.0
"""Most seconds between two attempts while the archive (or the live store) fails."""
EXPIRE_ROUNDS = 10
"""Most ``purge_runs`` batches one pass expires from the live store."""
REFUSED_KEPT = 1024
"""Runs refused for another run's id remembered (each is logged once)."""


class Archiver:
    """The archival work of one :class:`~.archiving.ArchivingStore`.

    ``ttl`` is ``live_ttl_after_archive``; ``batch`` runs are copied per store call;
    ``clock_skew`` seconds are re-read behind the cursor (see the module docstring).
    """

    def __init__(
        self, live: CompleteStore, archive: Archive, *, ttl: float, batch: int, clock_skew: float
    ) -> None:
        self.live = live
        self.archive = archive
        self.ttl = ttl
        self.batch = batch
        self.clock_skew = clock_skew
        self._archived: deque[tuple[float, float]] = deque()
        """(live store time a pass ended, its ``archived_before``), oldest first: when a
        run was known to be archived, so it stays live ``ttl`` seconds after that."""
        self._refused: dict[tuple[str, float], None] = {}
        """The runs refused for another run's id (see ``_copy``), reported once each."""

    # -- copying ---------------------------------------------------------------------------
    async def archive_ended(self) -> int:
        """Copy every run that ended in the live store since the cursor (less the skew
        window) to the archive, a batch at a time, moving the cursor after each batch;
        return how many were written."""
        started = await self.live.now()
        cursor = await self.archive.load_cursor()
        after = None if cursor is None else (cursor.finished_at - self.clock_skew, "")
        written = 0
        while True:
            runs = await self.live.ended_runs(after, self.batch)
            written += await self._copy(runs)
            if runs:
                last = runs[-1]
                after = (last.finished_at or 0.0, last.run_id)
            full = len(runs) >= self.batch
            if after is not None:
                # A full batch vouches for the runs that ended before its last one; the
                # last, short batch for everything that had ended when the pass began.
                archived_before = after[0] if full else started
                await self.archive.save_cursor(ArchiveCursor(after[0], after[1], archived_before))
            if not full:
                break
        if after is not None:
            self._archived.append((await self.live.now(), started))
        return written

    async def _copy(self, runs: list[RunRecord]) -> int:
        """Write the runs (with their journals) the archive lacks or holds an older end of.

        A run whose id the archive holds for another run (another ``created_at``) is not
        written: the archived run is never overwritten by another (the archive's write
        refuses it too, should one slip in between), and the refusal is logged as an
        error, once per run."""
        if not runs:
            return 0
        known = await self.archive.archived_stamps([run.run_id for run in runs])
        fresh: list[RunRecord] = []
        for run in runs:
            stamp = known.get(run.run_id)
            if run.finished_at is None:
                continue
            if stamp is None:
                fresh.append(run)
            elif stamp.created_at != run.created_at:
                self._refuse(run, stamp)
            elif stamp.finished_at < run.finished_at:
                fresh.append(run)
        if not fresh:
            return 0
        journals = await asyncio.gather(*(self.live.load_journal(run.run_id) for run in fresh))
        fault_point("archive_before_pg_write")
        written = await self.archive.write_runs(list(zip(fresh, journals, strict=True)))
        # Committed: the batch is in both stores; the cursor has not moved yet, and the
        # live copies go only once a pass vouching for them is ``ttl`` old (expire_archived).
        fault_point("archive_after_pg_commit_before_hot_delete")
        return written

    def _refuse(self, run: RunRecord, stamp: ArchivedStamp) -> None:
        """Report, once, an ended run whose id an archived run of its own holds."""
        seen = (run.run_id, run.created_at)
        if seen in self._refused:
            return
        self._refused[seen] = None
        while len(self._refused) > REFUSED_KEPT:
            del self._refused[next(iter(self._refused))]
        log.error(
            "run %r of %r (created at %.3f, ended %s at %.3f) is NOT archived: the "
            "archive holds another run under that id (created at %.3f, ended at %.3f), "
            "which is kept. The id was reused behind the ArchivingStore's back (a client "
            "of the live store itself, or a create while the archive could not be "
            "checked); this run's outcome can be read only until it expires from the "
            "live store",
            run.run_id,
            run.workflow,
            run.created_at,
            run.status.value,
            run.finished_at or 0.0,
            stamp.created_at,
            stamp.finished_at,
        )

    # -- expiry ----------------------------------------------------------------------------
    async def expire_archived(self) -> int:
        """Purge from the live store the runs that were archived at least ``ttl`` seconds
        ago (by this process's passes) and ended ``clock_skew`` before the archived
        watermark of then; return how many."""
        now = await self.live.now()
        vouched: float | None = None
        while self._archived and self._archived[0][0] <= now - self.ttl:
            vouched = self._archived.popleft()[1]
        if vouched is None:
            return 0
        self._archived.appendleft((now - self.ttl, vouched))  # still true later on
        cutoff = min(vouched - self.clock_skew, now - self.ttl)
        expired = 0
        for _ in range(EXPIRE_ROUNDS):
            purged = await self.live.purge_runs(cutoff, self.batch)
            expired += purged
            if purged == 0:
                break
        return expired

    # -- retention -------------------------------------------------------------------------
    async def purge(self, ended_before: float, limit: int) -> int:
        """Forget up to ``limit`` runs that ended before ``ended_before``, in the archive
        and the live store both, first ended first; return how many.

        Archives what ended in the live store first, and then deletes only runs the
        archive holds: the live store never loses a run the archive has not got (with
        the archive down this raises and nothing is deleted)."""
        if limit <= 0:
            return 0
        await self.archive_ended()
        purged = 0
        after: tuple[float, str] | None = None
        while purged < limit:
            found = await self.archive.purge_candidates(ended_before, after, limit - purged)
            if not found:
                break
            for candidate in found:
                after = (candidate.finished_at, candidate.run_id)
                if await self._forget(candidate, ended_before):
                    purged += 1
        return purged

    async def _forget(self, candidate: PurgeCandidate, ended_before: float) -> bool:
        """Delete one archived run from the live store, then from the archive."""
        parent = candidate.parent_run_id
        if parent is not None and await self.live.get_run(parent) is not None:
            return False  # a child stays while its parent is there, as in every store
        live = await self.live.get_run(candidate.run_id)
        if live is not None:
            if not live.is_terminal or (live.finished_at or math.inf) >= ended_before:
                return False  # retried since it was archived: the live run decides
            try:
                await self.live.delete_run(candidate.run_id)
            except InvalidRunState:
                return False  # retried just now
        deleted = await self.archive.delete_run(candidate.run_id)
        return deleted or live is not None

    # -- the loop --------------------------------------------------------------------------
    async def run(self, worker_id: str, interval: float) -> None:
        """Archive and expire every ``interval`` seconds until cancelled. Failures are
        logged and retried with a doubling delay (up to ``BACKOFF_MAX``); the worker
        carries on, and the live store keeps every run until the archive is back."""
        log.info(
            "worker %s archives ended runs to %s every %gs (live_ttl_after_archive %gs)",
            worker_id,
            self.archive.url,
            interval,
            self.ttl,
        )
        delay = interval
        while True:
            try:
                archived = await self.archive_ended()
                expired = await self.expire_archived()
                if archived or expired:
                    log.info(
                        "archived %d ended runs to %s; %d expired from the live store",
                        archived,
                        self.archive.url,
                        expired,
                    )
                delay = interval
            except ArchiveSchemaMismatch as exc:
                delay = min(max(delay * 2, interval), BACKOFF_MAX)
                log.error("archival paused (retrying in %.1fs): %s", delay, exc)
            except StoreError as exc:
                delay = min(max(delay * 2, interval), BACKOFF_MAX)
                log.warning(
                    "archival failed (retrying in %.1fs; ended runs stay in the live store "
                    "until then): %s",
                    delay,
                    exc,
                )
            except Exception:
                delay = min(max(delay * 2, interval), BACKOFF_MAX)
                log.exception("archival failed (retrying in %.1fs)", delay)
            await asyncio.sleep(delay)
