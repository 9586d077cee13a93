"""The worker's housekeeping loops: lease renewal, orphan recovery, purges, timers,
schedules."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import os
import socket
import uuid
from typing import TYPE_CHECKING

from pyrula.workflows import telemetry
from pyrula.workflows.errors import IdempotencyConflict, InvalidSchedule, StoreError
from pyrula.workflows.faults import fault_point
from pyrula.workflows.inspection import forget_dead_workers
from pyrula.workflows.rate import flow_for
from pyrula.workflows.records import NO_FLOW, NewRun, ScheduleRecord, WorkerInfo
from pyrula.workflows.schedules import OVERLAP_SKIP, Schedule, check_overlap
from pyrula.workflows.stores.base import history_of, lease_news_of

if TYPE_CHECKING:
    from pyrula.workflows.stores.base import Store
    from pyrula.workflows.worker import WorkflowWorker

log = logging.getLogger("pyrula.workflows.worker")

NEWS_GAP_MIN = 0.05
"""Seconds between two renewals that lease news prompted, at least (a burst of cancels
of one worker's runs costs a renewal per 50 ms, not one each)."""
SCHEDULE_BATCH = 100
PURGE_BATCH = 500
"""Most ended runs one ``purge_runs`` call deletes."""
TIMER_HINT_GAP = 0.05
"""Least seconds between two looks of the timer loop prompted by the claim loop's hints."""
TIMER_HINT_GAP_MAX = 0.5
"""The gap doubles, up to this, after each hinted look that found nothing sooner (under
load, most hints come from claims that lost a run to another worker)."""
SCHEDULE_WATCH_MARGIN = 0.25
"""Seconds. The schedule loop's store wait (``wait_schedule_change``) ends this long
before its next look, and a local sleep covers the rest, so a slot fires on time: a
server's blocking timeout may come ~100 ms late (Valkey checks them at its ``hz``), and
a Valkey wait cut short would cost its connection. A change in that last stretch is
read at the look itself."""
TIMER_SPIN = 0.001
"""Seconds. The timer loop's sleep ends this long before a due time and it yields to the
event loop until the time itself: the event loop's wait rounds up to whole milliseconds
(epoll), which would otherwise start a due run up to 1 ms late (0.5 ms on average)."""
CLAIM_AHEAD = 0.005
"""Seconds. Claims take runs due this soon too (``Store.claim_runs``'s ``ahead``), and the
timer loop wakes the claim loop this long before a delayed run's time: the claim's round
trip (several times its usual time on a machine that was idle) is over by then, and the
worker starts the run at its time (``ClaimLoop.hold``)."""


async def renew_loop(worker: WorkflowWorker, workflows: list[str]) -> None:
    """Heartbeat, and renew the lease of every run this worker holds (a third of the TTL),
    and at once when the store has news of them (``wait_lease_news``: one was cancelled
    or terminated), so a terminated run stops now rather than at the next renewal.

    The first round, as the worker starts, only registers it: a lease claimed since is
    fresh, and is renewed a third of its TTL later like any other."""
    leases = False
    loop = asyncio.get_running_loop()
    news_of = lease_news_of(worker.store)  # else: renew at the interval only
    while True:
        try:
            await renew_once(worker, workflows, leases=leases)
        except StoreError as exc:
            log.warning("lease renewal failed: %s", exc)
        leases = True
        due = loop.time() + worker.options.lease_renew_interval
        news = False
        try:
            if news_of is not None:
                news = await news_of.wait_lease_news(worker.worker_id, due - loop.time())
        except StoreError as exc:  # the renewal still comes on time
            log.debug("waiting for lease news failed: %s", exc)
        # No news before the interval (a wait that failed, or a closed store's): sleep
        # out the rest. News: renew now, but not more than NEWS_GAP_MIN apart.
        await asyncio.sleep(NEWS_GAP_MIN if news else max(0.0, due - loop.time()))


async def renew_once(worker: WorkflowWorker, workflows: list[str], *, leases: bool = True) -> None:
    store, active_runs = worker.store, worker.active_runs
    await store.heartbeat(
        WorkerInfo(
            worker_id=worker.worker_id,
            workflows=tuple(workflows),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            started_at=worker.started_at,
            last_seen=0.0,
            running=len(active_runs),
            lock_ttl=worker.options.lock_ttl,
        )
    )
    if not leases or not active_runs or fault_point("skip_lease_renewal"):
        return
    held = [(a.lease.run_id, a.lease.token) for a in active_runs.values()]
    result = await store.renew_leases(worker.worker_id, held, worker.options.lock_ttl)
    sent = dict(held)
    for run_id in result.lost:
        active = active_runs.get(run_id)
        if active is None or active.lease.token != sent[run_id]:
            continue  # ended meanwhile, or this worker claimed the run again since
        log.warning("run %s: lease lost (terminated or reclaimed); stopping it here", run_id)
        active.lost = True
        if active.execution is not None:
            active.execution.lost = True
        if active.task is not None:
            active.task.cancel()
    for run_id in result.cancel_requested:
        active = active_runs.get(run_id)
        if active is None or active.lease.token != sent[run_id]:
            continue
        active.cancel_requested = True  # for an execution not started yet (a held run)
        if active.execution is not None:
            active.execution.cancel_requested = True


async def orphan_loop(worker: WorkflowWorker) -> None:
    """Requeue runs whose worker stopped renewing; dead-letter those that keep doing it;
    forget workers killed over a day ago (``inspection.forget_dead_workers``)."""
    while True:
        try:
            report = await worker.store.recover_expired(worker.options.max_recoveries, limit=1000)
            if telemetry.current is not None and (report.requeued or report.dead):
                telemetry.current.recovered(report)
            if report.requeued:
                log.warning(
                    "requeued %d runs whose worker stopped renewing: %s",
                    len(report.requeued),
                    ", ".join(report.requeued[:10]),
                )
            if report.dead:
                log.error(
                    "dead-lettered %d runs that kept losing their worker: %s",
                    len(report.dead),
                    ", ".join(report.dead[:10]),
                )
            forgotten = await forget_dead_workers(worker.store)
            if forgotten:
                log.info(
                    "forgot %d workers silent for over a day: %s",
                    len(forgotten),
                    ", ".join(forgotten[:10]),
                )
        except StoreError as exc:
            log.warning("orphan scan failed: %s", exc)
        await asyncio.sleep(worker.options.orphan_scan_interval)


async def purge_loop(worker: WorkflowWorker) -> None:
    """Delete the runs that ended more than ``run_retention`` ago, a batch at a time until
    none is left, every ``purge_interval``. Every worker with a retention runs it: the
    deletes are idempotent, and a batch that another worker emptied comes back short."""
    retention = worker.options.run_retention
    assert retention
    store = worker.store
    log.info("deleting runs that ended over %gs ago (run_retention)", retention)
    while True:
        try:
            purged = await purge_ended(store, await store.now() - retention)
            if purged:
                log.info("deleted %d runs that ended over %gs ago", purged, retention)
        except StoreError as exc:
            log.warning("purging ended runs failed: %s", exc)
        await asyncio.sleep(worker.options.purge_interval)


async def purge_ended(store: Store, cutoff: float) -> int:
    """Delete the runs that ended before ``cutoff`` (store time), ``PURGE_BATCH`` a store
    call until none is left; how many."""
    purged = 0
    while (batch := await _purge_batch(store, cutoff)) > 0:
        purged += batch
        await asyncio.sleep(0)  # the worker's other work goes between batches
    return purged


async def _purge_batch(store: Store, cutoff: float) -> int:
    """One ``purge_runs`` call, finished even when the worker stops meanwhile: what it
    does after its store call (releasing idempotency keys) must not be cut off."""
    history = history_of(store, "run_retention")
    call = asyncio.ensure_future(history.purge_runs(cutoff, PURGE_BATCH))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await call
        raise


async def timer_loop(worker: WorkflowWorker, workflows: list[str]) -> None:
    """Queue runs whose sleep or wait deadline passed, and wake the claim loop when a
    delayed, sleeping or rate-limited run becomes due.

    Each tick handles at most ``timer_max_batch`` timers, then sleeps until the next due
    time the store knows of, capped by ``timer_poll_interval_s``. It looks again sooner
    when a run here suspends (``timers_changed``) or when the claim loop learns from the
    store of work that was not due yet (``timers_hint``; at most every ``TIMER_HINT_GAP``
    to ``TIMER_HINT_GAP_MAX`` seconds), so a run delayed by another process starts on
    time. A look after a hint only recomputes the wake-up (no timer is due then).
    """
    options = worker.options
    loop = asyncio.get_running_loop()
    tick = True  # fire timers; False: only recompute the next wake-up (after a hint)
    deadline = None
    target: float | None = None  # the due time (store clock) the deadline is for
    target_early = False  # the deadline is CLAIM_AHEAD before target
    handed = -math.inf  # the last due time the claim loop was woken for
    recheck: float | None = None  # a due time to look at once more, at the time itself
    gap = TIMER_HINT_GAP
    while True:
        delay = options.timer_poll_interval_s
        due_next: float | None = None
        due_early = False
        asked = loop.time()
        try:
            # Ask for the next due time BEFORE firing: next_due_at counts only times after
            # its own now, so asked after fire_timers it would skip a timer that fell due
            # between the two calls, and that run would wait for the next timer (up to
            # timer_poll_interval_s). Asked first, every timer it skips is fired below.
            due = await worker.store.next_due_at(workflows)
            if tick:
                fired = await worker.store.fire_timers(options.timer_max_batch)
                if fired:
                    worker.wake_claimers()
                if fired >= options.timer_max_batch:
                    continue
            if due is not None:
                # CLAIM_AHEAD early (claims take runs due that soon); once more at the
                # time itself if a claim woken for it left it queued (all slots taken).
                lead = CLAIM_AHEAD if due > handed else 0.0
                store_now = await worker.store.now()
                worker.store_clock.note(store_now, loop.time())  # a hold's start, see there
                until = max(0.0, due - lead - store_now)
                if until < delay:
                    delay, due_next, due_early = until, due, lead > 0
            if recheck is not None:
                # The claim woken early for it took nothing: a run held by a rate limit is
                # refused until its token is there, and once that time has passed
                # next_due_at (future times only) no longer names it. One more look at
                # the time itself; once only, so a worker with every slot taken does not
                # spin on it.
                store_now = await worker.store.now()
                until = max(0.0, recheck - store_now)
                if until < delay:
                    delay, due_next, due_early = until, recheck, False
                recheck = None
        except StoreError as exc:
            log.warning("timer scan failed: %s", exc)
        # A look after a hint only moves the wake-up earlier: a time it did not return
        # may have passed during the call, and that one still needs its tick.
        later = loop.time() + delay
        if tick or deadline is None or later < deadline:
            if not (tick or deadline is None):
                gap = TIMER_HINT_GAP
            deadline, target, target_early = later, due_next, due_early
        else:
            gap = min(2 * gap, TIMER_HINT_GAP_MAX)
        why = await _until_due_or_changed(worker, deadline, asked, gap)
        if why is _Why.DUE:
            if target is not None:
                handed = target
            worker.wake_claimers()
            # The next look comes after that claim, which takes the run it was for.
            claimed = await worker.claim_round_done(CLAIM_AHEAD)
            if target is not None and target_early and not claimed:
                recheck = target
        tick = why is not _Why.HINT


async def sleep_until(deadline: float) -> None:
    """Sleep until ``deadline`` (loop time), on time: the event loop's own wait rounds up
    to whole milliseconds, so its last ``TIMER_SPIN`` is spent yielding instead."""
    loop = asyncio.get_running_loop()
    if deadline - loop.time() > TIMER_SPIN:
        await asyncio.sleep(deadline - TIMER_SPIN - loop.time())
    while loop.time() < deadline:
        await asyncio.sleep(0)


class _Why(enum.Enum):
    DUE = "due"
    CHANGED = "changed"
    HINT = "hint"


async def _until_due_or_changed(
    worker: WorkflowWorker, deadline: float, asked: float, gap: float
) -> _Why:
    """Wait until ``deadline`` (loop time) or until the timer loop should look again:
    ``timers_changed`` at once, ``timers_hint`` no sooner than ``gap`` after the last
    look (``asked``), so a burst of hints costs one look per gap."""
    loop = asyncio.get_running_loop()
    local, hint = worker.timers_changed, worker.timers_hint
    while True:
        now = loop.time()
        if local.is_set():
            local.clear()
            hint.clear()  # the next look covers what a hint was about
            return _Why.CHANGED
        if hint.is_set() and now >= asked + gap:
            hint.clear()
            return _Why.HINT
        if now >= deadline:
            return _Why.DUE
        if deadline - now <= TIMER_SPIN:
            await asyncio.sleep(0)  # the last moment: other tasks run, no rounded wait
        elif hint.is_set():
            await worker.wait_stop_or(min(deadline - TIMER_SPIN, asked + gap) - now, local)
        else:
            await worker.wait_stop_or(deadline - TIMER_SPIN - now, local, hint)


async def schedule_loop(worker: WorkflowWorker) -> None:
    """Fire due schedules; sleep until the next slot, capped by ``schedule_poll_interval``,
    or until the store's schedules change (``Store.wait_schedule_change``: a schedule
    created, resumed or replaced by another process fires its first slot on time)."""
    store = worker.store
    seen: str | None = None
    while True:
        delay = worker.options.schedule_poll_interval
        try:
            if seen is None:
                seen = await store.wait_schedule_change(None, 0)  # read before the schedules
            due = await store.due_schedules(SCHEDULE_BATCH)
            for record in due:
                await fire(worker, record)
            if len(due) >= SCHEDULE_BATCH:
                continue
            upcoming = await store.next_schedule_at()
            if upcoming is not None:
                delay = min(delay, max(0.0, upcoming - await store.now()))
        except StoreError as exc:
            log.warning("schedule scan failed: %s", exc)
        except Exception:  # never let one bad record stop every schedule on this worker
            log.exception("schedule scan failed")
        seen = await _until_slot_or_change(worker, seen, delay)
        worker.schedules_changed.clear()


async def _until_slot_or_change(
    worker: WorkflowWorker, seen: str | None, delay: float
) -> str | None:
    """Sleep ``delay`` seconds, less if the store's change marker moves past ``seen``, the
    worker stops or ``schedules_changed`` is set. Returns the marker to wait from next
    (None: read it again)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + delay
    watch = delay - SCHEDULE_WATCH_MARGIN
    if seen is not None and watch > 0:
        changed = asyncio.Event()
        waiting = asyncio.ensure_future(worker.store.wait_schedule_change(seen, watch))
        waiting.add_done_callback(lambda _: changed.set())
        try:
            await worker.wait_stop_or(delay, worker.schedules_changed, changed)
        finally:
            if not waiting.done():
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
        if waiting.done() and not waiting.cancelled():
            try:
                marker: str | None = waiting.result()
            except Exception as exc:
                log.warning("waiting for schedule changes failed: %s", exc)
                marker = None
            if marker is not None and marker != seen:
                return marker
            seen = marker
    rest = deadline - loop.time()
    if rest > 0 and not worker.schedules_changed.is_set():
        await worker.wait_stop_or(rest, worker.schedules_changed)
    return seen


async def fire(worker: WorkflowWorker, record: ScheduleRecord) -> None:
    """Fire the latest due slot of ``record`` once; missed slots are not backfilled.

    With ``overlap="skip"``, a slot that comes due while the run of the last fired slot
    (``last_run_id``) has not ended is skipped instead: ``fire_schedule`` with no run
    moves the schedule to its next slot. A last run that no longer exists has ended."""
    store = worker.store
    now = await store.now()
    try:
        check_overlap(record.overlap)
        schedule = Schedule.from_record(record)
        slot, following = schedule.slots_due(record.next_fire_at, now)
        if not (math.isfinite(slot) and math.isfinite(following) and following > slot):
            raise InvalidSchedule(f"slot {slot!r} would be followed by {following!r}")
        # Limits travel with the run; a worker that does not know the workflow fires it
        # without them (every worker that serves it does know it).
        definition = worker.registry.find(record.workflow)
        flow = NO_FLOW if definition is None else flow_for(definition, schedule.params)
    except Exception as exc:  # a record Schedule.create would refuse (written directly)
        log.error("schedule %s cannot compute its slots (%s); pausing it", record.schedule_id, exc)
        await store.update_schedule(record.schedule_id, enabled=False)
        return
    if await _skip_slot(store, record, slot, following):
        return
    run = NewRun(
        run_id=uuid.uuid4().hex,
        workflow=record.workflow,
        params=record.params,
        owner=record.owner,
        idempotency_key=f"schedule:{record.schedule_id}:{slot:.3f}",
        flow=flow,
    )
    try:
        created = await store.fire_schedule(
            record.schedule_id, record.next_fire_at, slot, following, run
        )
    except IdempotencyConflict:
        # The slot already produced a run (the schedule was re-created with other params):
        # it has fired; move on to the next slot.
        await store.update_schedule(record.schedule_id, next_fire_at=following)
        return
    if created is not None:
        log.info("schedule %s fired slot %.0f as run %s", record.schedule_id, slot, created.run_id)
        if telemetry.current is not None:
            telemetry.current.schedule_fired(record.workflow)


async def _skip_slot(store: Store, record: ScheduleRecord, slot: float, following: float) -> bool:
    """For ``overlap="skip"``: whether the schedule's last run is still going, in which case
    the slot is skipped (the compare-and-set of ``fire_schedule`` without a run)."""
    if record.overlap != OVERLAP_SKIP or record.last_run_id is None:
        return False
    previous = await store.get_run(record.last_run_id)
    if previous is None or previous.status.is_terminal:
        return False  # ended, or deleted or purged since: fire
    await store.fire_schedule(record.schedule_id, record.next_fire_at, slot, following, None)
    log.info(
        "schedule %s skipped slot %.0f: its previous run %s is still %s",
        record.schedule_id,
        slot,
        previous.run_id,
        previous.status.value,
    )
    return True
