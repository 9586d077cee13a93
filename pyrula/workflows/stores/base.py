"""The Store protocol: the parts a backend has, and the optional capabilities it may add.

The engine, the worker, the clients and the CLI speak only to these protocols. Records go
in and out (:mod:`pyrula.workflows.records`); no driver type crosses them, and driver
errors are translated to :mod:`pyrula.workflows.errors` at the store boundary.
:class:`~pyrula.workflows.stores.memory.MemoryStore` is the executable specification and
``tests/stores/`` is the conformance suite every backend must pass.

The core, :class:`Store`, is what running workflows needs: :class:`Lifecycle`,
:class:`RunStore` (the client side), :class:`QueueStore` (claims, leases, the journal,
timers, recovery), :class:`ScheduleStore` and :class:`WorkerRegistry`. Three more parts
serve a feature each: :class:`SignalStore` (signals), :class:`RunHistory` (forgetting
ended runs) and :class:`EventStore` (batch-trigger buffers, the ended-run feed, named
cursors). Code that uses one asks for it (:func:`signals_of`, :func:`history_of`,
:func:`events_of`), and a store without it is refused with ConfigurationError naming the
feature. Every bundled backend has every part (:class:`CompleteStore`).

Optional capabilities are declared protocols too, looked up with the ``*_of`` functions below
(``isinstance``, never an attribute probe or a module name): :class:`LeaseNews`,
:class:`ShardLeasing`, :class:`Reconciling`, :class:`NativePurge` and
:class:`BlockingFastPath`. A store that wraps another (:class:`Wrapping`: the archiving
store) offers the wrapped store's capabilities it does not have itself.

Rules every implementation keeps:

* **Store time.** Anything shared (lease expiry, when a run becomes claimable) is decided
  by the store's clock (:meth:`Lifecycle.now`), never the caller's.
* **Atomicity.** Each operation is atomic: it happens whole or not at all.
* **Fencing.** Every claim gives the run a new, larger ``lease_token``; terminate bumps it
  too. ``append_journal``, ``finish_run`` and ``release_run`` are refused with
  :class:`~pyrula.workflows.errors.LeaseLost` unless the run is ``running`` with exactly
  the token the caller holds.
* **Payloads are opaque.** ``params``, results, journal values and errors are JSON text
  the store keeps byte for byte.
* **No busy polling.** ``wait_run``, ``wait_for_work`` and ``wait_schedule_change``
  return early when the awaited thing happens in this process; across processes a store
  may watch a cheap change marker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pyrula.workflows.errors import ConfigurationError
from pyrula.workflows.records import (
    JournalEntry,
    Lease,
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


@dataclass(frozen=True)
class RenewResult:
    """What ``renew_leases`` found: runs whose lease is gone, runs asked to cancel."""

    lost: tuple[str, ...] = ()
    cancel_requested: tuple[str, ...] = ()


class Claimed(list[Lease]):
    """What ``claim_runs`` returns: the leases it took, as a list, and in ``expired`` the
    runs the claim ended instead of claiming because their ``expires_at`` had passed
    (each as it ended: ``cancelled`` with a ``RunExpired`` error), in the order it ended
    them. The worker tells the runs' workflows (``WorkflowDefinition.on_expired``)."""

    expired: list[RunRecord]

    def __init__(self, leases: Iterable[Lease] = (), expired: Iterable[RunRecord] = ()) -> None:
        super().__init__(leases)
        self.expired = list(expired)


class Lifecycle(Protocol):
    """Opening, closing and the clock: every store has them."""

    url: str
    """Where the store lives, with any password masked; used in messages."""

    async def open(self) -> None:
        """Connect and create or check the schema. Idempotent; called before first use."""

    async def close(self) -> None:
        """Release connections and wake every waiter. Idempotent.

        A ``wait_run`` woken this way returns the run as it last read it."""

    async def now(self) -> float:
        """The store's clock, epoch seconds."""


