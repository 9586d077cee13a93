"""How failures travel: DurableInvocationError, rebuilt originals, BaseException in steps,
workflows that raise or never return."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from pyrula.workflows import (
    DurableInvocationError,
    RetryPolicy,
    RunCancelled,
    RunStatus,
    StepContext,
    Store,
    WorkflowClient,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.records import JournalEntry, Outcome, RunRecord
from pyrula.workflows.registry import Registry
from pyrula.workflows.serialization import ErrorInfo
from pyrula.workflows.stores.memory import MemoryStore
from tests.conftest import Eventually, StartWorker

NO_RETRY = RetryPolicy(max_attempts=1)


class OrderRejected(Exception):
    """A custom error whose __init__ takes arguments the engine cannot know."""

    inits = 0

    def __init__(self, order_id: str, reason: str) -> None:
        type(self).inits += 1
        super().__init__(f"order {order_id} rejected: {reason}")


class CodeError(Exception):
    """A custom error whose __init__ passes its arguments on, so ``cls(*args)`` rebuilds it."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code

    def __str__(self) -> str:
        return f"{self.code} {self.args[1]}"


def fetch_missing() -> None:
    raise CodeError(404, "not found")


def validate_amount(amount: int) -> None:
    if amount < 0:
        raise ValueError(f"amount must be >= 0, got {amount}")


def reject_order(order_id: str) -> None:
    raise OrderRejected(order_id, "out of stock")


async def test_a_failed_run_raises_with_type_message_traceback_and_original(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry)
    async def checks(ctx: WorkflowContext, amount: int) -> None:
        await ctx.step("validate", validate_amount, amount, retry=NO_RETRY)

    await start_worker(engine_store, [checks])
    handle = await WorkflowClient(engine_store, registry=registry).submit("checks", {"amount": -5})
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    error = failed.value
    assert error.error_type == "builtins.ValueError"
    assert error.error_message == "amount must be >= 0, got -5"
    assert "validate_amount" in error.remote_traceback
    assert "ValueError: amount must be >= 0" in error.remote_traceback
    assert isinstance(error.original, ValueError)
    assert str(error.original) == "amount must be >= 0, got -5"
    assert "builtins.ValueError" in str(error)
    assert await handle.status() is RunStatus.FAILED


async def test_a_custom_error_needing_init_args_is_rebuilt_without_calling_init(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry)
    async def orders(ctx: WorkflowContext) -> None:
        await ctx.step("reject", reject_order, "A-1", retry=NO_RETRY)

    await start_worker(engine_store, [orders])
    handle = await WorkflowClient(engine_store, registry=registry).submit("orders")
    await engine_store.wait_run(handle.run_id, 10)  # raising it called __init__ once
    inits_before_rebuild = OrderRejected.inits
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    error = failed.value
    assert error.error_type == f"{__name__}.OrderRejected"
    assert error.error_message == "order A-1 rejected: out of stock"
    assert "reject_order" in error.remote_traceback
    assert type(error.original) is OrderRejected
    assert str(error.original) == "order A-1 rejected: out of stock"
    # Its args hold only the formatted message, which OrderRejected(...) refuses.
    assert OrderRejected.inits == inits_before_rebuild  # rebuilt without __init__


async def test_a_custom_error_comes_back_with_its_args_and_attributes(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry)
    async def lookup(ctx: WorkflowContext) -> None:
        await ctx.step("fetch", fetch_missing, retry=NO_RETRY)

    await start_worker(engine_store, [lookup])
    handle = await WorkflowClient(engine_store, registry=registry).submit("lookup")
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    error = failed.value
    assert error.error_type == f"{__name__}.CodeError"
    assert error.error_message == "404 not found"
    original = error.original
    assert type(original) is CodeError
    assert original.code == 404
    assert original.args == (404, "not found")
    assert str(original) == "404 not found"
    [entry] = await engine_store.load_journal(handle.run_id)
    assert ErrorInfo.from_json(entry.value).args == (404, "not found")


