"""StepThreadPool: the thread pool sync steps run in, and its asyncio way in (run_soon)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Callable

import pytest

from pyrula.workflows.engine.threads import StepThreadPool

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


async def test_run_soon_runs_off_the_loop_and_resolves_the_future() -> None:
    pool = StepThreadPool(2)
    loop = asyncio.get_running_loop()
    try:
        main = threading.get_ident()
        assert await pool.run_soon(loop, lambda: threading.get_ident() != main) is True
        with pytest.raises(ValueError, match="boom"):
            await pool.run_soon(loop, _raise(ValueError("boom")))
        # StopIteration cannot travel through an asyncio future: it arrives wrapped.
        with pytest.raises(RuntimeError, match="StopIteration") as info:
            await pool.run_soon(loop, _raise(StopIteration()))
        assert isinstance(info.value.__cause__, StopIteration)
    finally:
        pool.shutdown()


async def test_threads_are_reused_and_capped() -> None:
    pool = StepThreadPool(3)
    loop = asyncio.get_running_loop()
    try:
        for _ in range(20):  # one at a time: the one thread that ran the last takes it
            await pool.run_soon(loop, lambda: None)
        assert len(pool._threads) == 1
        gate = threading.Event()
        started = [pool.run_soon(loop, gate.wait) for _ in range(6)]
        await asyncio.sleep(0.05)
        assert len(pool._threads) == 3
        gate.set()
        assert await asyncio.gather(*started) == [True] * 6
    finally:
        pool.shutdown()


async def test_a_cancelled_call_that_no_thread_took_is_skipped() -> None:
    pool = StepThreadPool(1)
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    ran: list[str] = []
    try:
        busy = pool.run_soon(loop, gate.wait)
        queued = pool.run_soon(loop, lambda: ran.append("queued"))
        queued.cancel()
        gate.set()
        await busy
        await pool.run_soon(loop, lambda: None)  # after the cancelled one
        assert ran == []
    finally:
        pool.shutdown()


async def test_shutdown_cancels_what_is_queued_and_refuses_more() -> None:
    pool = StepThreadPool(1)
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    busy = pool.run_soon(loop, gate.wait)
    queued = pool.run_soon(loop, lambda: "never")
    submitted = pool.submit(lambda: "never either")
    pool.shutdown(wait=False, cancel_futures=True)
    await asyncio.sleep(0.01)
    assert queued.cancelled() and submitted.cancelled()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.run_soon(loop, lambda: None)
    gate.set()
    assert await busy is True


async def test_submit_keeps_the_executor_interface() -> None:
    pool = StepThreadPool(2)
    try:
        assert pool.submit(lambda a, b: a + b, 2, b=3).result(timeout=5) == 5
        VAR.set("in the step's context")
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        assert await pool.run_soon(loop, lambda: context.run(VAR.get)) == "in the step's context"
    finally:
        pool.shutdown()


def _raise(exc: BaseException) -> object:
    def fn() -> None:
        raise exc

    return fn


async def test_short_calls_queued_together_share_a_thread_or_two() -> None:
    pool = StepThreadPool(50)
    loop = asyncio.get_running_loop()
    try:
        for _ in range(5):
            used = await asyncio.gather(
                *[pool.run_soon(loop, threading.get_ident) for _ in range(200)]
            )
            # Waking a thread per call (a pool of 50 threads for 200 no-ops) costs the
            # loop a system call and a context switch each: one awake thread takes them.
            assert len(set(used)) <= 4
        assert len(pool._threads) <= 4
    finally:
        pool.shutdown()


async def test_calls_queued_behind_blocked_threads_spread_over_the_pool() -> None:
    pool = StepThreadPool(8)
    loop = asyncio.get_running_loop()
    try:
        meet = threading.Barrier(8, timeout=MEET)
        used = await asyncio.gather(
            *[pool.run_soon(loop, _meet_then_ident(meet)) for _ in range(8)]
        )
        # Each call blocks until all 8 run at once: one after the other they would break
        # the barrier. Each got a thread of its own after STALL.
        assert len(set(used)) == 8
    finally:
        pool.shutdown()


def test_a_pool_outlives_the_loop_that_was_to_look_again() -> None:
    pool = StepThreadPool(4)
    gate = threading.Event()

    async def leave_a_look_pending() -> None:
        loop = asyncio.get_running_loop()
        first = pool.run_soon(loop, gate.wait)
        pool.run_soon(loop, gate.wait)  # behind it: the loop is to look again, then closes
        await asyncio.sleep(0)
        first.cancel()

    async def blocked_calls_still_spread() -> list[int]:
        loop = asyncio.get_running_loop()
        meet = threading.Barrier(2, timeout=MEET)  # broken if they run one after the other
        return await asyncio.gather(
            *[pool.run_soon(loop, _meet_then_ident(meet)) for _ in range(2)]
        )

    try:
        asyncio.run(leave_a_look_pending())
        gate.set()
        assert len(set(asyncio.run(blocked_calls_still_spread()))) == 2
    finally:
        pool.shutdown()


MEET = 30.0
"""How long a call waits for the others at its barrier: calls that run at the same time
meet at once; calls run one after the other never do (the barrier breaks)."""


def _meet_then_ident(meet: threading.Barrier) -> Callable[[], int]:
    def call() -> int:
        meet.wait()
        return threading.get_ident()

    return call


def test_submitted_calls_get_a_thread_each_when_the_awake_one_blocks() -> None:
    pool = StepThreadPool(4)
    gate = threading.Event()
    try:
        pool.submit(lambda: None).result(timeout=5)  # a thread, asleep again after it
        blocker = pool.submit(gate.wait)  # wakes it: awake, between calls
        second = pool.submit(lambda: "ran")  # no loop will look again: it needs a thread
        assert second.result(timeout=5) == "ran"
        gate.set()
        assert blocker.result(timeout=5) is True
    finally:
        gate.set()
        pool.shutdown()


def test_a_call_behind_one_left_by_a_closed_loop_still_runs() -> None:
    pool = StepThreadPool(4)
    first, second = threading.Event(), threading.Event()

    async def queue_two_and_close() -> None:
        loop = asyncio.get_running_loop()
        pool.run_soon(loop, first.wait)  # a thread, which blocks
        pool.run_soon(loop, second.wait)  # queued: this loop was to look again, and closes

    async def one_more() -> str:
        loop = asyncio.get_running_loop()
        # A thread is woken for it, but takes the older blocking call first: this loop
        # must look again and give it a thread of its own.
        return await asyncio.wait_for(pool.run_soon(loop, lambda: "ran"), 5)

    try:
        asyncio.run(queue_two_and_close())
        time.sleep(0.05)  # the first call is past STALL, blocked
        assert asyncio.run(one_more()) == "ran"
    finally:
        first.set()
        second.set()
        pool.shutdown()


async def test_calls_that_wait_get_a_thread_each_at_once() -> None:
    pool = StepThreadPool(8)
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    try:
        for _ in range(4):  # recent calls took 2 ms each: calls that wait
            await pool.run_soon(loop, lambda: time.sleep(0.002))
        waiting = [pool.run_soon(loop, gate.wait) for _ in range(6)]
        # Threads were started (or woken) as the calls were queued, not a STALL later.
        assert len(pool._threads) >= 5
        gate.set()
        assert await asyncio.gather(*waiting) == [True] * 6
    finally:
        gate.set()
        pool.shutdown()