class RunStore(Protocol):
    """Runs, the client side: create, read, wait for, cancel, terminate, retry, signal."""

    async def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        """Store a queued run and wake a waiting worker; return it and whether it was created.

        With an ``idempotency_key`` already taken: the existing run and ``False`` when the
        workflow and params are equal, else
        :class:`~pyrula.workflows.errors.IdempotencyConflict`. Atomic under concurrent
        callers in any number of processes.
        """

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run, or None."""

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        """Runs matching every given filter, newest first, at most ``limit``."""

    async def wait_run(self, run_id: str, timeout: float | None) -> RunRecord:
        """Return the run once it is terminal, or as it is when ``timeout`` seconds pass.

        Raises :class:`~pyrula.workflows.errors.RunNotFound`. Must not busy-poll.
        """

    async def cancel_run(self, run_id: str) -> RunRecord:
        """Cancel: a queued, sleeping or waiting run becomes ``cancelled`` at once; a
        running run gets ``cancel_requested`` and its worker stops at the next step
        boundary. Its non-terminal child runs are cancelled the same way, recursively.
        A terminal run: :class:`~pyrula.workflows.errors.InvalidRunState`."""

    async def terminate_run(self, run_id: str) -> RunRecord:
        """End the run at once as ``terminated`` and bump its token, so the worker that
        holds it can write nothing more; its non-terminal children are terminated too.
        A terminal run: InvalidRunState."""

    async def retry_run(
        self, run_id: str, remove: Sequence[int] = (), *, seen_claims: int | None = None
    ) -> RunRecord:
        """Requeue a failed, cancelled, terminated or dead run so it continues, and
        remove its journal entries at the positions ``remove`` (positions without one
        are passed over), in one atomic step.

        Which entries go is the engine's decision (:mod:`pyrula.workflows.engine.rerun`:
        the step that failed the run, so it runs again while the others replay). With
        ``seen_claims``, only if the run's ``claims`` is exactly that (it has not run
        again since the caller read its journal), else InvalidRunState and nothing
        changes. Clears the error, the result, ``finished_at``, ``failed_position``,
        ``cancel_requested`` and the recovery count. Other statuses: InvalidRunState.
        """


class QueueStore(Protocol):
    """The queue and leases, the worker side: claims, leases, the journal, timers and
    recovery. Every write a lease holder makes is fenced by its token."""

    async def wait_for_work(self, workflows: Sequence[str], timeout: float) -> Sequence[str] | None:
        """Return when a run of one of ``workflows`` may have become claimable, or after
        ``timeout`` seconds. Spurious returns are allowed.

        Returns the workflows whose signal ended the wait when the store can tell that
        the signal was for runs claimable at once (a claim of them that finds none lost
        them to another claimer), else None: a timeout, a close, a delayed or
        rate-limited run, a store that cannot tell. A store that names some must signal
        the others that have new work again at the next wait, so that the caller may
        claim from the named ones alone."""

    async def claim_runs(
        self,
        worker_id: str,
        workflows: Sequence[str],
        limit: int,
        lease_ttl: float,
        ahead: float = 0.0,
    ) -> Claimed:
        """Claim up to ``limit`` claimable runs of the given workflows, fairly.

        Claimable: ``queued`` with ``available_at <= now + ahead``, and allowed by the run's
        :class:`~pyrula.workflows.records.FlowControl`: a token in its rate bucket (taken
        by the claim) and fewer than ``owner_concurrency`` running runs of its workflow
        and owner. Held-back runs stay queued.

        Order: deficit round robin across owners (tenants) per workflow, one run per
        turn: the owner served least recently goes next; an owner that becomes active
        (its first queued run while it had none) is placed as served *now*, so idle
        owners bank no credit and a newly active one does not jump the queue. Within an
        owner, FIFO by ``(available_at, submission)``; a run whose rate key is out of
        tokens keeps its place while runs of other keys behind it go by (looking at most
        ``RATE_SKIP_WINDOW`` runs ahead, see ``stores/flow.py``); an owner at its
        ``owner_concurrency`` cap is skipped for this claim. A queued run whose
        ``expires_at`` has passed is not claimed: it ends ``cancelled`` with a
        ``RunExpired`` error (see ``rules.expired_error``), waking its waiters, and the
        claim returns it as it ended in ``Claimed.expired`` (only that claim: it reports
        each expired run once). A claim clears ``expires_at``: a run that started never
        expires.

        Each claimed run becomes ``running`` with a new larger ``lease_token``, the lease
        expiring ``lease_ttl`` seconds from now, ``claims`` incremented and
        ``started_at`` set on the first claim. Runs of other workflows are never taken.

        ``ahead`` lets a worker claim a delayed run just before its time, so that the
        store's round trip is not added to the run's start: such a run's ``started_at``
        is its ``available_at``, and the caller must not start it before then (the
        worker holds it until its time, see ``WorkflowWorker``). Flow control is
        checked as of now.
        """

    async def next_due_at(self, workflows: Sequence[str]) -> float | None:
        """The earliest time after now at which something of these workflows becomes
        due, or None.

        That is the minimum, over times strictly after now, of: a queued run's
        ``available_at``; a sleeping or waiting run's ``wake_at``; for a due run held back
        by its rate limit, when its bucket has a token again (runs held by
        ``owner_concurrency`` are left out: the finish that frees a slot wakes claimers).
        The worker's timer loop sleeps until then, so delayed, sleeping and rate-limited
        runs start on time without polling.
        """

    async def fire_timers(self, limit: int) -> int:
        """Queue up to ``limit`` sleeping or waiting runs whose ``wake_at`` has passed,
        oldest ``wake_at`` first; return how many. Wakes claimers of those workflows."""

    async def renew_leases(
        self, worker_id: str, leases: Sequence[tuple[str, int]], lease_ttl: float
    ) -> RenewResult:
        """Extend each ``(run_id, token)`` lease to ``now + lease_ttl``.

        Leases whose token is no longer current, or whose run is not running, are
        reported lost, except a run that ended under that very token (its finish crossed
        this renewal): that is neither lost nor renewed. Runs with ``cancel_requested``
        are reported.
        """

    async def recover_expired(self, max_recoveries: int, limit: int) -> RecoveryReport:
        """Requeue up to ``limit`` running runs whose lease expired.

        Each recovery increments ``recoveries``; a run whose count would exceed
        ``max_recoveries`` becomes ``dead`` instead (it keeps killing its workers) with
        an error saying so.
        """

    async def suspend_run(self, run_id: str, token: int, wait: Wait) -> bool:
        """Release a running run until what ``wait`` names happens; fenced.

        The run becomes ``sleeping`` (only ``wake_at``) or ``waiting`` (a signal or a
        child, with ``wake_at`` as an optional deadline) and holds no lease. Returns
        False and changes nothing when the wait is already over: ``wake_at <= now``, a
        signal of that name is pending, or the child run is terminal.
        """

    async def finish_run(
        self, run_id: str, token: int, outcome: Outcome, entry: JournalEntry | None = None
    ) -> RunRecord:
        """Record the run's terminal outcome (completed, failed or cancelled) and its
        ``failed_position``, fenced.

        ``entry``, the journal entry of the run's last step, is written in the same atomic
        call, as :meth:`append_journal` would write it (an identical entry already there
        is fine; a different one raises NondeterminismError and the run stays running).
        The engine sends the last step's entry this way: one round trip instead of two,
        and the entry is durable exactly when the outcome is.

        Releases the lease and wakes every ``wait_run`` waiter. A parent waiting for
        this run (``wait_child``) is queued. Any way a run becomes terminal (cancel,
        terminate, dead-lettering) wakes such a parent the same way.
        """

    async def release_run(self, run_id: str, token: int, available_at: float | None = None) -> None:
        """Hand a running run back to the queue (graceful stop, or a later retry),
        fenced. It becomes claimable at ``available_at`` (default: now)."""

    async def set_progress(self, run_id: str, token: int, state: str, info: str) -> None:
        """Record a running run's custom state and its JSON ``info``; fenced. Visible to
        every reader at once; kept after the run ends."""

    async def load_journal(self, run_id: str) -> list[JournalEntry]:
        """The run's journal entries in position order."""

    async def append_journal(self, token: int, entry: JournalEntry) -> bool:
        """Record ``entry`` at its position, fenced by ``token``; return ``cancel_requested``.

        Any free position may be written (steps run concurrently by ``ctx.gather`` finish
        in any order). A taken position whose entry is identical in kind, name, ok and
        value (a retried write whose reply was lost) is accepted without change. A
        different entry at a taken position raises
        :class:`~pyrula.workflows.errors.NondeterminismError`; a stale token, LeaseLost.
        """

    async def start_child(self, token: int, entry: JournalEntry, child: NewRun) -> RunRecord:
        """Create ``child`` (its ``parent_run_id`` set) and journal ``entry`` in one atomic
        step, fenced by the parent's token. Idempotent: if a run with ``child.run_id``
        exists it is returned and the entry, if identical, accepted."""


