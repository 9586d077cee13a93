"""WorkerOptions: every worker setting, its default and its unit."""

from __future__ import annotations

from dataclasses import dataclass, fields

from pyrula.workflows.errors import ConfigurationError
from pyrula.workflows.records import DEFAULT_LOCK_TTL
from pyrula.workflows.serialization import DEFAULT_MAX_PAYLOAD_BYTES

PURGE_INTERVAL_MAX = 60.0
"""The longest a worker waits between two purges of ended runs (``run_retention``)."""
PURGE_INTERVAL_MIN = 1.0
"""The shortest: a tiny retention does not turn the purge into a busy loop."""


@dataclass(frozen=True)
class WorkerOptions:
    """Settings of a :class:`~pyrula.workflows.WorkflowWorker`. Times are seconds."""

    max_concurrent_runs: int = 50
    """Runs executing at once on this worker, across all its workflows."""
    claim_poll_interval: float = 0.1
    """How often the worker's idle claim loop asks the store for work, for all its
    workflows at once (it also wakes on new work); while busy, how often a claim looks at
    every workflow, not only those with recent runs."""
    timer_poll_interval_s: float = 5.0
    """Longest the timer loop sleeps before looking for runs whose time has come."""
    timer_max_batch: int = 100
    """Most timers the timer loop handles per tick."""
    orphan_scan_interval: float = 60.0
    """How often to requeue runs whose worker stopped renewing their lease."""
    shutdown_grace: float = 30.0
    """On stop, how long in-flight runs may go on before they are cancelled and requeued."""
    cancel_timeout: float = 5.0
    """After the grace, how long a cancelled run gets to unwind before it is abandoned."""
    shard_lease_interval: float = 10.0
    """How often shard leases are renewed (sharded stores only)."""
    lock_ttl: float = DEFAULT_LOCK_TTL
    """A run's lease lasts this long; it is renewed every third of it while the run lives."""
    schedule_poll_interval: float = 30.0
    """Longest the schedule loop sleeps before looking for due schedules."""
    trigger_poll_interval: float = 1.0
    """Longest the trigger loop sleeps between two looks at the batch triggers' buffers
    (a trigger whose oldest event is due sooner is looked at then)."""
    projection_poll_interval: float = 1.0
    """Longest the projection loop sleeps between two looks for newly ended runs."""
    durable_backoff_after: float = 5.0
    """Step retry backoffs at least this long suspend the run on a timer (freeing its slot)
    instead of sleeping in the worker."""
    max_recoveries: int = 5
    """A run taken back from dead workers more often than this is dead-lettered."""
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    """Largest encoded step result or run result."""
    run_retention: float | None = None
    """How long a run is kept after it ended; older ones are deleted (record, journal,
    signals, idempotency key) every purge interval. None (or 0) keeps every run. It
    applies to the whole store, whatever workflows this worker serves."""
    worker_id: str | None = None
    """This worker's name (default: host-pid-random)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "worker_id":
                if value is not None and (not isinstance(value, str) or not value):
                    raise ConfigurationError("WorkerOptions.worker_id must be a non-empty string")
                continue
            if f.name == "run_retention" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigurationError(f"WorkerOptions.{f.name} must be a number, got {value!r}")
            if f.name in ("durable_backoff_after", "run_retention"):
                if not value >= 0:  # written so that NaN is refused too
                    raise ConfigurationError(f"WorkerOptions.{f.name} must be >= 0, got {value!r}")
            elif not value > 0:
                raise ConfigurationError(f"WorkerOptions.{f.name} must be > 0, got {value!r}")
        for name in (
            "max_concurrent_runs",
            "timer_max_batch",
            "max_recoveries",
            "max_payload_bytes",
        ):
            if not isinstance(getattr(self, name), int):
                raise ConfigurationError(f"WorkerOptions.{name} must be an int")

    @property
    def purge_interval(self) -> float:
        """How often a worker purges ended runs (with a ``run_retention``): every minute,
        or every half of a shorter retention, but at most once a second."""
        half = (self.run_retention or PURGE_INTERVAL_MAX) / 2
        return max(PURGE_INTERVAL_MIN, min(PURGE_INTERVAL_MAX, half))

    @property
    def lease_renew_interval(self) -> float:
        """Leases are renewed at a third of their TTL, so two renewals may fail in a row."""
        return self.lock_ttl / 3
