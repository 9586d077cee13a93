"""Signals: ``ctx.wait_for_signal`` in a workflow, ``handle.signal`` from outside.

    python examples/signals.py

Part 1 runs in WorkflowTestEnv (virtual time, so a two-day timeout passes at once).
Part 2 sends a signal from plain sync code (the blocking client) to a run on a real
worker in a thread, on a temporary SQLite file. See docs/signals.md.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any

from pyrula.workflows import (
    InvalidRunState,
    RunNotFound,
    RunStatus,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    open_store,
    workflow,
)
from pyrula.workflows.errors import SignalTimeout
from pyrula.workflows.sync import WorkflowClient
from pyrula.workflows.testing import WorkflowStalled, WorkflowTestEnv

WAIT_LIMIT = 30.0


@workflow(name="expense_approval")
async def expense_approval(ctx: WorkflowContext, amount: int) -> dict[str, Any]:
    await ctx.step("notify_manager", lambda: f"please approve {amount}")
    try:
        decision = await ctx.wait_for_signal("decision", timeout=timedelta(days=2))
    except SignalTimeout:
        return {"amount": amount, "approved": False, "reason": "no answer in 2 days"}
    return {"amount": amount, "approved": decision["approved"], "by": decision["by"]}


@workflow(name="collect_votes")
async def collect_votes(ctx: WorkflowContext, voters: int) -> list[Any]:
    # Signals of one name queue in order; each wait takes the next one, once.
    return [await ctx.wait_for_signal("vote") for _ in range(voters)]


async def in_the_test_env() -> None:
    async with WorkflowTestEnv(workflows=[expense_approval, collect_votes]) as env:
        # A signal to a run that is waiting wakes it.
        run = await env.submit("expense_approval", {"amount": 120})
        await env.advance(timedelta(hours=3))
        assert await run.status() is RunStatus.WAITING  # suspended: no worker holds it
        await run.signal("decision", {"approved": True, "by": "maria"})
        assert await env.result(run) == {"amount": 120, "approved": True, "by": "maria"}

        # A signal sent before the run waits for it is kept, not lost.
        early = await env.submit("expense_approval", {"amount": 80})
        await early.signal("decision", {"approved": False, "by": "li"})
        assert (await env.result(early))["by"] == "li"

        # No answer: the timeout is journaled; after two (virtual) days SignalTimeout.
        late = await env.run("expense_approval", {"amount": 999})
        print("timed out:", late)
        assert late["approved"] is False

        # Each signal is received once: three waits need three signals.
        votes = await env.submit("collect_votes", {"voters": 3})
        for vote in ("yes", "no"):
            await votes.signal("vote", vote)
        try:
            await env.result(votes)  # the third vote never comes, and no timer will help
            raise AssertionError("expected WorkflowStalled")
        except WorkflowStalled as exc:
            print("stalled:", exc)
        await votes.signal("vote", "yes")
        assert await env.result(votes) == ["yes", "no", "yes"]

        # Errors: an unknown run, a run that has ended.
        unknown = env.client.handle("collect_votes", "no-such-run")
        await expect(RunNotFound, unknown.signal("vote", "yes"))
        await expect(InvalidRunState, votes.signal("vote", "late"))


async def expect(error: type[Exception], call: Awaitable[Any]) -> None:
    try:
        await call
    except error as exc:
        print(f"{error.__name__}: {exc}")
        return
    raise AssertionError(f"expected {error.__name__}")


def from_sync_code(path: str) -> None:
    store = open_store(f"sqlite:///{path}")
    client = WorkflowClient(store)  # blocking: a web view, a script, a CLI
    worker = WorkflowWorker(
        store=store,
        workflows=[expense_approval],
        options=WorkerOptions(claim_poll_interval=0.05),
    )
    thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
    thread.start()
    try:
        run = client.submit("expense_approval", {"amount": 45})
        deadline = time.monotonic() + WAIT_LIMIT
        while run.status() is not RunStatus.WAITING:
            assert time.monotonic() < deadline, "the run never started waiting"
            time.sleep(0.02)
        run.signal("decision", {"approved": True, "by": "sam"})  # e.g. from a button's view
        result = run.result(timeout=WAIT_LIMIT)
        print("approved from sync code:", result)
        assert result == {"amount": 45, "approved": True, "by": "sam"}
    finally:
        worker.stop()
        thread.join(timeout=30)
        client.close()


def main() -> None:
    asyncio.run(in_the_test_env())
    with tempfile.TemporaryDirectory() as directory:
        from_sync_code(f"{directory}/signals.db")


if __name__ == "__main__":
    main()