class ScheduleStore(Protocol):
    """Schedules, and the compare-and-set that fires each slot once."""

    async def create_schedule(
        self, schedule: ScheduleRecord, *, replace: bool = False
    ) -> ScheduleRecord:
        """Store a schedule, its ``overlap`` policy included. An existing id raises
        ScheduleExists unless ``replace``; with ``replace`` the definition is overwritten
        (``last_fire_at`` and ``last_run_id`` kept)."""

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        """The schedule, or None."""

    async def list_schedules(self, *, workflow: str | None = None) -> list[ScheduleRecord]:
        """Schedules ordered by id."""

    async def update_schedule(
        self,
        schedule_id: str,
        *,
        enabled: bool | None = None,
        params: str | None = None,
        next_fire_at: float | None = None,
    ) -> ScheduleRecord:
        """Change the given fields. Unknown id: ScheduleNotFound."""

    async def delete_schedule(self, schedule_id: str) -> bool:
        """Remove a schedule; False if there was none."""

    async def due_schedules(self, limit: int) -> list[ScheduleRecord]:
        """Enabled schedules whose ``next_fire_at <= now``, earliest first."""

    async def next_schedule_at(self) -> float | None:
        """The earliest ``next_fire_at`` of an enabled schedule, or None."""

    async def wait_schedule_change(self, seen: str | None, timeout: float) -> str:
        """The schedules' change marker: with ``seen=None``, the current one at once;
        else the current one as soon as it differs from ``seen``, or ``seen`` after
        ``timeout`` seconds (or once the store closes).

        A marker is an opaque string that every ``create_schedule``, ``update_schedule``
        and ``delete_schedule`` that removed one moves, whatever process made it
        (``fire_schedule`` need not). A schedule loop reads it before it reads the
        schedules and waits on it between looks, so a schedule created or resumed
        elsewhere fires its first slot on time. Must not busy-poll.
        """

    async def fire_schedule(
        self,
        schedule_id: str,
        expected_next: float,
        fired_slot: float,
        next_fire_at: float,
        run: NewRun | None,
    ) -> RunRecord | None:
        """Fire one slot: compare-and-set, then create the run, as one atomic operation.

        Only if the schedule exists, is enabled and its ``next_fire_at == expected_next``:
        set ``last_fire_at = fired_slot`` and ``next_fire_at``, create ``run`` (its
        idempotency key names schedule and slot), set ``last_run_id`` to the id of the
        run that holds the slot (``run.run_id``, or the existing run its idempotency key
        names), and return that run. Otherwise None and nothing changes, so with any
        number of workers each slot fires once.

        ``run=None`` skips the slot (``overlap="skip"``): the same compare-and-set moves
        ``next_fire_at`` (and ``updated_at``) only, creates no run, keeps ``last_fire_at``
        (the last slot fired) and ``last_run_id``, and returns None.
        """


