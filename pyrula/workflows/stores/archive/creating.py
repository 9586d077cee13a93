"""``ArchivingStore.create_run``: a run id an archived run holds stays taken.

A run that ended is copied to the archive, then expires from the live store; the live
store then no longer knows its id. :class:`TakenIds` keeps the protocol's rule anyway: a
create with such an id raises InvalidRunState, or returns the archived run when the new
run carries that run's idempotency key (the Celery drop-in's ``task_id``: a repeat
returns the first run), as the live store does for a run it holds.

**Lookup, then create.** The archive is looked up (``L``) before the live store creates
(``C``). The other order would let the live store create, and wake workers for, a run
that had to be undone a moment later: a worker could start it in between. So:

1. The archive holds the id at ``L``: nothing is created. The reply is the one the live
   store gives for a run it holds, decided on the live copy if there still is one (an
   archived run stays live ``live_ttl_after_archive`` seconds; a retried one is live),
   else on the archived run: its own idempotency key with the same workflow and params
   returns it (``created`` False), the key with other params is IdempotencyConflict, a
   child of the same parent is returned, and anything else is InvalidRunState.
2. The archive misses at ``L``. Then either no run holds the id (none ever did, or it
   was forgotten by ``delete_run`` or retention, which free an id in every store), or a
   run holds it in the live store and is not archived yet; then the live store refuses
   the create (or returns that run) at ``C``, unless the run left the live store between
   ``L`` and ``C``. A run leaves the live store in two ways:

   * forgotten on purpose, by ``delete_run`` or retention (``purge_runs``, which deletes
     the live copy first and the archived one next): the id becomes free, as in every
     store. A create landing between retention's two deletes finds the archived copy
     (refused) or does not (created): either way the old run is being forgotten, and the
     archive's retention rules stay as they are;
   * expired after archival (:meth:`.reconcile.Archiver.expire_archived`): only once the
     pass that archived it, or a later one vouching for it, ended ``live_ttl_after_archive``
     seconds ago on the live store's clock. That pass ended after ``L``: a pass that
     vouched for the run before ``L`` had it copied before ``L``, and ``L`` would have
     found it. So the run cannot expire before ``L + live_ttl_after_archive`` (less
     ``clock_skew``, how far the live store's nodes' clocks may differ).

   Hence a create finished within ``live_ttl_after_archive - clock_skew`` of ``L`` is the
   only holder of its id. A create that took longer than half that (the half is room for
   clocks running at slightly different rates; with ``live_ttl_after_archive <=
   clock_skew``, every create) looks the archive up again after ``C``. That second lookup
   misses nothing: a run archived before ``C`` had expired from the live store before
   ``C`` (else the live store would have refused), and stays archived unless retention
   freed the id. An archived run with another ``created_at`` than the new one means the
   race happened: the new run is terminated and deleted from the live store (it may have
   been started in between: the one case where a refused run can start, and only when a
   create outlasts the window) and the reply is as in 1.

**Cost.** No archive read for an id pyrula generated (``NewRun.generated_id``: a random
uuid4 no earlier run can hold); one per create of a chosen id; a second only past the
window above (never, with the defaults: 300 s less 5 s, halved).

**Archive unreachable.** The create goes on without the lookup (a warning is logged, at
most once a minute, and lookups pause for :data:`PAUSE_AFTER_FAILURE` seconds, so an
outage does not cost every create a connection timeout): the live store keeps working
without Postgres, as it does for everything else. Should a taken id slip through then, the
archiver refuses to overwrite the archived run with the new one and logs an error
(:meth:`.reconcile.Archiver._copy`; the archive's write refuses it as well).

Not covered here, and not needed: ``start_child`` (a child's id is ``<parent id>.<n>``,
and a child stays in the live store while its parent is there) and ``fire_schedule``
(uuid4 ids). An idempotency key alone is not looked up in the archive: the key of a run
that expired from the live store is free there, and a create with that key and another
id creates a new run (docs/archive.md).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import TYPE_CHECKING

from pyrula.workflows.errors import InvalidRunState, RunNotFound, StoreError
from pyrula.workflows.records import NewRun, RunRecord
from pyrula.workflows.stores.rules import idempotency_conflict, idempotency_matches

if TYPE_CHECKING:
    from pyrula.workflows.stores.archive.base import Archive
    from pyrula.workflows.stores.base import CompleteStore

log = logging.getLogger(__name__)

TAKEN = (
    "a run with id {run_id!r} already exists (an archived run of {workflow!r} that ended "
    "{status}); submit under another run id, or delete that run first"
)
PAUSE_AFTER_FAILURE = 5.0
"""Seconds creates skip the archive lookup after it failed (the archive is down)."""
WARN_EVERY = 60.0
"""Seconds between two warnings that a create could not check the archive."""


class TakenIds:
    """The create path of an :class:`~.archiving.ArchivingStore` (see the module
    docstring): ``ttl`` is its ``live_ttl_after_archive``, ``clock_skew`` its own."""

    def __init__(
        self, live: CompleteStore, archive: Archive, *, ttl: float, clock_skew: float
    ) -> None:
        self.live = live
        self.archive = archive
        self.safe_window = max(0.0, ttl - clock_skew) / 2
        """Seconds after the lookup within which a create needs no second lookup."""
        self._paused_until = -math.inf
        self._warned_at = -math.inf

    async def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        if new.generated_id:
            return await self.live.create_run(new)
        looked_at = time.monotonic()
        archived = await self._lookup(new.run_id)
        if archived is not None:
            return await self._taken(new, archived)
        run, created = await self.live.create_run(new)
        if not created or time.monotonic() - looked_at < self.safe_window:
            return run, created
        archived = await self._lookup(new.run_id)
        if archived is None or archived.created_at == run.created_at:
            return run, created  # none, or this very run, archived already
        await self._undo(run, archived)
        return await self._taken(new, archived)

    async def _lookup(self, run_id: str) -> RunRecord | None:
        """The archived run ``run_id``, or None; None too when the archive cannot be read
        (logged): creates do not depend on it being up."""
        if time.monotonic() < self._paused_until:
            return None
        try:
            return await self.archive.get_run(run_id)
        except StoreError as exc:
            now = time.monotonic()
            self._paused_until = now + PAUSE_AFTER_FAILURE
            if now - self._warned_at >= WARN_EVERY:
                self._warned_at = now
                log.warning(
                    "creates could not check the archive for run ids archived runs hold "
                    "(%s); they go on without it, for %gs at a time, until it answers. An "
                    "archived run's id reused meanwhile makes a second run, which the "
                    "archiver will not archive over the first",
                    exc,
                    PAUSE_AFTER_FAILURE,
                )
            return None

    async def _taken(self, new: NewRun, archived: RunRecord) -> tuple[RunRecord, bool]:
        """The live store's reply to a create of an id a run holds (module docstring, 1)."""
        held = await self.live.get_run(new.run_id) or archived
        key = new.idempotency_key
        if key is not None and held.idempotency_key == key:
            if not idempotency_matches(held, new):
                raise idempotency_conflict(key, held, new)
            return held, False
        if new.parent_run_id is not None and held.parent_run_id == new.parent_run_id:
            return held, False
        raise InvalidRunState(
            TAKEN.format(
                run_id=new.run_id, workflow=archived.workflow, status=archived.status.value
            )
        )

    async def _undo(self, run: RunRecord, archived: RunRecord) -> None:
        """Take back ``run``, created in the live store while the archived run holding its
        id expired from there (module docstring, 2)."""
        log.warning(
            "run %r was created while the archived run holding its id (created at %.3f) "
            "expired from the live store; the new run is terminated and deleted",
            run.run_id,
            archived.created_at,
        )
        with contextlib.suppress(InvalidRunState, RunNotFound):  # it ended, or is gone
            await self.live.terminate_run(run.run_id)
        await self.live.delete_run(run.run_id)
