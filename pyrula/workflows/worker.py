"""WorkflowWorker: the claim loop, lease renewal, the timer loop and orphan recovery."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pyrula.workflows import log_context, loops, telemetry
from pyrula.workflows.claiming import ClaimLoop, StoreClock, claimed_at
from pyrula.workflows.client import WorkflowClient
from pyrula.workflows.engine.control import being_cancelled
from pyrula.workflows.engine.execution import (
    ExecutionObserver,
    ExecutionSettings,
    RunExecution,
    call_store,
)
from pyrula.workflows.engine.runner import RunEnd, execute_run
from pyrula.workflows.engine.threads import StepThreadPool
from pyrula.workflows.errors import ConfigurationError, LeaseLost, RunNotFound, StoreError
from pyrula.workflows.faults import fault_point
from pyrula.workflows.isolation import Isolation
from pyrula.workflows.options import WorkerOptions
from pyrula.workflows.projections import Projection, default_projections, projection_loop
from pyrula.workflows.records import Lease
from pyrula.workflows.registry import Registry, WorkflowDefinition, default_registry
from pyrula.workflows.stores.base import Store, reconciling_of, shard_leasing_of
from pyrula.workflows.triggering import trigger_loop
from pyrula.workflows.triggers import BatchTrigger, default_triggers

log = logging.getLogger("pyrula.workflows.worker")


@dataclass
class _Active:
    lease: Lease
    task: asyncio.Task[None] | None = None
    execution: RunExecution | None = None
    lost: bool = False
    """The lease was lost; the renew loop cancelled the task (loops.renew_once)."""
    cancel_requested: bool = False
    """A cancel the renew loop learnt before the execution started (a held run)."""
    released: bool = field(default=False)


class WorkflowWorker:
    """Claims and executes runs of its workflows until :meth:`stop` is called.

    ``workflows`` restricts the worker to those definitions; by default it serves every
    ``@workflow`` imported into the process. ``run()`` blocks until ``stop()``; ``stop()``
    may be called from a signal handler, another coroutine or another thread.
    """

    def __init__(
        self,
        store: Store | None = None,
        workflows: Iterable[WorkflowDefinition] | None = None,
        options: WorkerOptions | None = None,
        *,
        registry: Registry | None = None,
        observer: ExecutionObserver | None = None,
        on_run_end: Callable[[str], None] | None = None,
        triggers: Iterable[BatchTrigger] | None = None,
        projections: Iterable[Projection] | None = None,
    ) -> None:
        if store is None:
            from pyrula.workflows.stores import open_store

            store = open_store()
        self.store = store
        self.options = options or WorkerOptions()
        self._registry = registry or default_registry
        self._observer = observer
        self.on_run_end = on_run_end
        """Called with the run id, on the event loop, each time a run's execution here
        ends, however it ends (completed, failed, cancelled, suspended, lost, handed
        back); it must not raise. ``pyrula worker --max-tasks-per-child`` counts them."""
        self._explicit = list(workflows) if workflows is not None else None
        self._triggers = list(triggers) if triggers is not None else None
        for trigger in self._triggers or ():
            if not isinstance(trigger, BatchTrigger):
                raise ConfigurationError(f"triggers= takes batch_trigger(...)s, got {trigger!r}")
        self._projections = list(projections) if projections is not None else None
        for item in self._projections or ():
            if not isinstance(item, Projection):
                raise ConfigurationError(f"projections= takes @projection functions, got {item!r}")
        for definition in self._explicit or ():
            if not isinstance(definition, WorkflowDefinition):
                raise ConfigurationError(
                    f"workflows= takes @workflow-decorated functions, got {definition!r}"
                )
        sharded = shard_leasing_of(store)
        ttl = None if sharded is None else sharded.shard_lease_ttl
        interval = self.options.shard_lease_interval
        # The default may not fit a store given a short TTL (and its own interval): the
        # store's interval applies then. A value set here that cannot work is refused.
        if ttl is not None and interval >= ttl and interval != WorkerOptions.shard_lease_interval:
            raise ConfigurationError(
                f"shard_lease_interval ({self.options.shard_lease_interval}s) must be shorter "
                f"than the store's shard_lease_ttl ({ttl}s), or shard leases lapse between "
                "renewals"
            )
        self.worker_id = self.options.worker_id or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self.client = WorkflowClient(
            store, registry=self._registry, max_payload_bytes=self.options.max_payload_bytes
        )
        self.active_runs: dict[str, _Active] = {}
        self.isolation = Isolation(self.options.max_recoveries)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._stop_requested = threading.Event()
        self._slot_freed: asyncio.Event | None = None
        self.started_at = 0.0
        self._claimer: ClaimLoop | None = None
        self.store_clock = StoreClock()
        """The store's clock on this process's event loop (claims and the timer loop read it)."""
        self._settings = ExecutionSettings(registry=self._registry)
        self.timers_changed = asyncio.Event()
        """Set when a run here suspended, so the timer loop recomputes its next wake-up."""
        self.timers_hint = asyncio.Event()
        """Set by the claim loop when the store signalled work and none of it was due (a
        delayed run submitted elsewhere, say): the timer loop recomputes its next wake-up,
        at most every ``loops.TIMER_HINT_GAP`` or so however many hints come."""
        self.schedules_changed = asyncio.Event()
        """Set to make the schedule loop look at the store's schedules now."""

    # -- public ------------------------------------------------------------------------
    @property
    def workflows(self) -> list[WorkflowDefinition]:
        return self._explicit if self._explicit is not None else self._registry.all()

    @property
    def triggers(self) -> list[BatchTrigger]:
        """The batch triggers this worker fires (those of the workflows it serves): the
        ``triggers=`` given, else every one defined with ``batch_trigger``."""
        return self._triggers if self._triggers is not None else default_triggers.all()

    @property
    def projections(self) -> list[Projection]:
        """The projections this worker delivers: the ``projections=`` given, else every
        one defined with ``@projection``."""
        if self._projections is not None:
            return self._projections
        return default_projections.all()

    @property
    def registry(self) -> Registry:
        """Where this worker looks up workflow definitions."""
        return self._registry

    @property
    def running(self) -> int:
        """Runs executing on this worker now."""
        return len(self.active_runs)

    def stop(self) -> None:
        """Stop claiming, let in-flight runs finish (up to ``shutdown_grace``), requeue the
        rest, and return from :meth:`run`. Safe from any thread or a signal handler."""
        self._stop_requested.set()
        loop, event = self._loop, self._stop_event
        if loop is None or event is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            # A closed loop means run() has already returned.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    async def run(self) -> None:
        """Serve until :meth:`stop`. Nothing is left claimed by this worker when it returns."""
        stop = self._arm_stop()
        log_context.bind(worker=self.worker_id)  # inherited by every task it starts
        self._slot_freed = slot_freed = asyncio.Event()
        definitions = {d.name: d for d in self.workflows}
        await self.store.open()
        self.started_at = await self.store.now()
        executor = StepThreadPool(self.options.max_concurrent_runs)
        self._settings = ExecutionSettings(
            executor=executor,
            max_payload_bytes=self.options.max_payload_bytes,
            store_retry_window=self.options.lock_ttl,
            durable_backoff_after=self.options.durable_backoff_after,
            registry=self._registry,
            observer=self._observer,
        )
        log.info(
            "worker %s serving %s on %s",
            self.worker_id,
            ", ".join(sorted(definitions)) or "no workflows",
            self.store.url,
        )
        claimers = []
        if definitions:  # one claim loop for every workflow (claiming.py)
            self._claimer = ClaimLoop(self, definitions)
            claimers.append(asyncio.create_task(self._claimer.run(), name="pyrula-claim"))
        names = list(definitions)
        housekeeping = [
            asyncio.create_task(loops.renew_loop(self, names), name="pyrula-renew"),
            asyncio.create_task(loops.orphan_loop(self), name="pyrula-orphans"),
            asyncio.create_task(loops.timer_loop(self, names), name="pyrula-timers"),
            asyncio.create_task(loops.schedule_loop(self), name="pyrula-schedules"),
        ]
        if self.options.run_retention:  # None or 0 keeps every run
            housekeeping.append(asyncio.create_task(loops.purge_loop(self), name="pyrula-purge"))
        triggers = [t for t in self.triggers if t.workflow in definitions]
        if triggers:
            housekeeping.append(
                asyncio.create_task(trigger_loop(self, triggers), name="pyrula-triggers")
            )
        projections = self.projections
        if projections:
            housekeeping.append(
                asyncio.create_task(projection_loop(self, projections), name="pyrula-projections")
            )
        reconciling = reconciling_of(self.store)  # archiving stores
        if reconciling is not None:
            housekeeping.append(
                asyncio.create_task(
                    reconciling.reconcile_loop(self.worker_id), name="pyrula-reconcile"
                )
            )
        sharded = shard_leasing_of(self.store)  # sharded stores
        shard_leases = (
            None
            if sharded is None
            else asyncio.create_task(
                sharded.shard_lease_loop(self.worker_id, self.options.shard_lease_interval),
                name="pyrula-shard-leases",
            )
        )
        try:
            await stop.wait()
        finally:
            # The claim loop finishes its current claim and exits: cancelling it mid-claim
            # would drop runs it had just claimed, leaving them held until their lease ran out.
            stop.set()
            slot_freed.set()
            self.wake_claimers()
            if claimers:  # none for a worker that serves no workflow (schedules only)
                _, stuck = await asyncio.wait(claimers, timeout=self.options.cancel_timeout)
                for task in stuck:
                    task.cancel()
                await asyncio.gather(*claimers, return_exceptions=True)
            if shard_leases is not None:  # cancelled, the loop releases this worker's shards
                shard_leases.cancel()
                await asyncio.gather(shard_leases, return_exceptions=True)
            await self._drain()
            for task in housekeeping:
                task.cancel()
            await asyncio.gather(*housekeeping, return_exceptions=True)
            executor.shutdown(wait=False, cancel_futures=True)
            try:
                await self.store.remove_worker(self.worker_id)
            except StoreError as exc:
                log.warning("could not deregister worker %s: %s", self.worker_id, exc)
            log.info("worker %s stopped", self.worker_id)

    async def run_schedules(self) -> None:
        """Fire the store's due schedules until :meth:`stop`; serve no runs.

        The schedule loop alone (a dedicated scheduler process, ``pyrula beat``): no
        claims, no heartbeat (so ``pyrula status`` does not list it as a worker), no
        lease renewal, timers, orphan scans or purges. Each slot still fires once across
        this and every worker's schedule loop. Like :meth:`run`, it opens the store and
        leaves closing it to the caller."""
        stop = self._arm_stop()
        await self.store.open()
        log.info("scheduler %s firing the schedules of %s", self.worker_id, self.store.url)
        schedules = asyncio.create_task(loops.schedule_loop(self), name="pyrula-schedules")
        try:
            await stop.wait()
        finally:
            stop.set()
            schedules.cancel()
            await asyncio.gather(schedules, return_exceptions=True)
            log.info("scheduler %s stopped", self.worker_id)

    def _arm_stop(self) -> asyncio.Event:
        """Bind :meth:`stop` to the running event loop; returns the event it sets (set
        already if ``stop()`` came first)."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = stop = asyncio.Event()
        if self._stop_requested.is_set():
            stop.set()
        return stop

    # -- claiming ----------------------------------------------------------------------
    def _free_slots(self) -> int:
        if self.isolation.blocks_claims(len(self.active_runs)):
            return 0
        return self.options.max_concurrent_runs - len(self.active_runs)

    def _start(self, definition: WorkflowDefinition, lease: Lease, *, alone: bool = False) -> None:
        active = _Active(lease=lease)
        if alone:  # a suspect (isolation.py): nothing else starts until it ends
            self.isolation.running = active
            log.info(
                "run %s (recovered %d times) runs alone on this worker",
                lease.run_id,
                lease.run.recoveries,
            )
        # A run this worker claims again (its lease lapsed while this worker stalled, and
        # it won the run back) replaces the old entry; the old execution, fenced by its
        # stale token, must not remove the new one when it ends (see _forget).
        self.active_runs[lease.run_id] = active
        active.task = asyncio.create_task(
            self._execute(definition, active), name=f"pyrula-run-{lease.run_id}"
        )
        # Also for a task cancelled before it ever ran, whose finally never runs.
        active.task.add_done_callback(lambda _: self._forget(active))

    def _forget(self, active: _Active) -> None:
        """``active`` ended: drop it from ``active_runs`` if it is still the run's entry,
        and free its slot."""
        if self.isolation.running is active:
            self.isolation.running = None
        if self.active_runs.get(active.lease.run_id) is active:
            del self.active_runs[active.lease.run_id]
            if self.on_run_end is not None:
                self.on_run_end(active.lease.run_id)
            if self._slot_freed is not None:
                self._slot_freed.set()

    async def hand_back(self, leases: list[tuple[Lease, float]]) -> None:
        """Release claimed runs unstarted, each due ``after`` seconds past its claim (and
        never before its own time)."""
        ttl = self.options.lock_ttl
        for lease, after in leases:
            due = max(lease.run.available_at, claimed_at(lease, ttl) + after)
            try:
                await self.store.release_run(lease.run_id, lease.token, due)
            except LeaseLost:
                pass
            except StoreError as exc:
                log.warning("run %s could not be handed back (%s)", lease.run_id, exc)

    async def _execute(self, definition: WorkflowDefinition, active: _Active) -> None:
        lease = active.lease
        instrument = telemetry.current
        if instrument is None:
            await self._execute_run(definition, active)
            return
        queue = telemetry.queue_of(definition.name, definition.fn)
        scope = instrument.run_started(lease, queue)
        end = RunEnd.LOST
        try:
            end = await self._execute_run(definition, active)
        finally:
            instrument.run_ended(scope, lease, queue, end.value)

    async def _execute_run(self, definition: WorkflowDefinition, active: _Active) -> RunEnd:
        """Execute ``active``'s run; how it ended here (LOST for anything but an end or
        a suspension the engine recorded)."""
        lease = active.lease
        end = RunEnd.LOST
        try:
            fault_point("after_claim")
            if self._claimer is not None:
                await self._claimer.hold(lease)  # a run claimed ahead starts at its time

            def started(execution: RunExecution) -> None:
                active.execution = execution
                execution.lost = active.lost
                execution.cancel_requested = execution.cancel_requested or active.cancel_requested

            end = await execute_run(definition, lease, self.store, self._settings, on_start=started)
            if end is RunEnd.SUSPENDED:
                self.timers_changed.set()  # the timer loop recomputes its next wake-up
        except asyncio.CancelledError:
            if not (active.lost or being_cancelled()):
                # Nobody cancelled the task: engine or user code raised it (the engine
                # fails a run whose code raises it, so this is rare). Requeued now, the
                # run would be claimed again at once and raise it again, forever; left
                # to its lease, recoveries count and max_recoveries sets it aside.
                log.error(
                    "run %s: asyncio.CancelledError although nothing cancelled the run; "
                    "it will be recovered after its lease",
                    lease.run_id,
                    exc_info=True,
                )
            elif not active.lost:
                await self._release(lease, active.execution)
        except RunNotFound as exc:
            # Deleted while it ran, or lost with the store's data (reported on its own,
            # loudly): nothing is left to recover.
            log.warning("run %s is gone from the store; dropped (%s)", lease.run_id, exc)
        except Exception:
            # An engine or store failure, not the workflow's: the lease will lapse and
            # the orphan scan hands the run to a worker that can finish it.
            log.exception(
                "run %s: engine error; it will be recovered after its lease", lease.run_id
            )
        finally:
            self._forget(active)
        return end

    async def _release(self, lease: Lease, execution: RunExecution | None) -> None:
        try:
            pending = None if execution is None else await execution.take_pending()
            if pending is not None:  # a finished step's deferred entry: keep its result
                await call_store(
                    lambda: self.store.append_journal(lease.token, pending),
                    self.options.cancel_timeout,
                    f"journal of {lease.run_id}",
                )
            # A run claimed ahead of its time and not started goes back due at that time.
            taken = claimed_at(lease, self.options.lock_ttl)
            ahead = execution is None and lease.run.available_at > taken
            available_at = lease.run.available_at if ahead else None
            await call_store(
                lambda: self.store.release_run(lease.run_id, lease.token, available_at),
                self.options.cancel_timeout,
                f"release of {lease.run_id}",
            )
            log.info("run %s requeued", lease.run_id)
        except LeaseLost:
            pass
        except StoreError as exc:
            log.warning(
                "run %s could not be requeued (%s); its lease will lapse", lease.run_id, exc
            )

    # -- shutdown ----------------------------------------------------------------------
    async def _drain(self) -> None:
        tasks = [a.task for a in self.active_runs.values() if a.task is not None]
        if tasks:
            log.info(
                "worker %s draining %d runs (grace %.1fs)",
                self.worker_id,
                len(tasks),
                self.options.shutdown_grace,
            )
            await asyncio.wait(tasks, timeout=self.options.shutdown_grace)
        remaining = []
        for active in self.active_runs.values():
            if active.task is not None and not active.task.done():
                active.task.cancel()
                remaining.append(active.task)
        if remaining:
            await asyncio.wait(remaining, timeout=self.options.cancel_timeout)

    # -- housekeeping ------------------------------------------------------------------
    async def wait_stop_or(self, timeout: float, *events: asyncio.Event) -> None:
        """Sleep up to ``timeout`` seconds, less if the worker stops or one of ``events``
        is set (the caller clears it)."""
        assert self._stop_event is not None
        if self._stop_event.is_set():
            # Stopping: the loops that call this have nothing left to do, and returning at
            # once would spin them against the store until they are cancelled after the drain.
            await asyncio.get_running_loop().create_future()
        waits = [asyncio.ensure_future(e.wait()) for e in (self._stop_event, *events)]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def wake_claimers(self) -> None:
        """Make the claim loop ask the store for work now: at once if it is idle, else as
        soon as its current claim returns."""
        if self._claimer is not None:
            self._claimer.wake()

    async def claim_round_done(self, timeout: float) -> int | None:
        """Wait until the claim loop's current or next claim round ends, at most
        ``timeout`` seconds (it may not claim: every slot taken); how many runs it claimed,
        None if no round ended in time."""
        if self._claimer is None:
            return None
        done = self._claimer.round_done()
        await asyncio.wait([done], timeout=timeout)
        if done.done():
            return done.result()
        done.cancel()
        return None
