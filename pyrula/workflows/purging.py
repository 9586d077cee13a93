"""Purging: cancel every run of some workflows that waits to start.

What Celery's ``purge`` does to a broker's queues, on the store: ``pyrula purge``,
``pyrula worker --purge`` and ``app.control.purge()`` (pyrula_compat) use
:func:`purge_queued`, as does :meth:`.client.WorkflowClient.purge_queued`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from pyrula.workflows.errors import InvalidRunState, RunNotFound
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.base import Store, native_purge_of

PAGE_SIZE = 5000
"""Queued runs read per ``list_runs`` call while purging."""
CANCEL_BATCH = 50
"""Cancels sent to the store at once while purging."""


async def purge_queued(
    store: Store, workflows: Iterable[str], *, page_size: int = PAGE_SIZE
) -> int:
    """Cancel every run of ``workflows`` that is waiting to start; return how many.

    Waiting to start means ``queued`` and never started: due now, or held back by a
    delay, a countdown, an eta or flow control. Each such run becomes ``cancelled`` at
    once, as ``store.cancel_run`` leaves a queued run (a Celery task then reads
    ``REVOKED``). Running, sleeping and waiting runs are not touched; nor are runs that
    started once and are queued again (requeued after their worker died, a retry whose
    wait is over, a parent woken by a child: they are under way), nor runs submitted
    after the purge began, so a producer that keeps sending cannot keep it going.

    The queue is read a page at a time (``page_size`` runs of one workflow per
    ``list_runs`` call, plus the runs left queued so far; those cancelled drop out of
    the next read), so a backlog of any size is purged without holding more than a page
    of ids. A run that a worker claims in the instant between the read and its cancel
    gets a cancel request instead (it stops at its next step boundary, as after ``pyrula
    runs cancel``) and is not counted. Safe while workers serve the store, and from
    several processes at once (a run is counted by the call whose cancel ended it).

    A store with a purge of its own (:class:`~pyrula.workflows.stores.base.NativePurge`)
    purges the same runs its own way: ValkeyStore reads its queues on from where the last page
    stopped, a page per atomic call, rather than listing them again from the newest
    (:mod:`pyrula.workflows.stores.valkey.queued_purge`).
    """
    if page_size < 1:
        raise ValueError(f"page_size must be at least 1, got {page_size}")
    began = await store.now()
    native = native_purge_of(store)
    if native is not None:
        return await native.purge_queued(list(dict.fromkeys(workflows)), began, page_size)
    purged = 0
    for workflow in dict.fromkeys(workflows):
        kept = 0  # queued runs left alone (started once, or sent since): read past them
        while True:
            limit = page_size + kept
            page = await store.list_runs(workflow=workflow, status=RunStatus.QUEUED, limit=limit)
            waiting = [
                run.run_id for run in page if run.started_at is None and run.created_at <= began
            ]
            kept = len(page) - len(waiting)
            for start in range(0, len(waiting), CANCEL_BATCH):
                purged += await _cancel_all(store, waiting[start : start + CANCEL_BATCH])
            if len(page) < limit:  # that was all of them
                break
    return purged


async def _cancel_all(store: Store, run_ids: Sequence[str]) -> int:
    """Cancel ``run_ids`` at once; how many these calls ended cancelled."""
    outcomes = await asyncio.gather(
        *(_cancel_queued(store, run_id) for run_id in run_ids), return_exceptions=True
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return sum(1 for outcome in outcomes if outcome is True)


async def _cancel_queued(store: Store, run_id: str) -> bool:
    try:
        record = await store.cancel_run(run_id)
    except (InvalidRunState, RunNotFound):  # ended or deleted since it was read
        return False
    return record.status is RunStatus.CANCELLED
