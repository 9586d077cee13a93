"""The timer loop wakes claims ``CLAIM_AHEAD`` before a due time. For a run held by a rate
limit that claim is refused (its token is not there yet); when the loop looks again after
the time has passed, ``next_due_at`` (future times only) no longer names it, and the run
used to wait for the claim poll (an audit: 2.4 runs/s under a 5/s limit with a one-second
poll, on Valkey). The loop now looks once more at the time itself when the early claim
took nothing, and only once (a worker with every slot taken must not spin)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from pyrula.workflows import loops
from pyrula.workflows.options import WorkerOptions


class StubWorker:
    """What ``timer_loop`` uses of a worker, with a store whose next due time is ``due``
    while it is in the future (as the stores compute it) and claims that take nothing."""

    def __init__(self, due: float, claimed: int | None = 0) -> None:
        self.options = WorkerOptions(timer_poll_interval_s=5.0)
        self.timers_changed, self.timers_hint = asyncio.Event(), asyncio.Event()
        self.wakes: list[float] = []
        self.claimed = claimed
        self.store_clock = SimpleNamespace(note=lambda *_: None)

        async def next_due_at(_names: Any) -> float | None:
            return due if due > time.time() else None

        async def nothing(*_: Any) -> int:
            return 0

        async def now() -> float:
            return time.time()

        self.store = SimpleNamespace(next_due_at=next_due_at, fire_timers=nothing, now=now)

    def wake_claimers(self) -> None:
        self.wakes.append(time.time())

    async def claim_round_done(self, _timeout: float) -> int | None:
        await asyncio.sleep(0.02)  # a claim round trip: the due time passes meanwhile
        return self.claimed

    async def wait_stop_or(self, timeout: float, *events: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, timeout=max(0.0, timeout))
        finally:
            for w in waits:
                w.cancel()


async def run_loop(worker: StubWorker, seconds: float) -> None:
    task = asyncio.ensure_future(loops.timer_loop(worker, ["wf"]))  # type: ignore[arg-type]
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_an_early_claim_that_took_nothing_is_followed_by_one_at_the_time() -> None:
    due = time.time() + 0.1
    worker = StubWorker(due, claimed=0)
    await run_loop(worker, 1.0)
    assert len(worker.wakes) == 2  # the early one, then one look more; no spin
    assert due <= worker.wakes[1] < due + 0.5  # at the time itself


async def test_an_early_claim_that_took_its_run_needs_no_second_look() -> None:
    due = time.time() + 0.1
    worker = StubWorker(due, claimed=1)
    await run_loop(worker, 1.0)
    assert len(worker.wakes) == 1
