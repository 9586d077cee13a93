"""The thread pool sync steps run in.

Its threads are daemon threads, unlike ``ThreadPoolExecutor``'s, which the interpreter
joins at exit: a sync step cannot be killed, so a worker that gave up on one (its run
already requeued, its result to be discarded) must still be able to exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class StepThreadPool(Executor):
    """A fixed-size pool of daemon threads, started on demand."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "pyrula-step") -> None:
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot run a step after the worker's pool shut down")
            self._queue.put((future, fn, args, kwargs))
            # A released permit means a thread finished its work and waits for more.
            if not self._idle.acquire(timeout=0) and len(self._threads) < self._max_workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self._prefix}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del item, future, fn, args, kwargs
            self._idle.release()

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
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for thread in threads:
                thread.join()
