"""The worker's claim loop: one per worker, over all the workflows it serves.

Each claim asks the store for every free slot (``max_concurrent_runs`` across all the
workflows). Idle, the loop waits for the store (``wait_for_work`` on all the workflows at
once), a local wake-up (``WorkflowWorker.wake_claimers``: a timer fell due) or stop, at
most ``claim_poll_interval``. A store wait that a local wake-up interrupted is kept and
awaited again the next idle round rather than cancelled and re-issued: cancelling a
blocking Valkey command costs its connection.

Which workflows a claim names, and in which order:

* A *full* claim names them all, in an order that rotates by one per claim: a store fills
  the limit in the order given, so a workflow with a backlog cannot starve the others.
  The first claim and a claim after a poll timed out are full.
* Any other claim (the store signalled new work, a timer fell due, a slot freed) is
  *targeted*: it names the workflows that yielded runs in the last ``HOT_WINDOW``
  seconds, rotated the same way, after the ones the store's signal named (when it can
  tell: ``wait_for_work`` returns them when their runs are claimable at once), and
  starts what it got; then, if the last full claim is ``claim_poll_interval`` old, or
  it got nothing and the store did not name the workflows, it claims the other
  workflows. Runs the store named that the targeted claim did not find were taken by
  another worker: the other workflows need no look then (a wake-up of theirs is kept
  by the store for the next wait). While
  every slot is taken (each claim fills the slots that free), a full claim is made
  every ``claim_poll_interval``, so a backlog cannot keep the others out. A store
  may pay per workflow named (a ValkeyStore cluster makes one call per workflow; a
  single node one call for all, with a few commands per workflow), so a busy
  workflow costs one call per claim however many workflows the worker serves, while
  every workflow is still looked at every ``claim_poll_interval``.

A claim may end runs instead of claiming them, those found still queued past their
``expires_at`` (``Claimed.expired``): the loop awaits each one's workflow's
``on_expired`` hook after starting what it claimed.

When the store signalled work and the claim found none, the work was not due yet (a
delayed run submitted elsewhere, say) or another worker took it: the loop hints the timer
loop (``timers_hint``), which recomputes its next wake-up so that a delayed run starts on
time rather than at the next poll.

Every claim also takes runs that become due within ``CLAIM_AHEAD`` (``Store.claim_runs``'s
``ahead``), and the timer loop wakes the claim loop that much before a delayed run's time:
the claim's round trip, which on an idle machine takes several times its usual time, is
then over before the run's time, and the worker starts the run at its time
(:meth:`ClaimLoop.hold`, on the store's clock as :class:`StoreClock` follows it), not a
round trip after it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyrula.workflows.errors import StoreError
from pyrula.workflows.loops import CLAIM_AHEAD, sleep_until
from pyrula.workflows.records import Lease, RunRecord
from pyrula.workflows.registry import WorkflowDefinition

if TYPE_CHECKING:
    from pyrula.workflows.worker import WorkflowWorker

log = logging.getLogger("pyrula.workflows.worker")

STORE_ERROR_BACKOFF_MAX = 5.0
HOT_WINDOW = 1.0
"""Seconds a workflow stays in targeted claims after it last yielded a run."""
EARLY_RETURN = 0.9
"""A store wait that returned before this share of its timeout was a wake-up, not a poll."""


CLOCK_SLACK = 0.001
"""Seconds per second by which ``StoreClock``'s bound loosens with age: more than two
clocks drift apart, so an old bound never makes a run start early."""


class StoreClock:
    """When a store time comes on this process's event loop clock, never too early.

    A claim reads the store's clock (its leases expire ``lease_ttl`` after it), and so
    does ``Store.now`` (the timer loop's, on Valkey a ``TIME``), somewhere between the
    call and its reply, so the store's clock less the loop's, read at the reply, is a
    lower bound of their true offset; the greatest bound of recent readings (loosened by
    ``CLOCK_SLACK`` per second of age) is the estimate. The local time it gives for a
    store time is at or after the true one, by about the shortest recent reading's time
    from the store's clock to its reply.
    """

    def __init__(self) -> None:
        self._offset = -math.inf
        self._noted = 0.0

    def note(self, store_time: float, replied: float) -> None:
        """A call that read the store's clock as ``store_time`` replied at ``replied``
        (loop time)."""
        aged = self._offset - CLOCK_SLACK * (replied - self._noted)
        self._offset, self._noted = max(store_time - replied, aged), replied

    def local(self, store_time: float) -> float:
        """The loop time at which the store's clock reads ``store_time`` (or later)."""
        now = asyncio.get_running_loop().time()
        return store_time - self._offset + CLOCK_SLACK * (now - self._noted)


def claimed_at(lease: Lease, lease_ttl: float) -> float:
    """The store's clock when the lease was taken (its expiry less its ``lease_ttl``)."""
    return lease.expires_at - lease_ttl


class Why(enum.Enum):
    """Why the loop claims now."""

    POLL = "poll"
    """Start, a poll that timed out, a failure: look at every workflow."""
    LOCAL = "local"
    """``wake_claimers``: a timer fell due, a virtual clock moved; any workflow."""
    STORE = "store"
    """The store's wait returned early: new work (of the workflows it named, if any)."""
    SLOT = "slot"
    """The last claim filled every slot: more may be waiting."""


class ClaimPlan:
    """Which workflows the next claim names, in which order."""

    def __init__(self, names: list[str], full_every: float) -> None:
        self.names = names
        self.full_every = full_every
        self.last_full = float("-inf")
        self.hot: dict[str, float] = {}
        """Workflow -> loop time it last yielded a run."""
        self._turn = 0
        self._hot_turn = 0
        self._served: str | None = None
        """The workflow the last claim took its last run from: the next full claim starts
        after it, so idle workflows between two busy ones do not hand the busy one
        listed first most of the turns."""

    def full_due(self, now: float) -> bool:
        """Whether the last claim of every workflow is ``full_every`` old."""
        return now - self.last_full >= self.full_every

    def targeted(self, now: float, signalled: Sequence[str] = ()) -> list[str] | None:
        """The ``signalled`` workflows, then the recently busy ones, rotated; None when
        there are none."""
        hot = [n for n in self.names if now - self.hot.get(n, float("-inf")) < HOT_WINDOW]
        if hot:
            self._hot_turn = turn = (self._hot_turn + 1) % len(hot)
            hot = hot[turn:] + hot[:turn]
        if signalled:  # a subset of names: the store names what it was asked to wait on
            hot = [*signalled, *(n for n in hot if n not in signalled)]
        return hot or None

    def full(self, now: float, leave_out: list[str] | None = None) -> list[str]:
        """Every workflow (but ``leave_out``), in the order of this claim's turn."""
        self.last_full = now
        names = self.names
        if self._served in names:
            turn = (names.index(self._served) + 1) % len(names)
        else:
            self._turn = turn = (self._turn + 1) % len(names)
        order = names[turn:] + names[:turn]
        if leave_out:
            skip = set(leave_out)
            order = [n for n in order if n not in skip]
        return order

    def note(self, leases: list[Lease], now: float) -> None:
        for lease in leases:
            self.hot[lease.run.workflow] = now
        if leases:
            self._served = leases[-1].run.workflow


class ClaimLoop:
    """Claims runs for ``worker`` until it stops; see the module's docstring."""

    def __init__(self, worker: WorkflowWorker, definitions: dict[str, WorkflowDefinition]):
        self.worker = worker
        self.definitions = definitions
        self.names = list(definitions)
        self.poll = worker.options.claim_poll_interval
        self.plan = ClaimPlan(self.names, self.poll)
        self.loop = asyncio.get_running_loop()
        self._wake: asyncio.Future[None] | None = None
        """What the loop awaits when idle or pausing; resolved by wake(), stop, the store."""
        self._woken = False
        self._work: asyncio.Future[Sequence[str] | None] | None = None
        """The pending ``store.wait_for_work``, kept across idle rounds."""
        self._work_started = self._work_ended = 0.0
        self._signalled: Sequence[str] | None = None
        """The workflows the store's last early wake-up named (None: it could not tell)."""
        self._round_waiters: list[asyncio.Future[int]] = []
        """Resolved when the current or next claim round ends (``round_done``), with how
        many runs it claimed."""

    def wake(self) -> None:
        """Claim now: at once if idle, else as soon as the current claim returns."""
        self._woken = True
        _resolve(self._wake)

    async def hold(self, lease: Lease) -> None:
        """Return at the lease's run's ``available_at``: at once, unless the claim took it
        ahead of its time (at most ``CLAIM_AHEAD`` ahead)."""
        hold = lease.run.available_at - claimed_at(lease, self.worker.options.lock_ttl)
        if hold > 0:
            start = self.worker.store_clock.local(lease.run.available_at)
            await sleep_until(min(start, self.loop.time() + CLAIM_AHEAD))

    def round_done(self) -> asyncio.Future[int]:
        """A future resolved when the claim round under way, or else the next, ends: with
        how many runs it claimed."""
        waiter: asyncio.Future[int] = self.loop.create_future()
        self._round_waiters.append(waiter)
        return waiter

    def _end_round(self, claimed: int = 0) -> None:
        waiters, self._round_waiters = self._round_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(claimed)

    async def run(self) -> None:
        worker = self.worker
        assert worker._stop_event is not None and worker._slot_freed is not None
        stop, freed = worker._stop_event, worker._slot_freed
        why = Why.POLL
        backoff = self.poll
        try:
            while not stop.is_set():
                free = worker._free_slots()
                if free <= 0:
                    freed.clear()
                    await freed.wait()
                    if self._woken:
                        why = Why.LOCAL
                    continue
                self._woken = False
                try:
                    claimed = await self._claim_round(why, free)
                except Exception as exc:  # the loop must outlive any failure
                    self._end_round()
                    if isinstance(exc, StoreError):
                        log.warning("claim failed: %s; retrying in %.1fs", exc, backoff)
                    else:
                        log.exception("claim failed; retrying in %.1fs", backoff)
                    await self.pause(backoff)
                    backoff = min(backoff * 2, STORE_ERROR_BACKOFF_MAX)
                    why = Why.POLL
                    continue
                self._end_round(claimed)
                backoff = self.poll
                if claimed >= free:
                    why = Why.SLOT
                    continue
                if why is Why.STORE and not claimed:
                    # The store said something changed and none of it was due: a delayed
                    # run, maybe, that the timer loop has not heard of (even after a
                    # wake-up for due runs: the claim may have cleared another's).
                    worker.timers_hint.set()
                why = await self._idle()
        finally:
            self._end_round()
            work, self._work = self._work, None
            if work is not None:
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)

    async def _claim_round(self, why: Why, free: int) -> int:
        """Claim up to ``free`` runs and start them; return how many."""
        now = self.loop.time()
        full_due = self.plan.full_due(now)
        signalled = self._signalled if why is Why.STORE else None
        hot = None if why is Why.POLL else self.plan.targeted(now, signalled or ())
        if hot is None or (why is Why.SLOT and full_due):
            # Saturated (SLOT), a targeted claim would fill every slot that frees with the
            # busy workflows: one full claim per poll interval lets the others in.
            return await self._claim(self.plan.full(now), free)
        claimed = await self._claim(hot, free)
        if claimed < free and (full_due or (not claimed and signalled is None)):
            rest = self.plan.full(now, leave_out=hot)
            if rest:
                claimed += await self._claim(rest, free - claimed)
        return claimed

    async def _claim(self, order: list[str], limit: int) -> int:
        worker = self.worker
        ttl = worker.options.lock_ttl
        leases = await worker.store.claim_runs(worker.worker_id, order, limit, ttl, CLAIM_AHEAD)
        started = 0
        if leases:
            worker.store_clock.note(claimed_at(leases[0], ttl), self.loop.time())
            self.plan.note(leases, self.loop.time())
            plan = worker.isolation.plan(leases, len(worker.active_runs))
            for lease in plan.start:
                worker._start(self.definitions[lease.run.workflow], lease)
            if plan.alone is not None:
                worker._start(self.definitions[plan.alone.run.workflow], plan.alone, alone=True)
            if plan.back:
                await worker.hand_back(plan.back)
            started = len(plan.start) + (plan.alone is not None)
        for run in leases.expired:
            await self._expired(run)
        return started

    async def _expired(self, run: RunRecord) -> None:
        """Tell the run's workflow that this claim ended the run because it expired
        (``WorkflowDefinition.on_expired``)."""
        definition = self.definitions.get(run.workflow)
        hook = definition.on_expired if definition is not None else None
        if hook is None:
            return
        try:
            await hook(run)
        except Exception:  # the claim loop must outlive the hook
            log.exception("on_expired of workflow %r failed for run %s", run.workflow, run.run_id)

    async def _idle(self) -> Why:
        """Wait for new work, a local wake-up or stop; at most ``claim_poll_interval``."""
        stop = self.worker._stop_event
        assert stop is not None
        if self._woken or stop.is_set():
            return Why.LOCAL
        work = self._work
        if work is None:
            work = self._work = asyncio.ensure_future(
                self.worker.store.wait_for_work(self.names, self.poll)
            )
            self._work_started = self.loop.time()
            work.add_done_callback(self._work_returned)
        if not work.done():
            wake = self._wake = self.loop.create_future()
            try:
                await wake
            finally:
                self._wake = None
            if not work.done():
                return Why.LOCAL  # the store's wait goes on, for the next round
        self._work = None
        if work.cancelled():
            return Why.POLL
        exc = work.exception()
        if exc is not None:
            log.warning("waiting for work failed: %s", exc)
            await self.pause(self.poll)
            return Why.POLL
        self._signalled = work.result()
        early = self._work_ended - self._work_started < EARLY_RETURN * self.poll
        return Why.STORE if early or self._signalled else Why.POLL

    def _work_returned(self, work: asyncio.Future[Sequence[str] | None]) -> None:
        self._work_ended = self.loop.time()
        _resolve(self._wake)

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds``; less when woken (``wake``, stop, the store)."""
        stop = self.worker._stop_event
        if stop is None or stop.is_set():
            return
        wake = self._wake = self.loop.create_future()
        timer = self.loop.call_later(seconds, _resolve, wake)
        try:
            await wake
        finally:
            timer.cancel()
            self._wake = None


def _resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