async def test_a_caught_step_error_replays_with_its_attributes(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    calls = {"fetch": 0}
    seen: list[tuple[type[BaseException], int]] = []
    broken = {"later": True}

    def fetch() -> None:
        calls["fetch"] += 1
        fetch_missing()

    def later() -> str:
        if broken["later"]:
            raise ValueError("later is broken")
        return "ok"

    @workflow(registry=registry)
    async def tolerant(ctx: WorkflowContext) -> list[int]:
        try:
            await ctx.step("fetch", fetch, retry=NO_RETRY)
        except CodeError as exc:
            seen.append((type(exc), exc.code))
        await ctx.step("later", later, retry=NO_RETRY)
        return [code for _, code in seen]

    await start_worker(engine_store, [tolerant])
    handle = await WorkflowClient(engine_store, registry=registry).submit("tolerant")
    with pytest.raises(DurableInvocationError):
        await handle.result(timeout=10)
    broken["later"] = False
    await handle.retry()
    assert await handle.result(timeout=10) == [404, 404]
    # Live, the step's own exception; on the retry's replay (fetch does not run again),
    # the one rebuilt from the journal, with its attribute.
    assert calls == {"fetch": 1}
    assert seen == [(CodeError, 404), (CodeError, 404)]


async def test_a_local_error_class_is_reported_but_not_rebuilt(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    class LocalError(Exception):
        pass

    def fail() -> None:
        raise LocalError("local")

    @workflow(registry=registry)
    async def local(ctx: WorkflowContext) -> None:
        await ctx.step("fail", fail, retry=NO_RETRY)

    await start_worker(engine_store, [local])
    handle = await WorkflowClient(engine_store, registry=registry).submit("local")
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    assert failed.value.error_type.endswith("<locals>.LocalError")
    assert failed.value.error_message == "local"
    assert failed.value.original is None


async def test_a_workflow_raising_in_its_own_code_fails(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry)
    async def broken(ctx: WorkflowContext, n: int) -> int:
        value: int = await ctx.step("double", lambda: n * 2)
        if value > 3:
            raise LookupError(f"no entry for {value}")
        return value

    await start_worker(engine_store, [broken])
    handle = await WorkflowClient(engine_store, registry=registry).submit("broken", {"n": 2})
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    assert failed.value.error_type == "builtins.LookupError"
    assert "in broken" in failed.value.remote_traceback
    assert [(e.name, e.ok) for e in await engine_store.load_journal(handle.run_id)] == [
        ("double", True)
    ]


def _raising(kind: type[BaseException], sync: bool) -> Callable[..., Any]:
    if sync:

        def sync_step(ctx: StepContext) -> None:
            raise kind("raised by a sync step")

        return sync_step

    async def async_step(ctx: StepContext) -> None:
        raise kind("raised by an async step")

    return async_step


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit, GeneratorExit])
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_keyboard_interrupt_and_system_exit_in_a_step_fail_only_the_run(
    engine_store: Store,
    registry: Registry,
    start_worker: StartWorker,
    kind: type[BaseException],
    sync: bool,
) -> None:
    exiting = step(retry=RetryPolicy(max_attempts=3, initial_backoff=0.01))(_raising(kind, sync))

    @workflow(registry=registry)
    async def exits(ctx: WorkflowContext) -> None:
        await exiting()

    @workflow(registry=registry)
    async def healthy(ctx: WorkflowContext) -> str:
        result: str = await ctx.step("ok", lambda: "still serving")
        return result

    await start_worker(engine_store, [exits, healthy])
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit("exits")
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    assert failed.value.error_type == f"builtins.{kind.__name__}"
    assert "raised by a" in failed.value.error_message
    [entry] = await engine_store.load_journal(handle.run_id)
    assert not entry.ok and entry.attempts == 1  # never retried
    stored = ErrorInfo.from_json(entry.value)
    assert stored.qualified_type == f"builtins.{kind.__name__}"
    assert "Traceback" in stored.traceback
    record = await handle.record()  # failed by its first claim: no lease lapsed
    assert (record.claims, record.recoveries) == (1, 0)

    after = await client.submit("healthy")
    assert await after.result(timeout=10) == "still serving"


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_a_cancelled_error_a_step_raises_is_a_failure_retried_by_its_policy(
    engine_store: Store, registry: Registry, start_worker: StartWorker, sync: bool
) -> None:
    # Nobody cancels the run: the step (or a library under it) raises CancelledError.
    # It must not pass for a cancellation, which requeues the run: it would be claimed
    # and raise again at once, forever.
    attempts = []

    def sync_step(ctx: StepContext) -> None:
        attempts.append(ctx.attempt)
        raise asyncio.CancelledError("leaked by a library")

    async def async_step(ctx: StepContext) -> None:
        attempts.append(ctx.attempt)
        raise asyncio.CancelledError("leaked by a library")

    policy = RetryPolicy(max_attempts=2, initial_backoff=0.01)
    leaking = step(name="leaking", retry=policy)(sync_step if sync else async_step)

    @workflow(registry=registry)
    async def leaks(ctx: WorkflowContext) -> None:
        await leaking()

    @workflow(registry=registry)
    async def healthy(ctx: WorkflowContext) -> str:
        result: str = await ctx.step("ok", lambda: "still serving")
        return result

    await start_worker(engine_store, [leaks, healthy])
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit("leaks")
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    assert failed.value.error_type.endswith(".StepRaisedCancelledError")
    assert "raised asyncio.CancelledError (leaked by a library)" in failed.value.error_message
    assert "leaking" in failed.value.error_message
    assert attempts == [1, 2]
    [entry] = await engine_store.load_journal(handle.run_id)
    assert (entry.name, entry.ok, entry.attempts) == ("leaking", False, 2)
    assert "CancelledError: leaked by a library" in ErrorInfo.from_json(entry.value).traceback
    record = await handle.record()
    assert record.status is RunStatus.FAILED
    assert (record.claims, record.recoveries) == (1, 0)

    after = await client.submit("healthy")
    assert await after.result(timeout=10) == "still serving"


