"""WorkflowTestEnv: run workflows in tests with virtual time and injected crashes.

It replaces Celery's ``task_always_eager``: a real worker and a MemoryStore run in the
test's event loop, on a virtual clock that jumps ahead whenever nothing is left to do
but wait. Sleeps, delays, retry backoffs, signal timeouts and schedules happen at once,
so a test of a workflow that sleeps a day runs in milliseconds::

    async with WorkflowTestEnv(workflows=[onboarding]) as env:
        handle = await env.submit("onboarding", {"user": 7})
        assert await env.result(handle) == "welcomed"

:meth:`WorkflowTestEnv.check_crash_safety` runs a workflow once per checkpoint (every
journal write, before and after, and the recording of the outcome), killing the
worker there each time, and checks that the result never changes; see
:class:`CrashReport`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pyrula.workflows.client import RunHandle, WorkflowClient, outcome_of
from pyrula.workflows.engine.control import Crash
from pyrula.workflows.engine.execution import RunExecution
from pyrula.workflows.errors import DurableInvocationError, PyrulaError, RunCancelled
from pyrula.workflows.options import WorkerOptions
from pyrula.workflows.projections import Projection, next_delivery_at
from pyrula.workflows.records import RunRecord
from pyrula.workflows.registry import Registry, WorkflowDefinition, default_registry
from pyrula.workflows.stores.flow import RATE_SKIP_WINDOW, refill
from pyrula.workflows.stores.memory import MemoryStore
from pyrula.workflows.stores.memory import claims as memory_claims
from pyrula.workflows.stores.memory.state import MemoryState
from pyrula.workflows.triggering import next_batch_at
from pyrula.workflows.triggers import BatchTrigger
from pyrula.workflows.worker import WorkflowWorker

LOCK_TTL = 30.0
SETTLE_ROUNDS = 5
BUSY_LIMIT = 30.0
"""Real seconds runs may keep executing before ``result`` gives up on them."""


class WorkflowStalled(PyrulaError, AssertionError):
    """The run can never finish: it waits for something no timer will bring (a signal?)."""


class VirtualClock:
    """A clock that moves only when told to. Thread-safe; callable like ``time.time``."""

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def set(self, when: float) -> None:
        with self._lock:
            self._now = max(self._now, when)


class WorkflowTestEnv:
    """A worker on a MemoryStore with a virtual clock. Use ``async with``."""

    def __init__(
        self,
        workflows: Iterable[WorkflowDefinition] | None = None,
        *,
        registry: Registry | None = None,
        start: float | None = None,
        triggers: Iterable[BatchTrigger] | None = None,
        projections: Iterable[Projection] | None = None,
        _observer: _CrashInjector | None = None,
    ) -> None:
        self.registry = registry or default_registry
        self.clock = VirtualClock(start)
        self.store = MemoryStore(clock=self.clock)
        self.client = WorkflowClient(self.store, registry=self.registry)
        self.worker = WorkflowWorker(
            store=self.store,
            workflows=workflows,
            registry=self.registry,
            observer=_observer,
            triggers=triggers,
            projections=projections,
            options=WorkerOptions(
                claim_poll_interval=0.005,
                timer_poll_interval_s=0.005,
                schedule_poll_interval=0.005,
                trigger_poll_interval=0.005,
                projection_poll_interval=0.005,
                orphan_scan_interval=0.005,
                lock_ttl=LOCK_TTL,
                durable_backoff_after=0.0,  # every backoff is a timer, so time skips it
                shutdown_grace=1.0,
                cancel_timeout=1.0,
            ),
        )
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> WorkflowTestEnv:
        self._task = asyncio.create_task(self.worker.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.worker.stop()
        if self._task is not None:
            await self._task

    # -- running -------------------------------------------------------------------------
    async def submit(
        self, workflow: str | WorkflowDefinition, params: Mapping[str, Any] | None = None, **kw: Any
    ) -> RunHandle:
        """Submit a run (same arguments as ``WorkflowClient.submit``)."""
        return await self.client.submit(workflow, params, **kw)

    async def result(self, handle: RunHandle) -> Any:
        """Run until ``handle``'s run ends, skipping virtual time; return its outcome."""
        while True:
            await self._settle()
            record = await handle.record()
            if record.is_terminal:
                return outcome_of(record)
            upcoming = await self._next_event()
            if upcoming is None:
                raise WorkflowStalled(
                    f"run {handle.run_id!r} is {record.status.value}"
                    + (f" for signal {record.wait_signal!r}" if record.wait_signal else "")
                    + " and no timer will wake it"
                )
            self._jump(upcoming)

    async def run(
        self, workflow: str | WorkflowDefinition, params: Mapping[str, Any] | None = None, **kw: Any
    ) -> Any:
        """Submit and return the result."""
        return await self.result(await self.submit(workflow, params, **kw))

    async def advance(self, duration: float | timedelta) -> None:
        """Move virtual time forward, letting everything due on the way happen in order."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
        target = self.clock() + seconds
        while True:
            await self._settle()
            upcoming = await self._next_event()
            if upcoming is None or upcoming > target:
                break
            self._jump(upcoming)
        self._jump(target)
        await self._settle()

    # -- virtual time ------------------------------------------------------------------
    def _jump(self, when: float) -> None:
        self.clock.set(when)
        self.worker.timers_changed.set()
        self.worker.schedules_changed.set()
        self.worker.wake_claimers()

    async def _next_event(self) -> float | None:
        names = [d.name for d in self.worker.workflows]
        due = [await self.store.next_due_at(names), await self.store.next_schedule_at()]
        due += await self._batches_and_deliveries()
        return min((t for t in due if t is not None), default=None)

    async def _batches_and_deliveries(self) -> list[float | None]:
        """When each batch trigger's next batch and each projection's next run are ready."""
        names = self._names()
        due = [
            await next_batch_at(self.store, trigger)
            for trigger in self.worker.triggers
            if trigger.workflow in names
        ]
        due += [await next_delivery_at(self.store, item) for item in self.worker.projections]
        return due

    async def _settle(self) -> None:
        """Return once the worker has nothing it can do without time passing."""
        quiet = 0
        deadline = time.monotonic() + BUSY_LIMIT
        while quiet < SETTLE_ROUNDS:
            await asyncio.sleep(0.002)
            if self.worker.running or await self._claimable():
                quiet = 0
                if time.monotonic() > deadline:
                    raise WorkflowStalled(
                        f"the worker still had work after {BUSY_LIMIT:.0f}s of real time "
                        "(a step or workflow that never returns, or a projection that keeps "
                        "failing?)"
                    )
            else:
                quiet += 1

    async def _claimable(self) -> bool:
        """Whether a claim now would get a run (read-only: takes no rate token), or a
        schedule is due. A run held back by its flow control is not claimable: waiting
        for its next rate token is a timer like any other, so virtual time skips it."""
        state, now = self.store._s, self.clock()
        with state.lock:
            for workflow in self._names():
                for queue in memory_claims._queues(state, workflow, now).values():
                    if _owner_can_claim(state, queue, now):
                        return True
        if await self.store.due_schedules(1):
            return True
        now = self.clock()
        return any(t is not None and t <= now for t in await self._batches_and_deliveries())

    def _names(self) -> set[str]:
        return {d.name for d in self.worker.workflows}

    # -- crash-point testing -----------------------------------------------------------
    async def check_crash_safety(
        self,
        workflow: str | WorkflowDefinition,
        params: Mapping[str, Any] | None = None,
        *,
        expire_lease_early: bool = False,
    ) -> CrashReport:
        """Run ``workflow`` once cleanly, then once per checkpoint with a crash there.

        With ``expire_lease_early``, instead of dying at the checkpoint the worker is
        paused past its lease: the run is recovered and re-run while the paused execution
        carries on, and fencing must stop its late writes. Each run must end with the
        reference result (or the same error). The report counts each step's executions.
        """
        name = workflow.name if isinstance(workflow, WorkflowDefinition) else workflow
        definitions = self.worker.workflows
        reference = await _run_with(definitions, self.registry, name, params, _CrashInjector(None))
        report = CrashReport(reference=reference)
        for index in range(len(reference.checkpoints)):
            injector = _CrashInjector(index, expire_lease_early)
            trial = await _run_with(definitions, self.registry, name, params, injector)
            trial.crashed_at = reference.checkpoints[index]
            report.trials.append(trial)
        return report


def _owner_can_claim(state: MemoryState, runs: list[RunRecord], now: float) -> bool:
    """Whether a claim now would take one of an owner's due ``runs`` (FIFO order), by
    the rules of ``stores/flow.py``, without taking a rate token: runs whose rate key is
    out of tokens are passed over (within ``RATE_SKIP_WINDOW``); a cap holds them all."""
    for run in runs[:RATE_SKIP_WINDOW]:
        flow = run.flow
        cap = flow.owner_concurrency
        if cap is not None and memory_claims._running(state, run.workflow, run.owner) >= cap:
            return False
        if flow.rate_key is None or not flow.rate_per_second:
            return True
        bucket = refill(
            state.buckets.get(flow.rate_key), now, flow.rate_per_second, flow.rate_burst
        )
        if bucket.tokens >= 1.0:
            return True
    return False


@dataclass
class Trial:
    """One execution of the workflow in a crash-point check."""

    outcome: tuple[str, Any]
    """("result", value) or ("error", "module.Type: message")."""
    step_executions: Counter[str]
    checkpoints: list[str] = field(default_factory=list)
    crashed_at: str | None = None


@dataclass
class CrashReport:
    """The reference run and one trial per checkpoint."""

    reference: Trial
    trials: list[Trial] = field(default_factory=list)

    @property
    def failures(self) -> list[Trial]:
        return [t for t in self.trials if t.outcome != self.reference.outcome]

    def assert_safe(self) -> None:
        """Raise AssertionError naming every checkpoint whose crash changed the outcome."""
        if self.failures:
            lines = [f"reference outcome: {self.reference.outcome!r}"]
            lines += [f"crash {t.crashed_at}: {t.outcome!r}" for t in self.failures]
            raise AssertionError("\n".join(lines))

    def max_executions(self) -> dict[str, int]:
        """For each step, the most times it ran in any one trial."""
        most: Counter[str] = Counter()
        for trial in [self.reference, *self.trials]:
            for step_name, count in trial.step_executions.items():
                most[step_name] = max(most[step_name], count)
        return dict(most)


class _CrashInjector:
    """Counts checkpoints; at the chosen one, crashes (or expires the lease) once."""

    def __init__(self, crash_at: int | None, expire_lease_early: bool = False) -> None:
        self.crash_at = crash_at
        self.expire_early = expire_lease_early
        self.seen: list[str] = []
        self.steps: Counter[str] = Counter()
        self.env: WorkflowTestEnv | None = None
        self.fired = False

    def step_started(self, execution: RunExecution, name: str, attempt: int) -> None:
        self.steps[name] += 1

    async def checkpoint(self, execution: RunExecution, point: str) -> None:
        if self.fired:
            return
        index = len(self.seen)
        self.seen.append(point)
        if index != self.crash_at:
            return
        self.fired = True
        assert self.env is not None
        env = self.env
        env.clock.set(env.clock() + LOCK_TTL + 1)  # the lease lapses
        await env.store.recover_expired(max_recoveries=1000, limit=1000)
        if not self.expire_early:
            raise Crash()
        env.worker.wake_claimers()  # another claimant runs it while this one carries on
        await asyncio.sleep(0.01)


async def _run_with(
    definitions: list[WorkflowDefinition],
    registry: Registry,
    name: str,
    params: Mapping[str, Any] | None,
    injector: _CrashInjector,
) -> Trial:
    env = WorkflowTestEnv(definitions, registry=registry, _observer=injector)
    injector.env = env
    async with env:
        try:
            outcome: tuple[str, Any] = ("result", await env.run(name, params))
        except DurableInvocationError as exc:
            outcome = ("error", f"{exc.error_type}: {exc.error_message}")
        except RunCancelled as exc:
            outcome = ("cancelled", exc.status)
    return Trial(outcome=outcome, step_executions=injector.steps, checkpoints=list(injector.seen))
