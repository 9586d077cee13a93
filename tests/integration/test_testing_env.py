"""WorkflowTestEnv: virtual time that skips sleeps, delays, backoffs, signal timeouts and
schedules; stalled runs; and crash-point checks of users' workflows."""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from pyrula.workflows import (
    DurableInvocationError,
    RetryPolicy,
    RunStatus,
    StepContext,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.errors import SignalTimeout
from pyrula.workflows.projections import Projection
from pyrula.workflows.registry import Registry
from pyrula.workflows.schedules import Schedule
from pyrula.workflows.testing import WorkflowStalled, WorkflowTestEnv
from pyrula.workflows.triggers import BatchTrigger

DAY = 86_400.0


async def test_a_workflow_that_sleeps_a_day_finishes_at_once(registry: Registry) -> None:
    @workflow(registry=registry)
    async def onboarding(ctx: WorkflowContext, user: int) -> list[Any]:
        before = await ctx.now()
        await ctx.sleep(timedelta(days=1))
        await ctx.sleep(timedelta(hours=12))
        after = await ctx.now()
        return [user, (after - before).total_seconds()]

    began = time.monotonic()
    async with WorkflowTestEnv(workflows=[onboarding], registry=registry) as env:
        start = env.clock()
        user, slept = await env.run(onboarding, {"user": 7})
        assert env.clock() - start >= 1.5 * DAY
    # Virtual time: a day and a half passed without real waiting (generous: 30 s).
    assert time.monotonic() - began < 30
    assert user == 7
    assert slept >= 1.5 * DAY


async def test_delays_backoffs_and_signal_timeouts_are_skipped(registry: Registry) -> None:
    attempts: list[int] = []

    @step(retry=RetryPolicy(max_attempts=3, initial_backoff=3600, max_backoff=7200, jitter=0))
    def flaky(ctx: StepContext) -> int:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError("try again in an hour")
        return ctx.attempt

    @workflow(registry=registry)
    async def patient(ctx: WorkflowContext) -> list[Any]:
        started = await ctx.now()
        attempt: int = await flaky()
        try:
            await ctx.wait_for_signal("approve", timeout=timedelta(days=2))
            verdict = "approved"
        except SignalTimeout:
            verdict = "timed out"
        return [attempt, verdict, (await ctx.now() - started).total_seconds()]

    began = time.monotonic()
    async with WorkflowTestEnv(workflows=[patient], registry=registry) as env:
        submitted_at = env.clock()
        handle = await env.submit(patient, delay=timedelta(hours=5))
        attempt, verdict, elapsed = await env.result(handle)
        record = await handle.record()
        assert record.started_at is not None and record.started_at >= submitted_at + 5 * 3600
    assert time.monotonic() - began < 30  # two days and more of virtual time, not waited
    assert attempts == [1, 2, 3]
    assert (attempt, verdict) == (3, "timed out")
    assert elapsed >= 3600 + 7200 + 2 * DAY  # backoffs of 1 h and 2 h, then the timeout


async def test_advance_fires_an_interval_schedule_once_per_slot(registry: Registry) -> None:
    seen: list[float] = []

    @workflow(registry=registry)
    async def report(ctx: WorkflowContext) -> None:
        seen.append((await ctx.now()).timestamp())

    async with WorkflowTestEnv(workflows=[report], registry=registry) as env:
        start = env.clock()
        env.store.schedule_create(Schedule.create(report, every=timedelta(minutes=10)))
        await env.advance(timedelta(hours=1))
        runs = await env.store.list_runs(workflow="report", limit=100)
        assert env.clock() == pytest.approx(start + 3600, abs=1.0)
    assert len(runs) == 6
    assert all(r.status.value == "completed" for r in runs)
    offsets = sorted(round((t - start) / 60) for t in seen)
    assert offsets == [10, 20, 30, 40, 50, 60]


async def test_a_run_waiting_for_a_signal_that_never_comes_is_stalled(registry: Registry) -> None:
    @workflow(registry=registry)
    async def forever(ctx: WorkflowContext) -> Any:
        return await ctx.wait_for_signal("never")

    async with WorkflowTestEnv(workflows=[forever], registry=registry) as env:
        handle = await env.submit(forever)
        with pytest.raises(WorkflowStalled, match="never"):
            await env.result(handle)
        await handle.signal("never", "late")  # the env still works: the signal ends it
        assert await env.result(handle) == "late"


async def test_failures_come_back_as_in_production(registry: Registry) -> None:
    @workflow(registry=registry)
    async def broken(ctx: WorkflowContext) -> None:
        await ctx.step("boom", _boom, retry=RetryPolicy(max_attempts=2, initial_backoff=600))

    async with WorkflowTestEnv(workflows=[broken], registry=registry) as env:
        with pytest.raises(DurableInvocationError) as caught:
            await env.run(broken)
    assert caught.value.error_message == "boom"


def _boom() -> None:
    raise RuntimeError("boom")


# -- crash-point checks ----------------------------------------------------------------
def three_steps(registry: Registry, executions: Counter[str]) -> Any:
    def count(name: str) -> Any:
        def run(value: int) -> int:
            executions[name] += 1
            return value + 1

        return run

    @workflow(registry=registry)
    async def pipeline(ctx: WorkflowContext, start: int) -> int:
        a: int = await ctx.step("a", count("a"), start)
        b: int = await ctx.step("b", count("b"), a)
        c: int = await ctx.step("c", count("c"), b)
        return c

    return pipeline


@pytest.mark.parametrize("expire_lease_early", [False, True])
async def test_a_deterministic_three_step_workflow_is_crash_safe(
    registry: Registry, expire_lease_early: bool
) -> None:
    executions: Counter[str] = Counter()
    pipeline = three_steps(registry, executions)
    async with WorkflowTestEnv(workflows=[pipeline], registry=registry) as env:
        report = await env.check_crash_safety(
            pipeline, {"start": 1}, expire_lease_early=expire_lease_early
        )
    report.assert_safe()
    assert report.reference.outcome == ("result", 4)
    assert len(report.trials) == len(report.reference.checkpoints) >= 7  # 3 steps x 2 + end
    assert all(t.outcome == ("result", 4) and t.crashed_at for t in report.trials)
    assert report.max_executions() == {"a": 2, "b": 2, "c": 2}  # at-least-once, at most twice
    assert report.failures == []


EXECUTIONS: Counter[str] = Counter()
"""Bodies of the unsafe workflow per run id: state outside any step."""


async def test_a_workflow_that_depends_on_state_outside_steps_is_reported_unsafe(
    registry: Registry,
) -> None:
    @workflow(registry=registry)
    async def unsafe(ctx: WorkflowContext) -> int:
        EXECUTIONS[ctx.run_id] += 1  # not journaled: a replay after a crash sees 2
        await ctx.step("a", lambda: "a")
        await ctx.step("b", lambda: "b")
        return EXECUTIONS[ctx.run_id]

    async with WorkflowTestEnv(workflows=[unsafe], registry=registry) as env:
        report = await env.check_crash_safety(unsafe)
    assert report.reference.outcome == ("result", 1)
    assert report.failures, "a crash must change this workflow's result"
    assert all(t.outcome == ("result", 2) for t in report.failures)
    with pytest.raises(AssertionError, match="crash"):
        report.assert_safe()


@pytest.mark.parametrize("expire_lease_early", [False, True])
async def test_every_kind_of_durable_operation_survives_a_crash_at_each_checkpoint(
    registry: Registry, expire_lease_early: bool
) -> None:
    @workflow(registry=registry)
    async def double(ctx: WorkflowContext, n: int) -> int:
        result: int = await ctx.step("double", lambda: n * 2)
        return result

    @workflow(registry=registry)
    async def everything(ctx: WorkflowContext) -> list[Any]:
        await ctx.now()
        first = await ctx.step("first", lambda: 1)
        await ctx.sleep(timedelta(hours=1))
        both = await ctx.gather(ctx.step("left", lambda: 2), ctx.step("right", lambda: 3))
        child = await ctx.run_child(double, {"n": 5})
        try:
            signal = await ctx.wait_for_signal("never", timeout=60)
        except SignalTimeout:
            signal = "timeout"
        return [first, *both, child, signal]

    async with WorkflowTestEnv(workflows=[everything, double], registry=registry) as env:
        report = await env.check_crash_safety(everything, expire_lease_early=expire_lease_early)
    report.assert_safe()
    assert report.reference.outcome == ("result", [1, 2, 3, 10, "timeout"])
    assert len(report.trials) >= 15
    assert max(report.max_executions().values()) <= 2


async def test_time_skips_to_batches_and_projection_deliveries() -> None:
    registry = Registry()

    @workflow(registry=registry)
    async def digest(ctx: WorkflowContext, events: list[str]) -> str:
        return ", ".join(events)

    delivered: list[str] = []
    trigger = BatchTrigger("mails", "digest", max_size=3, max_wait=3600.0)
    item = Projection(
        "digests", lambda runs: delivered.extend(r.result or "" for r in runs), settle=60.0
    )
    async with WorkflowTestEnv(
        workflows=[digest], registry=registry, triggers=[trigger], projections=[item]
    ) as env:
        await env.client.send_events("mails", ["a", "b", "c", "d"])
        await env.advance(0)  # a full batch goes at once; "d" waits its hour
        runs = await env.store.list_runs(workflow="digest")
        assert [r.status for r in runs] == [RunStatus.COMPLETED]
        assert delivered == []  # ended, not settled yet
        await env.advance(60)
        assert delivered == ['"a, b, c"']
        await env.advance(3600)
        assert len(await env.store.list_runs(workflow="digest")) == 2
        assert delivered == ['"a, b, c"', '"d"']