class WorkerRegistry(Protocol):
    """The workers that heartbeat, for inspection."""

    async def heartbeat(self, info: WorkerInfo) -> None:
        """Record a worker's liveness (``last_seen`` is set to store time)."""

    async def remove_worker(self, worker_id: str) -> None:
        """Forget a worker that stopped cleanly."""

    async def list_workers(self) -> list[WorkerInfo]:
        """Every worker that heartbeated and was not removed, a killed one too, most
        recent ``last_seen`` first (``pyrula.workflows.inspection`` judges which are
        alive)."""


@runtime_checkable
class RunHistory(Protocol):
    """Forgetting ended runs: one (``RunHandle.forget``), or by age (the worker's
    ``run_retention``)."""

    async def delete_run(self, run_id: str) -> bool:
        """Forget a terminal run: its record, journal, signals and idempotency key.

        False when there is no such run; a run that has not ended: InvalidRunState.
        """

    async def purge_runs(self, ended_before: float, limit: int) -> int:
        """Forget up to ``limit`` runs that ended before ``ended_before`` (store time), each
        as :meth:`delete_run` forgets one, those that ended first first; returns how many.

        A run that ended and was retried is not ended any more. Workers call this with
        ``WorkerOptions.run_retention``; several may at once.
        """


@runtime_checkable
class EventStore(Protocol):
    """Feeds and the cursors that keep a place in them: batch-trigger buffers, the
    ended-run feed and named cursors (batch triggers, projections, archival)."""

    async def ended_runs(self, after: tuple[float, str] | None, limit: int) -> list[RunRecord]:
        """Terminal runs in the order they ended: those whose ``(finished_at, run_id)`` is
        greater than ``after`` (None: from the first), ordered by ``(finished_at, run_id)``,
        at most ``limit``. The last one's ``(finished_at, run_id)`` is the cursor for the
        next page, so paging visits every ended run once even when many share a
        ``finished_at``. A run that ended and was retried is not ended any more (it leaves
        this listing until it ends again, with its new ``finished_at``).

        Run ids compare as strings (code point order: their UTF-8 bytes' order). A page
        shorter than ``limit`` had no more to show at that moment. Read from the index
        ``purge_runs`` uses, so a page costs about ``limit`` runs (plus those that ended
        at the cursor's very instant), not the history. ``limit <= 0``: ``[]``.
        """

    async def append_events(self, trigger: str, payloads: Sequence[str]) -> list[int]:
        """Append ``payloads`` (JSON texts, kept byte for byte) to ``trigger``'s buffer, in
        order, as one atomic operation stamped with store time; return their seqs.

        A trigger's seqs increase with every event and are never given out twice, also
        after the events are consumed. An empty ``payloads`` appends nothing: ``[]``.
        Trigger names are validated by the engine (:func:`~pyrula.workflows.triggers.
        check_name`); the store keeps any non-empty string apart from every other.
        """

    async def read_events(self, trigger: str, limit: int) -> list[TriggerEvent]:
        """The ``limit`` oldest events of ``trigger``'s buffer (those not consumed), oldest
        first. ``limit <= 0`` or an unknown trigger: ``[]``."""

    async def consume_events(self, trigger: str, first_seq: int, count: int) -> bool:
        """Remove the ``count`` oldest events of ``trigger``'s buffer, atomically, if the
        oldest is ``first_seq`` and there are at least ``count``; else change nothing and
        return False. Two workers firing the same batch: one removes it, the other gets
        False. ``count <= 0``: False, nothing changes."""

    async def get_cursor(self, name: str) -> str | None:
        """The value of the named cursor (an opaque string a loop keeps its place with:
        projections), or None if it was never set."""

    async def swap_cursor(self, name: str, expected: str | None, value: str) -> bool:
        """Compare-and-set: set the named cursor to ``value`` if its current value is
        ``expected`` (None: it was never set), atomically; else change nothing and return
        False."""


