"""ArchivingStore: a live store (Valkey) whose ended runs are kept in an archive (Postgres).

Everything a worker or a client does goes to the live store. Ended runs are copied to
the archive by the reconcile loop (:mod:`.reconcile`) and expire from the live store
``live_ttl_after_archive`` seconds later; reads fall through to the archive, so a run
reads the same before and after it left the live store. Archived runs are read-only.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence

from pyrula.workflows.errors import (
    ArchiveSchemaMismatch,
    ConfigurationError,
    InvalidRunState,
    RunNotFound,
    StoreError,
)
from pyrula.workflows.records import (
    JournalEntry,
    NewRun,
    Outcome,
    RecoveryReport,
    RunRecord,
    RunStatus,
    ScheduleRecord,
    TriggerEvent,
    Wait,
    WorkerInfo,
)
from pyrula.workflows.stores.archive.base import Archive
from pyrula.workflows.stores.archive.creating import TakenIds
from pyrula.workflows.stores.archive.reconcile import Archiver
from pyrula.workflows.stores.base import Claimed, CompleteStore, RenewResult, Store
from pyrula.workflows.stores.schedule_admin import ScheduleAdmin

log = logging.getLogger(__name__)

READ_ONLY = (
    "run {run_id!r} is archived and archived runs are read-only: it can be read, listed "
    "and deleted, not retried, cancelled, terminated or signalled"
)


class ArchivingStore(ScheduleAdmin):
    """A :class:`~pyrula.workflows.stores.base.Store` over ``live`` that keeps ended runs
    in ``archive``.

    * ``live``: the store workers and clients use (a ValkeyStore in production).
    * ``archive``: where ended runs go (a :class:`PostgresArchive`).
    * ``live_ttl_after_archive`` (seconds, default 300): how long an archived run stays
      in the live store after it was archived (and after it ended).
    * ``reconcile_interval`` (seconds): how often a worker's reconcile loop copies.
    * ``reconcile_batch``: runs copied (and expired) per store call.
    * ``clock_skew`` (seconds): how far the clocks of the live store's nodes may differ;
      archival re-reads that far behind its cursor.

    Reads: ``get_run``, ``load_journal`` and ``wait_run`` ask the live store first and
    the archive when the run is not there; ``list_runs`` merges both. ``delete_run``
    deletes from both. ``create_run`` keeps an archived run's id taken (one archive read
    per create of an id the caller chose; none for generated ids). ``retry_run``,
    ``cancel_run``, ``terminate_run`` and ``send_signal`` of a run only the archive holds
    raise InvalidRunState. ``open()`` refuses a missing or other-version archive schema
    (ArchiveSchemaMismatch); an archive that cannot be reached is logged, and the worker
    runs on the live store until it is back.

    ``live`` must have every part of the protocol (``CompleteStore``); its optional
    capabilities (lease news, shard leases, its own purge, the blocking fast path) are
    found through this store, which wraps it (``stores.base.Wrapping``).
    """

    def __init__(
        self,
        live: Store,
        archive: Archive,
        live_ttl_after_archive: float = 300.0,
        *,
        reconcile_interval: float = 5.0,
        reconcile_batch: int = 100,
        clock_skew: float = 5.0,
    ) -> None:
        for name, value in (
            ("live_ttl_after_archive", live_ttl_after_archive),
            ("clock_skew", clock_skew),
        ):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigurationError(f"{name} must be a number >= 0, got {value!r}")
        if not isinstance(reconcile_interval, (int, float)) or not reconcile_interval > 0:
            raise ConfigurationError(
                f"reconcile_interval must be a positive number, got {reconcile_interval!r}"
            )
        if isinstance(reconcile_batch, bool) or not isinstance(reconcile_batch, int):
            raise ConfigurationError(f"reconcile_batch must be an int, got {reconcile_batch!r}")
        if reconcile_batch < 1:
            raise ConfigurationError(f"reconcile_batch must be >= 1, got {reconcile_batch!r}")
        if not isinstance(live, CompleteStore):
            raise ConfigurationError(
                f"an archiving store wraps a store with every part (signals, run history, "
                f"events): {live.url} lacks some"
            )
        self.live: CompleteStore = live
        self.archive = archive
        self.live_ttl_after_archive = float(live_ttl_after_archive)
        self.reconcile_interval = float(reconcile_interval)
        self.url = f"{live.url} + archive {archive.url}"
        self._archiver = Archiver(
            live,
            archive,
            ttl=self.live_ttl_after_archive,
            batch=reconcile_batch,
            clock_skew=float(clock_skew),
        )
        self._creates = TakenIds(
            live, archive, ttl=self.live_ttl_after_archive, clock_skew=float(clock_skew)
        )

    def __repr__(self) -> str:
        return f"ArchivingStore(live={self.live!r}, archive={self.archive!r})"

    # -- archival ---------------------------------------------------------------------------
    async def reconcile_loop(self, worker_id: str, interval: float | None = None) -> None:
        """Copy ended runs to the archive and expire archived ones from the live store
        every ``interval`` seconds (default ``reconcile_interval``), until cancelled.
        Never raises on a store outage: it logs and backs off. Workers start it."""
        await self._archiver.run(worker_id, interval or self.reconcile_interval)

    async def archive_ended(self) -> int:
        """One archival pass now: copy every run that ended since the last one; how many
        were written. (The reconcile loop calls this.)"""
        return await self._archiver.archive_ended()

    async def expire_archived(self) -> int:
        """Purge from the live store the runs archived over ``live_ttl_after_archive``
        seconds ago; how many."""
        return await self._archiver.expire_archived()

    # -- lifecycle ----------------------------------------------------------------------
    async def open(self) -> None:
        await self.live.open()
        try:
            await self.archive.open()
        except ArchiveSchemaMismatch:
            raise
        except StoreError as exc:
            log.warning(
                "the archive is not available (%s); ended runs stay in the live store until it is",
                exc,
            )

    async def close(self) -> None:
        try:
            await self.live.close()
        finally:
            await self.archive.close()

    async def now(self) -> float:
        return await self.live.now()

    # -- runs: reads fall through to the archive ---------------------------------------------
    async def get_run(self, run_id: str) -> RunRecord | None:
        run = await self.live.get_run(run_id)
        return run if run is not None else await self.archive.get_run(run_id)

    async def load_journal(self, run_id: str) -> list[JournalEntry]:
        entries = await self.live.load_journal(run_id)
        if entries or await self.live.get_run(run_id) is not None:
            return entries
        return await self.archive.load_journal(run_id)

    async def wait_run(self, run_id: str, timeout: float | None) -> RunRecord:
        try:
            return await self.live.wait_run(run_id, timeout)
        except RunNotFound:
            archived = await self.archive.get_run(run_id)
            if archived is None:
                raise
            return archived

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        """Both stores' runs, newest first (``created_at``), each once: the live copy
        wins (an archived run that was retried is in the live store with another status)."""
        if limit <= 0:
            return []
        live = await self.live.list_runs(workflow=workflow, status=status, owner=owner, limit=limit)
        if status is not None and not status.is_terminal:
            return live  # the archive holds ended runs only
        seen = {run.run_id for run in live}
        archived = await self._archived_only(workflow, status, owner, limit, seen)
        merged: list[RunRecord] = []
        i = j = 0
        while len(merged) < limit and (i < len(live) or j < len(archived)):
            take_live = j >= len(archived) or (
                i < len(live) and live[i].created_at >= archived[j].created_at
            )
            if take_live:
                merged.append(live[i])
                i += 1
            else:
                merged.append(archived[j])
                j += 1
        return merged

    async def _archived_only(
        self,
        workflow: str | None,
        status: RunStatus | None,
        owner: str | None,
        limit: int,
        seen: set[str],
    ) -> list[RunRecord]:
        """Up to ``limit`` archived runs matching the filters, newest first, that the live
        store does not hold (``seen``: those it listed; an archived run may also still be
        live with another status, after a retry). Asked again for twice as many while
        such runs leave fewer than ``limit``: their number is bounded by the live store."""
        ask = limit
        while True:
            found = await self.archive.list_runs(
                workflow=workflow, status=status, owner=owner, limit=ask
            )
            candidates = [run for run in found if run.run_id not in seen]
            live_copies = await asyncio.gather(
                *(self.live.get_run(run.run_id) for run in candidates)
            )
            kept = [run for run, copy in zip(candidates, live_copies, strict=True) if copy is None]
            if len(kept) >= limit or len(found) < ask:
                return kept[:limit]
            ask *= 2

    async def delete_run(self, run_id: str) -> bool:
        """Delete from both stores: the archive first, so an unreachable archive raises
        before anything changed; again after the live delete, in case the archiver copied
        the run in between."""
        archived = await self.archive.delete_run(run_id)
        deleted = await self.live.delete_run(run_id)
        if deleted:
            archived = await self.archive.delete_run(run_id) or archived
        return archived or deleted

    async def purge_runs(self, ended_before: float, limit: int) -> int:
        """Forget runs that ended before ``ended_before`` from both stores, archiving
        first: the live store never loses a run the archive has not got (see
        :meth:`.reconcile.Archiver.purge`)."""
        return await self._archiver.purge(ended_before, limit)

    async def ended_runs(self, after: tuple[float, str] | None, limit: int) -> list[RunRecord]:
        """The live store's ended runs (what archival copies)."""
        return await self.live.ended_runs(after, limit)

    # -- runs: changes go to the live store; archived runs are read-only --------------------
    async def _read_only_if_archived(self, run_id: str, exc: RunNotFound) -> InvalidRunState:
        if await self.archive.get_run(run_id) is None:
            raise exc
        return InvalidRunState(READ_ONLY.format(run_id=run_id))

    async def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        """Create in the live store. A run id an archived run holds stays taken: such a
        create raises InvalidRunState, or returns the archived run when it carries that
        run's idempotency key (see :mod:`.creating`, which also says why no concurrent
        archival lets a second run of that id through)."""
        return await self._creates.create_run(new)

    async def cancel_run(self, run_id: str) -> RunRecord:
        try:
            return await self.live.cancel_run(run_id)
        except RunNotFound as exc:
            raise await self._read_only_if_archived(run_id, exc) from None

    async def terminate_run(self, run_id: str) -> RunRecord:
        try:
            return await self.live.terminate_run(run_id)
        except RunNotFound as exc:
            raise await self._read_only_if_archived(run_id, exc) from None

    async def retry_run(
        self, run_id: str, remove: Sequence[int] = (), *, seen_claims: int | None = None
    ) -> RunRecord:
        """Retry a run the live store holds. A run only the archive holds raises
        InvalidRunState: archived runs are read-only (submit it again instead)."""
        try:
            return await self.live.retry_run(run_id, remove, seen_claims=seen_claims)
        except RunNotFound as exc:
            raise await self._read_only_if_archived(run_id, exc) from None

    async def send_signal(self, run_id: str, name: str, payload: str) -> None:
        try:
            await self.live.send_signal(run_id, name, payload)
        except RunNotFound as exc:
            raise await self._read_only_if_archived(run_id, exc) from None

    # -- everything else is the live store's ---------------------------------------------
    async def wait_for_work(self, workflows: Sequence[str], timeout: float) -> Sequence[str] | None:
        return await self.live.wait_for_work(workflows, timeout)

    async def claim_runs(
        self,
        worker_id: str,
        workflows: Sequence[str],
        limit: int,
        lease_ttl: float,
        ahead: float = 0.0,
    ) -> Claimed:
        return await self.live.claim_runs(worker_id, workflows, limit, lease_ttl, ahead)

    async def next_due_at(self, workflows: Sequence[str]) -> float | None:
        return await self.live.next_due_at(workflows)

    async def renew_leases(
        self, worker_id: str, leases: Sequence[tuple[str, int]], lease_ttl: float
    ) -> RenewResult:
        return await self.live.renew_leases(worker_id, leases, lease_ttl)

    async def append_journal(self, token: int, entry: JournalEntry) -> bool:
        return await self.live.append_journal(token, entry)

    async def finish_run(
        self, run_id: str, token: int, outcome: Outcome, entry: JournalEntry | None = None
    ) -> RunRecord:
        return await self.live.finish_run(run_id, token, outcome, entry)

    async def release_run(self, run_id: str, token: int, available_at: float | None = None) -> None:
        await self.live.release_run(run_id, token, available_at)

    async def set_progress(self, run_id: str, token: int, state: str, info: str) -> None:
        await self.live.set_progress(run_id, token, state, info)

    async def suspend_run(self, run_id: str, token: int, wait: Wait) -> bool:
        return await self.live.suspend_run(run_id, token, wait)

    async def fire_timers(self, limit: int) -> int:
        return await self.live.fire_timers(limit)

    async def consume_signal(self, token: int, entry: JournalEntry) -> str | None:
        return await self.live.consume_signal(token, entry)

    async def start_child(self, token: int, entry: JournalEntry, child: NewRun) -> RunRecord:
        return await self.live.start_child(token, entry, child)

    async def create_schedule(
        self, schedule: ScheduleRecord, *, replace: bool = False
    ) -> ScheduleRecord:
        return await self.live.create_schedule(schedule, replace=replace)

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        return await self.live.get_schedule(schedule_id)

    async def list_schedules(self, *, workflow: str | None = None) -> list[ScheduleRecord]:
        return await self.live.list_schedules(workflow=workflow)

    async def update_schedule(
        self,
        schedule_id: str,
        *,
        enabled: bool | None = None,
        params: str | None = None,
        next_fire_at: float | None = None,
    ) -> ScheduleRecord:
        return await self.live.update_schedule(
            schedule_id, enabled=enabled, params=params, next_fire_at=next_fire_at
        )

    async def delete_schedule(self, schedule_id: str) -> bool:
        return await self.live.delete_schedule(schedule_id)

    async def due_schedules(self, limit: int) -> list[ScheduleRecord]:
        return await self.live.due_schedules(limit)

    async def next_schedule_at(self) -> float | None:
        return await self.live.next_schedule_at()

    async def wait_schedule_change(self, seen: str | None, timeout: float) -> str:
        return await self.live.wait_schedule_change(seen, timeout)

    async def fire_schedule(
        self,
        schedule_id: str,
        expected_next: float,
        fired_slot: float,
        next_fire_at: float,
        run: NewRun | None,
    ) -> RunRecord | None:
        return await self.live.fire_schedule(
            schedule_id, expected_next, fired_slot, next_fire_at, run
        )

    async def append_events(self, trigger: str, payloads: Sequence[str]) -> list[int]:
        return await self.live.append_events(trigger, payloads)

    async def read_events(self, trigger: str, limit: int) -> list[TriggerEvent]:
        return await self.live.read_events(trigger, limit)

    async def consume_events(self, trigger: str, first_seq: int, count: int) -> bool:
        return await self.live.consume_events(trigger, first_seq, count)

    async def get_cursor(self, name: str) -> str | None:
        return await self.live.get_cursor(name)

    async def swap_cursor(self, name: str, expected: str | None, value: str) -> bool:
        return await self.live.swap_cursor(name, expected, value)

    async def recover_expired(self, max_recoveries: int, limit: int) -> RecoveryReport:
        return await self.live.recover_expired(max_recoveries, limit)

    async def heartbeat(self, info: WorkerInfo) -> None:
        await self.live.heartbeat(info)

    async def remove_worker(self, worker_id: str) -> None:
        await self.live.remove_worker(worker_id)

    async def list_workers(self) -> list[WorkerInfo]:
        return await self.live.list_workers()


def _is_a_store(store: ArchivingStore) -> CompleteStore:
    """Never called: mypy checks here that ArchivingStore implements every part."""
    return store