async def test_a_workflow_raising_cancelled_error_itself_fails_at_once(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry)
    async def leaks(ctx: WorkflowContext) -> None:
        await ctx.step("before", lambda: None)
        raise asyncio.CancelledError("not a cancellation")

    await start_worker(engine_store, [leaks])
    handle = await WorkflowClient(engine_store, registry=registry).submit("leaks")
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    assert failed.value.error_type == "asyncio.exceptions.CancelledError"
    assert failed.value.error_message == "not a cancellation"
    record = await handle.record()
    assert (record.status, record.claims, record.recoveries) == (RunStatus.FAILED, 1, 0)


class _LeakingStore(MemoryStore):
    """A store whose client leaks ``asyncio.CancelledError`` when recording an outcome."""

    async def finish_run(
        self, run_id: str, token: int, outcome: Outcome, entry: JournalEntry | None = None
    ) -> RunRecord:
        raise asyncio.CancelledError("leaked by the store client")


async def test_a_cancelled_error_nobody_cancelled_is_left_to_the_lease_not_requeued(
    registry: Registry, start_worker: StartWorker
) -> None:
    # Requeued as if the worker had cancelled the run, it would be claimed again at once
    # and fail the same way, forever; left to its lease, it is dead-lettered.
    store = _LeakingStore()

    @workflow(registry=registry)
    async def unrecordable(ctx: WorkflowContext) -> int:
        return 1

    await start_worker(store, [unrecordable], lock_ttl=0.4, max_recoveries=1)
    handle = await WorkflowClient(store, registry=registry).submit("unrecordable")
    with pytest.raises(DurableInvocationError) as dead:
        await handle.result(timeout=10)
    assert dead.value.error_type == "pyrula.workflows.errors.RunDeadLettered"
    record = await handle.record()
    # Claimed, its lease lapsed, recovered; claimed again, lapsed, set aside.
    assert (record.status, record.claims) == (RunStatus.DEAD, 2) and record.recoveries > 0


async def test_a_step_raising_cancelled_error_does_not_stop_its_real_cancellation(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    # The worker stops while the step waits: the drain cancels the run's task, and the
    # step's CancelledError (re-raised as any, even with a message of its own) is the
    # real thing: the run goes back to the queue, unfailed.
    started = asyncio.Event()

    async def waits(ctx: StepContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise asyncio.CancelledError("re-raised by the step") from None

    waiting = step(name="waits", retry=RetryPolicy(max_attempts=3))(waits)

    @workflow(registry=registry)
    async def stopped(ctx: WorkflowContext) -> None:
        await waiting()

    worker = await start_worker(engine_store, [stopped], shutdown_grace=0.1)
    handle = await WorkflowClient(engine_store, registry=registry).submit("stopped")
    await asyncio.wait_for(started.wait(), 10)
    worker.stop()
    await eventually(lambda: worker.running == 0, what="the drain")
    record = await handle.record()
    assert (record.status, record.claims, record.recoveries) == (RunStatus.QUEUED, 1, 0)
    assert await engine_store.load_journal(handle.run_id) == []


async def test_a_workflow_that_never_returns_blocks_nothing_and_terminate_ends_it(
    engine_store: Store,
    registry: Registry,
    start_worker: StartWorker,
    eventually: Eventually,
) -> None:
    forever = asyncio.Event()  # never set

    @workflow(registry=registry)
    async def stuck(ctx: WorkflowContext) -> None:
        await ctx.step("begin", lambda: None)
        await forever.wait()

    @workflow(registry=registry)
    async def quick(ctx: WorkflowContext, n: int) -> int:
        result: int = await ctx.step("inc", lambda: n + 1)
        return result

    worker = await start_worker(engine_store, [stuck, quick], lock_ttl=0.6)
    client = WorkflowClient(engine_store, registry=registry)
    stuck_run = await client.submit("stuck")
    await eventually(
        lambda: engine_store.load_journal(stuck_run.run_id), what="the stuck run's first step"
    )
    others = [await client.submit("quick", {"n": n}) for n in range(5)]
    assert [await h.result(timeout=10) for h in others] == [1, 2, 3, 4, 5]
    assert await stuck_run.status() is RunStatus.RUNNING

    record = await stuck_run.terminate()
    assert record.status is RunStatus.TERMINATED
    with pytest.raises(RunCancelled) as ended:
        await stuck_run.result(timeout=1)
    assert ended.value.status == "terminated"
    # The worker notices the lost lease at its next renewal and lets go of the run.
    await eventually(lambda: worker.running == 0, timeout=5, what="the worker dropping the run")
    assert await stuck_run.status() is RunStatus.TERMINATED