@runtime_checkable
class SignalStore(Protocol):
    """Signals: kept for a run, taken by it into its journal."""

    async def send_signal(self, run_id: str, name: str, payload: str) -> None:
        """Keep a signal (payload is JSON text) for the run; signals of one name queue
        in order. A run waiting for that name is queued at once.

        Unknown run: RunNotFound. A terminal run: InvalidRunState.
        """

    async def consume_signal(self, token: int, entry: JournalEntry) -> str | None:
        """Take the oldest pending signal named ``entry.name`` and journal it; fenced.

        Atomically removes the signal and records ``entry`` with the signal's payload as
        its value; returns the payload. None (nothing written) when none is pending. If
        ``entry.position`` is already journaled as that signal (a retried call), returns
        the journaled value.
        """


@runtime_checkable
class Store(Lifecycle, RunStore, QueueStore, ScheduleStore, WorkerRegistry, Protocol):
    """The core protocol: durable state for runs, their journals, their leases, schedules
    and workers. What the engine needs to run workflows; see the module docstring for the
    parts and capabilities beyond it."""


@runtime_checkable
class CompleteStore(Store, SignalStore, RunHistory, EventStore, Protocol):
    """Every part: what each bundled backend implements (a store to wrap in an
    archiving store must be one)."""


# -- optional capabilities ---------------------------------------------------------------
@runtime_checkable
class LeaseNews(Protocol):
    """Pushes news of cancelled or terminated runs to the worker that holds them, so it
    renews at once instead of at its next interval."""

    async def wait_lease_news(self, worker_id: str, timeout: float) -> bool:
        """Return True as soon as a run that ``worker_id`` holds may have been cancelled
        or terminated (the worker then renews its leases at once, which says which);
        False after ``timeout`` seconds without such news, or once the store closes.
        Spurious True is allowed. ``cancel_run`` and ``terminate_run`` send the news to
        the holder of each running run they reach, from any process (MemoryStore has
        one); news sent while the worker was not waiting is kept for its next wait."""


@runtime_checkable
class ShardLeasing(Protocol):
    """A sharded store whose workers lease shards, each claiming its own first."""

    shard_lease_ttl: float
    """Seconds a shard lease lasts unless renewed."""

    async def shard_lease_loop(self, worker_id: str, interval: float | None = None) -> None:
        """Take and renew this worker's share of the shards every ``interval`` seconds
        (default: the store's), until cancelled; give them back then."""


