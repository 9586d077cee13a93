"""Time limits on store calls (stores/deadlines.py): asyncio.timeout's contract with
one timer per loop for every call in flight."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import pytest

from pyrula.workflows.stores.deadlines import deadline


async def test_a_call_past_its_limit_raises_timeout_error_at_its_limit() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with deadline(0.05):
            await asyncio.sleep(60)
    # Not before its limit (a correctness bound); at it, not at the end of the 60 s call
    # (generous: three limits and a second, for a loaded machine).
    assert 0.04 <= time.monotonic() - started < 0.05 * 3 + 1
    task = asyncio.current_task()
    assert task is not None and not getattr(task, "cancelling", lambda: 0)()  # none pending
    await asyncio.sleep(0.01)


async def test_calls_in_flight_each_expire_at_their_own_time() -> None:
    async def call(limit: float, takes: float) -> str:
        started = time.monotonic()
        try:
            async with deadline(limit):
                await asyncio.sleep(takes)
        except TimeoutError:
            return f"timeout after {time.monotonic() - started:.3f} at {time.monotonic():.3f}"
        return "done"

    results = await asyncio.gather(
        call(0.30, 0.01),  # arms the timer first, finishes long before it fires
        call(0.05, 60),
        call(5, 0.10),
        call(0.15, 60),
        *(call(1.0, 0.02) for _ in range(50)),
    )
    assert results[0] == "done" and results[2] == "done"
    assert all(r == "done" for r in results[4:])
    first, second = results[1], results[3]
    assert first.startswith("timeout") and second.startswith("timeout")
    (first_took, first_at), (second_took, second_at) = (
        (float(r.split()[2]), float(r.split()[4])) for r in (first, second)
    )
    # Each not before its own limit, the shorter one first; generous upper bounds (three
    # limits and a second) only tell "at its limit" from "when the 60 s call ends".
    assert 0.04 <= first_took < 0.05 * 3 + 1
    assert 0.14 <= second_took < 0.15 * 3 + 1
    assert first_at <= second_at


async def test_a_cancellation_from_elsewhere_passes_through() -> None:
    entered = asyncio.Event()

    async def call() -> None:
        async with deadline(5):
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.ensure_future(call())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_block_that_ends_in_time_leaves_nothing_behind() -> None:
    for _ in range(100):
        async with deadline(0.02):
            await asyncio.sleep(0)
    await asyncio.sleep(0.1)  # past every limit: no stray cancellation arrives
    async with deadline(0.02):
        pass


async def test_it_needs_a_task() -> None:
    loop = asyncio.get_running_loop()
    step = deadline(1).__aenter__()
    # Run the coroutine outside any task: a bare send from a loop callback.
    outcome: list[BaseException] = []

    def drive() -> None:
        try:
            step.send(None)
        except BaseException as exc:  # recorded for the assertion
            outcome.append(exc)

    loop.call_soon(drive)
    await asyncio.sleep(0.01)
    assert outcome and isinstance(outcome[0], RuntimeError)


def test_a_loop_that_used_it_can_be_freed() -> None:
    """A loop holds its own table of calls: nothing keeps a closed loop alive."""
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def use() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        async with deadline(5):
            await asyncio.sleep(0)

    for _ in range(3):
        asyncio.run(use())
    gc.collect()
    assert [ref() for ref in loops] == [None, None, None]
