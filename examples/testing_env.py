"""Testing workflows: WorkflowTestEnv (virtual time) and crash-point checks.

    python examples/testing_env.py

The same functions work as pytest tests: drop the ``main`` at the bottom and let pytest
collect the ``test_*`` coroutines. That needs pytest-asyncio in auto mode
(``asyncio_mode = "auto"`` in the pytest config), or each test marked
``@pytest.mark.asyncio``. See docs/testing.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

from pyrula.workflows import (
    DurableInvocationError,
    RetryPolicy,
    RunStatus,
    StepContext,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.testing import WorkflowStalled, WorkflowTestEnv

outbox: list[str] = []  # stands in for a mail provider


@step(retry=RetryPolicy(max_attempts=4, initial_backoff=600, max_backoff=3600))
def send_mail(ctx: StepContext, to: str, subject: str) -> str:
    if subject == "flaky" and ctx.attempt < 3:
        raise ConnectionError("provider down")  # retried after 10 and 20 minutes
    outbox.append(f"{to}:{subject}")
    return f"sent {subject} (attempt {ctx.attempt})"


@workflow(name="onboarding")
async def onboarding(ctx: WorkflowContext, user: str) -> list[str]:
    sent = [await send_mail(user, "welcome")]
    await ctx.sleep(timedelta(days=3))
    sent.append(await send_mail(user, "tips"))
    await ctx.sleep(timedelta(days=27))
    sent.append(await send_mail(user, "flaky"))
    return sent


@workflow(name="needs_approval")
async def needs_approval(ctx: WorkflowContext) -> Any:
    return await ctx.wait_for_signal("approved")


async def test_a_month_of_onboarding_runs_in_milliseconds() -> None:
    async with WorkflowTestEnv(workflows=[onboarding]) as env:
        began = time.monotonic()
        result = await env.run("onboarding", {"user": "ana"})
        assert result == [
            "sent welcome (attempt 1)",
            "sent tips (attempt 1)",
            "sent flaky (attempt 3)",
        ]
        print(f"30 virtual days and two 10-minute backoffs in {time.monotonic() - began:.2f}s")


async def test_advance_shows_the_state_on_the_way() -> None:
    outbox.clear()
    async with WorkflowTestEnv(workflows=[onboarding]) as env:
        run = await env.submit("onboarding", {"user": "bo"})
        await env.advance(timedelta(days=1))
        assert outbox == ["bo:welcome"] and await run.status() is RunStatus.SLEEPING
        await env.advance(timedelta(days=2))  # day 3: the tips mail is due
        assert outbox == ["bo:welcome", "bo:tips"]


async def test_a_run_that_waits_for_nothing_is_reported() -> None:
    async with WorkflowTestEnv(workflows=[needs_approval]) as env:
        run = await env.submit("needs_approval")
        try:
            await env.result(run)
            raise AssertionError("expected WorkflowStalled")
        except WorkflowStalled as exc:
            print("stalled:", exc)
        await run.signal("approved", "yes")
        assert await env.result(run) == "yes"


# -- crash-point checks ------------------------------------------------------------------
@step
def reserve_stock(ctx: StepContext, sku: str) -> str:
    return f"res-{sku}"


@step
def charge_card(ctx: StepContext, order: str, amount: int) -> dict[str, Any]:
    # A real charge passes an idempotency key so that a repeat is harmless.
    return {"charge": f"{order}:{amount}", "key": f"charge-{ctx.run_id}"}


@workflow(name="checkout")
async def checkout(ctx: WorkflowContext, order: str, sku: str, amount: int) -> dict[str, Any]:
    reservation = await reserve_stock(sku)
    charge = await charge_card(order, amount)
    return {"reservation": reservation, "charge": charge["charge"]}


executions: dict[str, int] = {}


@workflow(name="unsafe_discount")
async def unsafe_discount(ctx: WorkflowContext, amount: int) -> int:
    # BUG: state outside the journal. This code runs again on every replay, so the
    # count goes up each time the run is picked up after a crash.
    executions[ctx.run_id] = executions.get(ctx.run_id, 0) + 1
    price = amount if executions[ctx.run_id] > 1 else amount - 10
    return await ctx.step("charge", lambda: price)  # type: ignore[no-any-return]


async def test_checkout_survives_a_crash_at_every_checkpoint() -> None:
    async with WorkflowTestEnv(workflows=[checkout]) as env:
        params = {"order": "A-1", "sku": "tea", "amount": 1250}
        report = await env.check_crash_safety("checkout", params)
        report.assert_safe()  # every crash still gave the reference result
        print("checkpoints:", [trial.crashed_at for trial in report.trials])
        # A crash between a step's effect and its journal write runs it again: at most
        # twice here. Make such steps idempotent (charge_card passes a key).
        assert report.max_executions() == {"reserve_stock": 2, "charge_card": 2}

        # The lease expires early instead: a second worker takes the run while the
        # first carries on, and fencing refuses the first one's late writes.
        late = await env.check_crash_safety("checkout", params, expire_lease_early=True)
        late.assert_safe()


async def test_crash_checks_find_state_outside_the_journal() -> None:
    async with WorkflowTestEnv(workflows=[unsafe_discount]) as env:
        report = await env.check_crash_safety("unsafe_discount", {"amount": 100})
        print("reference:", report.reference.outcome)
        for trial in report.failures:
            print(f"  crash {trial.crashed_at}: {trial.outcome}")
        try:
            report.assert_safe()
            raise AssertionError("expected the check to fail")
        except AssertionError as exc:
            assert "crash before step 'charge' at 0" in str(exc), exc


async def test_a_failing_run_raises_like_a_real_one() -> None:
    @workflow(name="always_fails")
    async def always_fails(ctx: WorkflowContext) -> None:
        raise ValueError("nope")

    async with WorkflowTestEnv(workflows=[always_fails]) as env:
        try:
            await env.run("always_fails")
            raise AssertionError("expected DurableInvocationError")
        except DurableInvocationError as exc:
            assert exc.error_type == "builtins.ValueError" and exc.error_message == "nope"


async def main() -> None:
    # The crash checks kill and reclaim runs on purpose; keep their warnings quiet.
    logging.getLogger("pyrula").setLevel(logging.ERROR)
    for name, test in list(globals().items()):
        if name.startswith("test_") and callable(test):
            print(f"{name} ...")
            await test()


if __name__ == "__main__":
    asyncio.run(main())
