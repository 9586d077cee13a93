"""InlineWorkflowRunner: a run executed to its end in the caller's process, no worker."""

from __future__ import annotations

import pytest

from pyrula.workflows import (
    DurableInvocationError,
    InlineWorkflowRunner,
    InvalidRunState,
    RetryPolicy,
    RunStatus,
    StepContext,
    Store,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.registry import Registry


@step(retry=RetryPolicy(max_attempts=2, initial_backoff=0.01))
def add_tax(ctx: StepContext, amount: int) -> int:
    if ctx.attempt == 1:
        raise ConnectionError("tax service blinked")
    return amount + amount // 10


async def test_inline_runs_a_workflow_to_completion(
    engine_store: Store, registry: Registry
) -> None:
    @workflow(registry=registry)
    async def invoice(ctx: WorkflowContext, amount: int) -> dict[str, int]:
        total: int = await add_tax(amount)
        return {"amount": amount, "total": total}

    runner = InlineWorkflowRunner(engine_store, registry=registry)
    assert await runner.run("invoice", {"amount": 100}) == {"amount": 100, "total": 110}
    assert await runner.run(invoice, {"amount": 50}) == {"amount": 50, "total": 55}
    runs = await engine_store.list_runs()
    assert [r.status for r in runs] == [RunStatus.COMPLETED, RunStatus.COMPLETED]
    assert all(r.lease_expires_at is None for r in runs)


async def test_inline_with_its_default_memory_store(registry: Registry) -> None:
    @workflow(registry=registry)
    async def hello(ctx: WorkflowContext, name: str) -> str:
        result: str = await ctx.step("greet", lambda: f"hello {name}")
        return result

    assert await InlineWorkflowRunner(registry=registry).run("hello", {"name": "ada"}) == (
        "hello ada"
    )


async def test_inline_failure_raises_like_result(engine_store: Store, registry: Registry) -> None:
    def explode() -> None:
        raise KeyError("missing")

    @workflow(registry=registry)
    async def failing(ctx: WorkflowContext) -> None:
        await ctx.step("explode", explode, retry=RetryPolicy(max_attempts=1))

    runner = InlineWorkflowRunner(engine_store, registry=registry)
    with pytest.raises(DurableInvocationError) as failed:
        await runner.run("failing")
    assert failed.value.error_type == "builtins.KeyError"
    assert "explode" in failed.value.remote_traceback
    [run] = await engine_store.list_runs()
    assert run.status is RunStatus.FAILED


async def test_inline_refuses_a_delayed_run(engine_store: Store, registry: Registry) -> None:
    @workflow(registry=registry)
    async def later(ctx: WorkflowContext) -> str:
        return "later"

    runner = InlineWorkflowRunner(engine_store, registry=registry)
    with pytest.raises(InvalidRunState, match="delayed"):
        await runner.run("later", delay=60)
    [run] = await engine_store.list_runs()
    assert run.status is RunStatus.QUEUED  # left for a worker, not claimed


async def test_inline_execute_of_a_finished_run_returns_its_outcome(
    engine_store: Store, registry: Registry
) -> None:
    @workflow(registry=registry)
    async def once(ctx: WorkflowContext) -> int:
        return 1

    runner = InlineWorkflowRunner(engine_store, registry=registry)
    handle = await runner.client.submit("once")
    assert await runner.execute(handle) == 1
    assert await runner.execute(handle) == 1
