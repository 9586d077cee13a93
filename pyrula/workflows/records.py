"""The records that cross the Store interface: frozen dataclasses, no driver types.

Payload fields (``params``, ``result``, journal ``value``, ``error``) are JSON text,
opaque to stores: a store keeps and returns them byte for byte.
Times are float seconds since the epoch on the store's clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class RunStatus(str, Enum):
    """Where a run is in its life.

    ``queued`` runs wait for a claim (a future ``available_at`` means delayed);
    ``running`` runs are held by a worker under a lease; ``sleeping`` runs wait for a
    time (``ctx.sleep``, a long retry backoff) and ``waiting`` runs for a signal or a
    child run, perhaps with a deadline; neither holds a worker. The rest are terminal
    and never change, except that ``retry`` moves a failed, cancelled, terminated or
    dead run back to ``queued``.
    """

    QUEUED = "queued"
    RUNNING = "running"
    SLEEPING = "sleeping"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TERMINATED = "terminated"
    DEAD = "dead"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
        RunStatus.TERMINATED,
        RunStatus.DEAD,
    }
)
RETRYABLE_STATUSES = frozenset(
    {RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TERMINATED, RunStatus.DEAD}
)
DEFAULT_LOCK_TTL = 30.0
"""``WorkerOptions.lock_ttl``'s default, and a heartbeat's that did not say."""
DEFAULT_OWNER = ""
"""The tenant of runs submitted without an owner."""


@dataclass(frozen=True)
class FlowControl:
    """Limits a run carries from submission, enforced by the store at claim time.

    ``rate_key`` names a token bucket shared by every worker: at most ``rate_per_second``
    claims per second with bursts of ``rate_burst``. ``owner_concurrency`` caps how many
    runs of this workflow and owner may be ``running`` at once, across all workers.
    """

    rate_key: str | None = None
    rate_per_second: float | None = None
    rate_burst: float = 1.0
    owner_concurrency: int | None = None

    @property
    def is_empty(self) -> bool:
        return self.rate_key is None and self.owner_concurrency is None


NO_FLOW = FlowControl()


@dataclass(frozen=True)
class NewRun:
    """What ``create_run`` stores. ``params`` is JSON text."""

    run_id: str
    workflow: str
    params: str
    owner: str = DEFAULT_OWNER
    idempotency_key: str | None = None
    delay: float = 0.0
    """Seconds after the store's now before the run may be claimed (>= 0)."""
    start_at: float | None = None
    """Absolute time (epoch seconds) before which the run may not be claimed; wins over delay."""
    parent_run_id: str | None = None
    """Set on child runs (``ctx.run_child``): the parent is woken when the child ends."""
    flow: FlowControl = NO_FLOW
    expires_at: float | None = None
    """A run still queued at this time (epoch seconds) is never started: the claim that
    finds it ends it as cancelled with a ``RunExpired`` error. Cleared by the first claim:
    a run that started never expires."""
    generated_id: bool = False
    """True when ``run_id`` was made up at random (a uuid4: the client's ``submit``
    without a ``run_id``, or with ``fresh_id=True``), so no earlier run can hold it. A
    store may skip looking for one (an ArchivingStore skips its archive lookup); stores
    keep nothing of it, and a taken id is refused all the same."""


@dataclass(frozen=True)
class RunRecord:
    """A run as the store holds it."""

    run_id: str
    workflow: str
    params: str
    status: RunStatus
    owner: str
    idempotency_key: str | None
    created_at: float
    available_at: float
    """Earliest time the run may be claimed (meaningful while queued)."""
    updated_at: float
    started_at: float | None = None
    """When the run was first claimed."""
    finished_at: float | None = None
    result: str | None = None
    """JSON text of the workflow's return value, when completed."""
    error: str | None = None
    """:class:`~pyrula.workflows.serialization.ErrorInfo` JSON, when failed or dead."""
    worker_id: str | None = None
    """The worker holding the lease while running, else the last one that did."""
    lease_token: int = 0
    """Fencing token: goes up on every claim and on every terminate."""
    lease_expires_at: float | None = None
    cancel_requested: bool = False
    """Set by ``cancel_run`` on a running run; honoured at the next step boundary."""
    recoveries: int = 0
    """How many times the run was taken back from a worker whose lease expired."""
    claims: int = 0
    """How many times the run was claimed."""
    parent_run_id: str | None = None
    wake_at: float | None = None
    """When a sleeping run wakes, or a waiting run's deadline (None: no deadline)."""
    wait_signal: str | None = None
    """The signal name a waiting run waits for."""
    wait_child: str | None = None
    """The child run id a waiting run waits for."""
    flow: FlowControl = NO_FLOW
    expires_at: float | None = None
    progress_state: str | None = None
    """A custom state the running code reported (``StepContext.set_progress``)."""
    progress_info: str | None = None
    """JSON text reported with ``progress_state``."""
    failed_position: int | None = None
    """See :class:`Outcome`; kept until the run is retried."""

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal


