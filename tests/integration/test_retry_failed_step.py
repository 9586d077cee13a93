"""``handle.retry()`` runs again exactly the step that failed the run, with fresh attempts."""

from __future__ import annotations

import contextlib
from typing import Any

from pyrula.workflows import (
    DurableInvocationError,
    RetryPolicy,
    StepContext,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.registry import Registry
from pyrula.workflows.testing import WorkflowTestEnv


async def test_a_failed_gather_branch_runs_again_and_the_others_replay() -> None:
    registry = Registry()
    calls = {"flaky": 0, "fine": 0}
    broken = {"on": True}

    @step(retry=RetryPolicy(max_attempts=3, initial_backoff=30))
    def flaky(ctx: StepContext) -> str:
        calls["flaky"] += 1
        if broken["on"]:
            raise ConnectionError("down")
        return "ok"

    @step
    def fine(ctx: StepContext) -> str:
        calls["fine"] += 1
        return "fine"

    @workflow(registry=registry)
    async def both(ctx: WorkflowContext) -> Any:
        return await ctx.gather(flaky(), fine())

    async with WorkflowTestEnv(registry=registry) as env:
        handle = await env.submit("both")
        try:
            await env.result(handle)
        except DurableInvocationError as failed:
            assert failed.error_type == "builtins.ConnectionError"
        else:
            raise AssertionError("the run should have failed")
        assert calls == {"flaky": 3, "fine": 1}
        broken["on"] = False
        await handle.retry()
        assert await env.result(handle) == ["ok", "fine"]
        assert calls == {"flaky": 4, "fine": 1}  # the fine branch replayed


async def test_a_retried_step_gets_all_its_attempts_again() -> None:
    registry = Registry()
    attempts: list[int] = []

    @step(retry=RetryPolicy(max_attempts=3, initial_backoff=60))
    def always_down(ctx: StepContext) -> str:
        attempts.append(ctx.attempt)
        raise ConnectionError("down")

    @workflow(registry=registry)
    async def one(ctx: WorkflowContext) -> Any:
        return await always_down()

    async with WorkflowTestEnv(registry=registry) as env:
        handle = await env.submit("one")
        for _ in range(2):
            with contextlib.suppress(DurableInvocationError):
                await env.result(handle)
            await handle.retry()
        with contextlib.suppress(DurableInvocationError):
            await env.result(handle)
    assert attempts == [1, 2, 3, 1, 2, 3, 1, 2, 3]
