"""The thread pool sync steps run in.

Its threads are daemon threads, unlike ``ThreadPoolExecutor``'s, which the interpreter
joins at exit: a sync step cannot be killed, so a worker that gave up on one (its run
already requeued, its result to be discarded) must still be able to exit.

:meth:`StepThreadPool.run_soon` is the engine's way in: the outcome goes straight to an
asyncio future through ``call_soon_threadsafe``, without the ``concurrent.futures.Future``
(and its condition variable) and the future chaining that ``loop.run_in_executor`` adds.
``submit`` keeps the :class:`~concurrent.futures.Executor` interface.

**Waking threads.** Waking a sleeping thread costs the waker a system call and, on a
busy machine, a context switch in the middle of its work, holding the GIL: measured in
a worker running no-op Celery tasks, 20 - 30 µs of the event loop's time per step, and
a pool of 50 threads cost that worker ~15 % more CPU per task than a pool of one. So
while calls are short (under ``SHORT`` on recent average), a call from
:meth:`run_soon` wakes a thread only when no thread will take it soon: none is awake,
or every awake one has been in its current call for ``STALL`` or more (blocked, on I/O
say). Otherwise it waits for the awake thread, and the loop looks again every ``STALL``
while calls are queued: when no thread took one since its last look, the awake threads
are stuck in their calls, and each queued call gets a thread, up to ``max_workers``.
Short calls therefore run one after the other on one thread or two. Longer calls, which
mostly wait, each get a thread at once, as :meth:`submit`'s always do.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

_Submitted = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]
_Soon = tuple[asyncio.Future[Any], asyncio.AbstractEventLoop, Callable[[], Any]]

STALL = 0.01
"""Seconds a thread may be in one call before calls queued behind it wake another: twice
the interpreter's GIL switch interval (5 ms), since a thread that waits that long for
the GIL (the loop's thread holding it) is not blocked."""

SHORT = 0.00025
"""Calls that take less than this, recently on average, share the awake threads (no-op
Celery tasks take 25 - 70 µs here); longer ones (a task that sends the next of its chain
takes 0.6 - 1.5 ms, most of it waiting on the store) get a thread each at once."""
TYPICAL_WEIGHT = 0.25
"""The weight of the latest call in the moving average of call times."""

_BETWEEN = float("inf")
"""A running thread's start time while it is between two calls (it takes the next)."""


class _Slot:
    """One thread's place in the pool: what wakes it when it sleeps."""

    __slots__ = ("wake",)

    def __init__(self) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()  # released by a waker; the thread's acquire then returns


class StepThreadPool(Executor):
    """A pool of at most ``max_workers`` daemon threads, started on demand."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "pyrula-step") -> None:
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._items: collections.deque[_Submitted | _Soon] = collections.deque()
        self._threads: list[threading.Thread] = []
        self._sleeping: list[_Slot] = []
        """Threads waiting for work, the one that slept last at the end (woken first)."""
        self._running: dict[_Slot, float] = {}
        """Awake threads: when each started its current call (_BETWEEN: none)."""
        self._taken = 0
        """Calls taken by a thread so far."""
        self._typical = 0.0
        """How long a call takes, recently (seconds, a moving average)."""
        self._watch: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None
        """The loop's next look at calls left queued (run_soon), if one is due."""
        self._shutdown = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self._put((future, fn, args, kwargs), None)
        return future

    def run_soon(self, loop: asyncio.AbstractEventLoop, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Call ``fn()`` on a pool thread; its result or exception resolves the returned
        future on ``loop``. Cancelling the future before a thread took ``fn`` skips it."""
        waiter: asyncio.Future[T] = loop.create_future()
        self._put((waiter, loop, fn), loop)
        return waiter

    def _put(self, item: _Submitted | _Soon, loop: asyncio.AbstractEventLoop | None) -> None:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot run a step after the worker's pool shut down")
            self._items.append(item)
            now = time.monotonic()
            if loop is None or self._typical >= SHORT:
                # A thread for each queued call, unless threads between calls will take
                # them: submit() has no loop to look again later, and calls that wait on
                # I/O are better spread at once.
                between = sum(1 for start in self._running.values() if start is _BETWEEN)
                soon = between >= len(self._items)
            else:
                soon = any(now - start < STALL for start in self._running.values())
            wake = None if soon else self._wake_one()
            # Unless the thread woken takes the only queued call, the loop looks again
            # (a watch left on a loop that closed since is replaced).
            queued_behind = len(self._items) > (0 if wake is None else 1)
            if loop is not None and queued_behind and self._can_grow():
                self._watch_from(loop)
        if wake is not None:
            wake()

    def _watch_from(self, loop: asyncio.AbstractEventLoop) -> None:
        """Under the lock: have ``loop`` look again ``STALL`` from now, unless it will
        already (a look due on another loop, one that closed since, is replaced)."""
        if self._watch is not None:
            if self._watch[0] is loop and not loop.is_closed():
                return
            self._watch[1].cancel()
        self._watch = (loop, loop.call_later(STALL, self._look_again, loop, self._taken))

    def _can_grow(self) -> bool:
        return bool(self._sleeping) or len(self._threads) < self._max_workers

    def _wake_one(self) -> Callable[[], None] | None:
        """Under the lock: a thread made to take a call, by what the caller does once it
        released the lock (wake a sleeping one, or start one); None when the pool is at
        ``max_workers`` with every thread awake."""
        if self._sleeping:
            slot = self._sleeping.pop()
            self._running[slot] = _BETWEEN
            return slot.wake.release
        if len(self._threads) < self._max_workers:
            slot = _Slot()
            self._running[slot] = _BETWEEN
            thread = threading.Thread(
                target=self._work,
                args=(slot,),
                name=f"{self._prefix}-{len(self._threads)}",
                daemon=True,
            )
            self._threads.append(thread)
            return thread.start
        return None

    def _look_again(self, loop: asyncio.AbstractEventLoop, taken: int) -> None:
        """On the loop, ``STALL`` after a call was left queued behind an awake thread:
        if no thread took a call since (``taken`` then), every awake one is stuck in its
        call, and each call still queued gets a thread, up to ``max_workers``."""
        woken: list[Callable[[], None]] = []
        with self._lock:
            if self._watch is not None and self._watch[0] is loop:
                self._watch = None
            if self._shutdown or not self._items:
                return
            if self._taken == taken:
                for _ in range(len(self._items)):
                    wake = self._wake_one()
                    if wake is None:
                        break
                    woken.append(wake)
            if self._can_grow():  # the awake threads may get stuck later
                self._watch_from(loop)
        for wake in woken:
            wake()

    def _work(self, slot: _Slot) -> None:
        items, lock, running = self._items, self._lock, self._running
        while True:
            with lock:
                if items:
                    item = items.popleft()
                    running[slot] = time.monotonic()
                    self._taken += 1
                elif self._shutdown:
                    running.pop(slot, None)
                    return
                else:
                    running.pop(slot, None)
                    self._sleeping.append(slot)
                    item = None
            if item is None:
                slot.wake.acquire()
                continue
            deliver = _run_soon(*item) if len(item) == 3 else _run_submitted(*item)
            del item
            # Between calls before the caller learns of the outcome, so that the caller's
            # next call finds this thread about to take it instead of waking another.
            with lock:
                took = time.monotonic() - running[slot]
                self._typical += (took - self._typical) * TYPICAL_WEIGHT
                running[slot] = _BETWEEN
            if deliver is not None:
                deliver()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
            sleeping, self._sleeping = self._sleeping, []
            dropped: list[_Submitted | _Soon] = []
            if cancel_futures:
                dropped, self._items = list(self._items), collections.deque()
            if self._watch is not None:  # on its loop's thread (a closed loop: no matter)
                watch_loop, handle = self._watch
                self._watch = None
                with contextlib.suppress(RuntimeError):
                    watch_loop.call_soon_threadsafe(handle.cancel)
        for item in dropped:
            if len(item) == 3:
                waiter, loop = item[0], item[1]
                _call_soon(loop, _cancel, waiter)
            else:
                item[0].cancel()
        for slot in sleeping:
            slot.wake.release()
        if wait:
            for thread in threads:
                if thread.ident is not None:  # one not started yet exits at its start
                    thread.join()


def _run_soon(
    waiter: asyncio.Future[Any], loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]
) -> Callable[[], None] | None:
    """Call ``fn``; return what hands its outcome to ``waiter`` (None: skipped)."""
    if waiter.cancelled():  # a racy read, but a run cancelled this late is let through
        return None
    try:
        result = fn()
    except BaseException as exc:
        if isinstance(exc, StopIteration):  # an asyncio future refuses it
            wrapped = RuntimeError(f"the step raised StopIteration: {exc!r}")
            wrapped.__cause__ = exc
            exc = wrapped
        return functools.partial(_call_soon, loop, _set_exception, waiter, exc)
    return functools.partial(_call_soon, loop, _set_result, waiter, result)


def _run_submitted(
    future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[[], None] | None:
    if not future.set_running_or_notify_cancel():
        return None
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        return functools.partial(future.set_exception, exc)
    return functools.partial(future.set_result, result)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for it any more
        loop.call_soon_threadsafe(callback, *args)


def _set_result(waiter: asyncio.Future[Any], result: Any) -> None:
    if not waiter.done():
        waiter.set_result(result)


def _set_exception(waiter: asyncio.Future[Any], exc: BaseException) -> None:
    if not waiter.done():
        waiter.set_exception(exc)


def _cancel(waiter: asyncio.Future[Any]) -> None:
    waiter.cancel()