@dataclass(frozen=True)
class Lease:
    """A claimed run. ``token`` must accompany every write for this run."""

    run: RunRecord
    token: int
    expires_at: float

    @property
    def run_id(self) -> str:
        return self.run.run_id


@dataclass(frozen=True)
class JournalEntry:
    """One recorded outcome at one position of a run's journal.

    ``kind`` is ``"step"`` for a step's final outcome. ``ok`` says whether ``value``
    (JSON text) is a result or an ErrorInfo (a ``backoff`` entry, and a ``child_result``
    of a child that did not complete, are not ok yet hold their own values).
    ``position`` starts at 0 and is unique per run.
    """

    run_id: str
    position: int
    kind: str
    name: str
    ok: bool
    value: str
    attempts: int = 1
    token: int = 0
    """The fencing token the write carried."""
    recorded_at: float = 0.0


@dataclass(frozen=True)
class Outcome:
    """The end of a run attempt, passed to ``finish_run``.

    ``status`` is one of completed, failed, cancelled. ``result`` is JSON text for
    completed; ``error`` is ErrorInfo JSON for failed.
    """

    status: RunStatus
    result: str | None = None
    error: str | None = None
    failed_position: int | None = None
    """For ``failed``: the journal position of the step whose error failed the run, when
    the engine knows it; ``retry_run`` clears that step so it runs again."""


@dataclass(frozen=True)
class Wait:
    """What a suspended run waits for, passed to ``suspend_run``.

    Only ``wake_at``: the run sleeps until then. ``signal`` or ``child``: it waits for
    that, with ``wake_at`` as an optional deadline.
    """

    wake_at: float | None = None
    signal: str | None = None
    child: str | None = None

    def __post_init__(self) -> None:
        if self.signal is None and self.child is None and self.wake_at is None:
            raise ValueError("a Wait needs a wake_at, a signal or a child")
        if self.signal is not None and self.child is not None:
            raise ValueError("a run waits for a signal or a child, not both")


@dataclass(frozen=True)
class ScheduleRecord:
    """A stored schedule. Exactly one of ``cron`` and ``every`` (seconds) is set.

    ``next_fire_at`` is the next slot (epoch seconds); ``last_fire_at`` the last slot fired.
    ``params`` is JSON text. ``timezone`` is an IANA name cron fields are read in.
    ``overlap`` is the overlap policy (``schedules.OVERLAP_POLICIES``): ``"allow_all"``
    fires every slot; ``"skip"`` skips a slot while the run of the last fired slot has not
    ended. ``last_run_id`` is that run's id (set by ``fire_schedule``), or None.
    """

    schedule_id: str
    workflow: str
    params: str
    cron: str | None
    every: float | None
    timezone: str
    enabled: bool
    next_fire_at: float
    last_fire_at: float | None = None
    owner: str = DEFAULT_OWNER
    created_at: float = 0.0
    updated_at: float = 0.0
    overlap: str = "allow_all"
    last_run_id: str | None = None


@dataclass(frozen=True)
class RecoveryReport:
    """What ``recover_expired`` did."""

    requeued: tuple[str, ...] = ()
    dead: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkerInfo:
    """A worker's last heartbeat."""

    worker_id: str
    workflows: tuple[str, ...]
    hostname: str
    pid: int
    started_at: float
    last_seen: float
    running: int
    lock_ttl: float = DEFAULT_LOCK_TTL
    """The worker's ``lock_ttl`` (the default for a heartbeat that did not say): it
    heartbeats every third of it, so one silent for longer is dead."""


@dataclass(frozen=True)
class TriggerEvent:
    """One event waiting in a batch trigger's buffer (:mod:`pyrula.workflows.triggers`).

    ``seq`` orders the trigger's events: it increases with every event appended to that
    trigger and is never given out twice, also after events are consumed. ``payload`` is
    JSON text the store keeps byte for byte; ``created_at`` is the store time at which
    the event was appended.
    """

    seq: int
    payload: str
    created_at: float