@runtime_checkable
class Reconciling(Protocol):
    """A store with housekeeping of its own that a worker runs (the archiving store)."""

    async def reconcile_loop(self, worker_id: str, interval: float | None = None) -> None:
        """Run the store's housekeeping every ``interval`` seconds until cancelled;
        never raises on a store outage."""


@runtime_checkable
class NativePurge(Protocol):
    """A store that purges runs waiting to start its own way
    (see :func:`pyrula.workflows.purging.purge_queued`)."""

    async def purge_queued(self, workflows: Sequence[str], began: float, page_size: int) -> int:
        """Cancel the runs of ``workflows`` that are queued, never started and were
        created by ``began`` (store time), ``page_size`` at a time; return how many."""


class BlockingRuns(Protocol):
    """A store's blocking fast path: the calls a Celery-style caller makes per task, made
    in the calling thread. Thread-safe and fork-safe (``after_fork`` in the child)."""

    def ready(self) -> bool:
        """Whether it can take a call now (else the async path must)."""

    def create(self, new: NewRun) -> bool:
        """Create the run as ``create_run`` would; False, having stored nothing, when the
        async path must do it."""

    def get_run(self, run_id: str) -> RunRecord | None:
        """As ``RunStore.get_run``."""

    def wait_run(self, run_id: str, timeout: float | None) -> RunRecord:
        """As ``RunStore.wait_run``; blocks on the store, never polls."""

    def after_fork(self) -> None:
        """Forget the parent's connections (in a forked child)."""

    def close(self) -> None:
        """Close its connections; waits in other threads return."""


@runtime_checkable
class BlockingFastPath(Protocol):
    """A store with a :class:`BlockingRuns` fast path for the blocking client."""

    def blocking_runs(self) -> BlockingRuns | None:
        """A new fast path over this store, or None when it has none in its present
        configuration (a Valkey cluster)."""


@runtime_checkable
class Wrapping(Protocol):
    """A store over another one (``live``), which offers the capabilities of ``live``
    that it does not have itself."""

    @property
    def live(self) -> Store:
        """The store this one wraps."""


def _part(store: Lifecycle, kind: type[Any], needed_by: str) -> Any:
    if isinstance(store, kind):
        return store
    raise ConfigurationError(
        f"the store at {store.url} has no {kind.__name__}, which {needed_by} needs: "
        "use a store that implements it (every bundled store does)"
    )


def signals_of(store: Lifecycle, needed_by: str) -> SignalStore:
    """``store`` as its :class:`SignalStore` part; ConfigurationError naming what needs
    it (``needed_by``) when it has none."""
    found: SignalStore = _part(store, SignalStore, needed_by)
    return found


def history_of(store: Lifecycle, needed_by: str) -> RunHistory:
    """``store`` as its :class:`RunHistory` part (else ConfigurationError)."""
    found: RunHistory = _part(store, RunHistory, needed_by)
    return found


def events_of(store: Lifecycle, needed_by: str) -> EventStore:
    """``store`` as its :class:`EventStore` part (else ConfigurationError)."""
    found: EventStore = _part(store, EventStore, needed_by)
    return found


def _capability(store: object, kind: type[Any]) -> Any:
    """The object offering capability ``kind`` for ``store``: the store, or the store
    it wraps (:class:`Wrapping`, recursively); None when neither has it."""
    while not isinstance(store, kind):
        if not isinstance(store, Wrapping):
            return None
        store = store.live
    return store


def lease_news_of(store: object) -> LeaseNews | None:
    """The store's :class:`LeaseNews`, or None."""
    found: LeaseNews | None = _capability(store, LeaseNews)
    return found


def shard_leasing_of(store: object) -> ShardLeasing | None:
    """The store's :class:`ShardLeasing`, or None."""
    found: ShardLeasing | None = _capability(store, ShardLeasing)
    return found


def reconciling_of(store: object) -> Reconciling | None:
    """The store's :class:`Reconciling`, or None."""
    found: Reconciling | None = _capability(store, Reconciling)
    return found


def native_purge_of(store: object) -> NativePurge | None:
    """The store's :class:`NativePurge`, or None."""
    found: NativePurge | None = _capability(store, NativePurge)
    return found


def fast_path_of(store: object) -> BlockingFastPath | None:
    """The store's :class:`BlockingFastPath` (a wrapped store's, for a wrapper), or None."""
    found: BlockingFastPath | None = _capability(store, BlockingFastPath)
    return found
