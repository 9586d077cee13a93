"""The thread pool sync steps run in.

Its threads are daemon threads, unlike ``ThreadPoolExecutor``'s, which the interpreter
joins at exit: a sync step cannot be killed, so a worker that gave up on one (its run
already requeued, its result to be discarded) must still be able to exit.

:meth:`StepThreadPool.run_soon` is the engine's way in: the outcome goes straight to an
asyncio future through ``call_soon_threadsafe``, without the ``concurrent.futures.Future``
(and its condition variable) and the future chaining that ``loop.run_in_executor`` adds.
``submit`` keeps the :class:`~concurrent.futures.Executor` interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

_Submitted = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]
_Soon = tuple[asyncio.Future[Any], asyncio.AbstractEventLoop, Callable[[], Any]]


class StepThreadPool(Executor):
    """A fixed-size pool of daemon threads, started on demand."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "pyrula-step") -> None:
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._queue: queue.SimpleQueue[_Submitted | _Soon | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        """Threads that finished their work and wait for more (or are about to)."""
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self._put((future, fn, args, kwargs))
        return future

    def run_soon(self, loop: asyncio.AbstractEventLoop, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Call ``fn()`` on a pool thread; its result or exception resolves the returned
        future on ``loop``. Cancelling the future before a thread took ``fn`` skips it."""
        waiter: asyncio.Future[T] = loop.create_future()
        self._put((waiter, loop, fn))
        return waiter

    def _put(self, item: _Submitted | _Soon) -> None:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot run a step after the worker's pool shut down")
            self._queue.put(item)
            if self._idle:
                self._idle -= 1  # that thread takes this item
            elif len(self._threads) < self._max_workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self._prefix}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            deliver = _run_soon(*item) if len(item) == 3 else _run_submitted(*item)
            del item
            # Counted idle before the caller learns of the outcome, so that the caller's
            # next call finds this thread free instead of starting another.
            with self._lock:
                self._idle += 1
            if deliver is not None:
                deliver()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    continue
                if len(item) == 3:
                    waiter, loop = item[0], item[1]
                    _call_soon(loop, _cancel, waiter)
                else:
                    item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for thread in threads:
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
