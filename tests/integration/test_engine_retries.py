"""Step retries under a RetryPolicy, and step timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from pyrula.workflows import (
    DurableInvocationError,
    Fatal,
    Poison,
    RetryPolicy,
    StepContext,
    Store,
    Transient,
    WorkflowClient,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.registry import Registry
from tests.conftest import StartWorker

TINY: dict[str, Any] = {"initial_backoff": 0.01, "max_backoff": 0.02, "jitter": 0.0}


async def test_a_failing_step_is_retried_until_it_succeeds(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    attempts: list[int] = []

    @step(retry=RetryPolicy(max_attempts=4, **TINY))
    def shaky(ctx: StepContext) -> int:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError(f"attempt {ctx.attempt} failed")
        return ctx.attempt

    @workflow(registry=registry)
    async def retrying(ctx: WorkflowContext) -> int:
        result: int = await shaky()
        return result

    await start_worker(engine_store, [retrying])
    handle = await WorkflowClient(engine_store, registry=registry).submit("retrying")
    assert await handle.result(timeout=10) == 3
    assert attempts == [1, 2, 3]
    [entry] = await engine_store.load_journal(handle.run_id)
    assert entry.ok and entry.attempts == 3


@pytest.mark.parametrize(
    ("error", "expected_calls"),
    [
        (ConnectionError("listed"), 3),  # in retryable: retried up to max_attempts
        (ValueError("not listed"), 1),  # not in retryable: fails at once
        (Transient("always retried"), 3),  # retried whatever retryable says
        (Poison("bad input"), 1),
        (Fatal("give up"), 1),
    ],
    ids=["retryable", "not-retryable", "transient", "poison", "fatal"],
)
async def test_which_errors_are_retried(
    engine_store: Store,
    registry: Registry,
    start_worker: StartWorker,
    error: Exception,
    expected_calls: int,
) -> None:
    calls: list[int] = []

    @step(retry=RetryPolicy(max_attempts=3, retryable=(ConnectionError,), **TINY))
    def failing(ctx: StepContext) -> None:
        calls.append(ctx.attempt)
        raise error

    @workflow(registry=registry)
    async def classified(ctx: WorkflowContext) -> None:
        await failing()

    await start_worker(engine_store, [classified])
    handle = await WorkflowClient(engine_store, registry=registry).submit("classified")
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    assert calls == list(range(1, expected_calls + 1))
    kind = type(error)
    assert failed.value.error_type == f"{kind.__module__}.{kind.__qualname__}"
    assert isinstance(failed.value.original, kind)
    [entry] = await engine_store.load_journal(handle.run_id)
    assert not entry.ok and entry.attempts == expected_calls


async def test_poison_and_fatal_are_never_retried_even_when_listed(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    calls: list[str] = []

    def raise_it(error: Exception) -> None:
        calls.append(type(error).__name__)
        raise error

    everything = RetryPolicy(max_attempts=5, retryable=(Exception,), **TINY)

    @workflow(registry=registry)
    async def stubborn(ctx: WorkflowContext) -> list[str]:
        for error in (Poison("p"), Fatal("f")):
            with contextlib.suppress(Poison, Fatal):
                await ctx.step(type(error).__name__, raise_it, error, retry=everything)
        return calls

    await start_worker(engine_store, [stubborn])
    handle = await WorkflowClient(engine_store, registry=registry).submit("stubborn")
    assert await handle.result(timeout=10) == ["Poison", "Fatal"]


async def test_an_async_step_over_its_timeout_is_cancelled_and_retried(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    started: list[int] = []
    cut_off: list[int] = []
    finished: list[int] = []

    @step(timeout=0.05, retry=RetryPolicy(max_attempts=2, **TINY))
    async def sleepy(ctx: StepContext) -> str:
        started.append(ctx.attempt)
        try:
            await asyncio.sleep(60)  # awaited to the end, the result below would time out
        except asyncio.CancelledError:
            cut_off.append(ctx.attempt)
            raise
        finished.append(ctx.attempt)
        return "too late"

    @workflow(registry=registry)
    async def timed(ctx: WorkflowContext) -> str:
        result: str = await sleepy()
        return result

    await start_worker(engine_store, [timed])
    handle = await WorkflowClient(engine_store, registry=registry).submit("timed")
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=30)
    assert failed.value.error_type == "pyrula.workflows.errors.StepTimeout"
    assert "within 0.05s" in failed.value.error_message
    assert isinstance(failed.value.original, TimeoutError)
    assert started == [1, 2]
    assert cut_off == [1, 2]  # each attempt was cancelled at its timeout, not awaited
    assert finished == []
    [entry] = await engine_store.load_journal(handle.run_id)
    assert entry.attempts == 2


async def test_a_sync_step_over_its_timeout_is_not_killed_and_its_result_stands(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    """Python cannot stop a thread: a sync step's timeout only logs an overrun."""
    calls: list[int] = []

    @step(timeout=0.05, retry=RetryPolicy(max_attempts=3, **TINY))
    def slow(ctx: StepContext) -> str:
        calls.append(ctx.attempt)
        time.sleep(0.2)
        return "finished anyway"

    @workflow(registry=registry)
    async def overrun(ctx: WorkflowContext) -> str:
        result: str = await slow()
        return result

    await start_worker(engine_store, [overrun])
    handle = await WorkflowClient(engine_store, registry=registry).submit("overrun")
    assert await handle.result(timeout=10) == "finished anyway"
    assert calls == [1]
