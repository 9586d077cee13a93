"""``celery.contrib.testing.manager``: ``Manager``, the helpers of integration tests.

``Manager(app)`` waits for things (``wait_for``, ``ensure_not_for_a_while``), joins
results with progress remarks (``join``), and asks the workers about tasks through
``app.control.inspect()`` (``query_tasks``, ``assert_received``, ``assert_accepted``,
``wait_until_idle``), as Celery's does; it reads the store where Celery reads the
broker and the result backend.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import count
from typing import Any, TextIO

from pyrula.workflows import StoreUnavailable
from pyrula_compat import states
from pyrula_compat.exceptions import TimeoutError
from pyrula_compat.result import AsyncResult
from pyrula_compat.result_types import ResultSet
from pyrula_compat.utils.time import humanize_seconds as _humanize_seconds

E_STILL_WAITING = "Still waiting for {0}.  Trying again {when}: {exc!r}"

humanize_seconds = partial(_humanize_seconds, microseconds=True)


class Sentinel(Exception):
    """The thing waited for has not happened yet."""


def retry_over_time(
    fun: Callable[..., Any],
    catch: type[BaseException] | tuple[type[BaseException], ...],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    errback: Callable[[BaseException, Iterator[float], int], float] | None = None,
    max_retries: int | None = None,
    interval_start: float = 2,
    interval_step: float = 2,
    interval_max: float = 30,
    callback: Callable[[], Any] | None = None,
    timeout: float | None = None,
) -> Any:
    """Call ``fun`` until it returns without raising ``catch``: after ``max_retries``
    retries (or ``timeout`` seconds) the last error is raised. The waits grow from
    ``interval_start`` by ``interval_step`` up to ``interval_max`` seconds; ``errback``
    may return the wait to use instead. (kombu's function, which Celery uses.)"""
    kwargs = kwargs or {}
    deadline = time.monotonic() + timeout if timeout else None

    def intervals() -> Iterator[float]:
        wait = interval_start
        while True:
            yield wait
            wait = min(wait + interval_step, interval_max)

    waits = intervals()
    for retries in count():
        try:
            return fun(*args, **kwargs)
        except catch as exc:
            out_of_time = deadline is not None and time.monotonic() > deadline
            if (max_retries is not None and retries >= max_retries) or out_of_time:
                raise
            wait = errback(exc, waits, retries) if errback else next(waits)
            if callback is not None:
                callback()
            time.sleep(wait)
    raise AssertionError("unreachable")


class ManagerMixin:
    """What :class:`Manager` can do, for classes that have an ``app``."""

    app: Any

    def _init_manager(
        self,
        block_timeout: float = 30 * 60.0,
        no_join: bool = False,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        self.stdout = sys.stdout if stdout is None else stdout
        self.stderr = sys.stderr if stderr is None else stderr
        self.connerrors: tuple[type[BaseException], ...] = (StoreUnavailable,)
        self.block_timeout = block_timeout
        self.no_join = no_join

    def remark(self, s: str, sep: str = "-") -> None:
        print(f"{sep}{s}", file=self.stdout)

    def warn(self, s: str) -> None:
        self.stderr.write(s + "\n")

    def missing_results(self, r: Sequence[AsyncResult]) -> list[str]:
        """The ids of the results in ``r`` that are not ready."""
        return [res.id for res in r if not res.ready()]

    def wait_for(
        self,
        fun: Callable[..., Any],
        catch: Any,
        desc: str = "thing",
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        errback: Callable[..., Any] | None = None,
        max_retries: int = 10,
        interval_start: float = 0.1,
        interval_step: float = 0.5,
        interval_max: float = 5.0,
        emit_warning: bool = False,
        **options: Any,
    ) -> Any:
        """Call ``fun`` until it stops raising ``catch`` (the thing has not happened yet)."""

        def on_error(exc: BaseException, intervals: Iterator[float], retries: int) -> float:
            interval = next(intervals)
            if emit_warning:
                self.warn(
                    E_STILL_WAITING.format(
                        desc, when=humanize_seconds(interval, "in", " "), exc=exc
                    )
                )
            if errback:
                errback(exc, interval, retries)
            return interval

        return self.retry_over_time(
            fun,
            catch,
            args=args,
            kwargs=kwargs or {},
            errback=on_error,
            max_retries=max_retries,
            interval_start=interval_start,
            interval_step=interval_step,
            interval_max=interval_max,
            **options,
        )

    def ensure_not_for_a_while(
        self,
        fun: Callable[..., Any],
        catch: Any,
        desc: str = "thing",
        max_retries: int = 20,
        interval_start: float = 0.1,
        interval_step: float = 0.02,
        interval_max: float = 1.0,
        emit_warning: bool = False,
        **options: Any,
    ) -> None:
        """``AssertionError`` if ``fun`` stops raising ``catch`` within the retries."""
        try:
            self.wait_for(
                fun,
                catch,
                desc=desc,
                max_retries=max_retries,
                interval_start=interval_start,
                interval_step=interval_step,
                interval_max=interval_max,
                emit_warning=emit_warning,
            )
        except catch:
            return
        raise AssertionError(f"Should not have happened: {desc}")

    def retry_over_time(self, *args: Any, **kwargs: Any) -> Any:
        return retry_over_time(*args, **kwargs)

    def join(self, r: Any, propagate: bool = False, max_retries: int = 10, **kwargs: Any) -> Any:
        """``r.get(...)`` (a result set for one result), remarking on what is still
        missing after each timeout; ``AssertionError`` after ``max_retries`` of them."""
        if self.no_join:
            return None
        if not isinstance(r, ResultSet):
            r = ResultSet([r], app=self.app)
        received: list[str] = []

        def on_result(task_id: str, value: Any) -> None:
            received.append(task_id)

        for _ in range(max_retries) if max_retries else count(0):
            received[:] = []
            try:
                return r.get(callback=on_result, propagate=propagate, **kwargs)
            except TimeoutError as exc:
                waiting_for = ", ".join(self.missing_results(r))
                self.remark(
                    f"Still waiting for {len(r) - len(received)}/{len(r)}: "
                    f"[{waiting_for[:200]}]: {exc!r}",
                    "!",
                )
            except self.connerrors as exc:
                self.remark(f"join: connection lost: {exc!r}", "!")
        raise AssertionError("Test failed: Missing task results")

    def inspect(self, timeout: float = 3.0) -> Any:
        return self.app.control.inspect(timeout=timeout)

    def query_tasks(self, ids: Sequence[str], timeout: float = 0.5) -> Iterator[tuple[str, Any]]:
        """``(worker, {task_id: [state, info]})`` for the workers that hold the tasks."""
        tasks = self.inspect(timeout).query_task(*ids) or {}
        yield from tasks.items()

    def query_task_states(self, ids: Sequence[str], timeout: float = 0.5) -> dict[str, set[str]]:
        """``{state: {task ids}}`` as the workers report them."""
        found: dict[str, set[str]] = defaultdict(set)
        for _, reply in self.query_tasks(ids, timeout=timeout):
            for task_id, (state, _) in reply.items():
                found[state].add(task_id)
        return found

    def assert_accepted(
        self,
        ids: Sequence[str],
        interval: float = 0.5,
        desc: str = "waiting for tasks to be accepted",
        **policy: Any,
    ) -> Any:
        return self.assert_task_worker_state(
            self.is_accepted, ids, interval=interval, desc=desc, **policy
        )

    def assert_received(
        self,
        ids: Sequence[str],
        interval: float = 0.5,
        desc: str = "waiting for tasks to be received",
        **policy: Any,
    ) -> Any:
        return self.assert_task_worker_state(
            self.is_received, ids, interval=interval, desc=desc, **policy
        )

    def assert_result_tasks_in_progress_or_completed(
        self,
        async_results: Sequence[AsyncResult],
        interval: float = 0.5,
        desc: str = "waiting for tasks to be started or completed",
        **policy: Any,
    ) -> Any:
        return self.assert_task_state_from_result(
            self.is_result_task_in_progress, async_results, interval=interval, desc=desc, **policy
        )

    def assert_task_state_from_result(
        self, fun: Callable[..., Any], results: Any, interval: float = 0.5, **policy: Any
    ) -> Any:
        return self.wait_for(
            partial(self.true_or_raise, fun, results, timeout=interval), (Sentinel,), **policy
        )

    @staticmethod
    def is_result_task_in_progress(results: Sequence[AsyncResult], **kwargs: Any) -> bool:
        return all(r.state in (states.STARTED, states.SUCCESS) for r in results)

    def assert_task_worker_state(
        self, fun: Callable[..., Any], ids: Sequence[str], interval: float = 0.5, **policy: Any
    ) -> Any:
        return self.wait_for(
            partial(self.true_or_raise, fun, ids, timeout=interval), (Sentinel,), **policy
        )

    def is_received(self, ids: Sequence[str], **kwargs: Any) -> bool:
        return self._ids_matches_state(["reserved", "active", "ready"], ids, **kwargs)

    def is_accepted(self, ids: Sequence[str], **kwargs: Any) -> bool:
        return self._ids_matches_state(["active", "ready"], ids, **kwargs)

    def _ids_matches_state(
        self, expected_states: Sequence[str], ids: Sequence[str], timeout: float = 0.5
    ) -> bool:
        found = self.query_task_states(ids, timeout=timeout)
        return all(any(t in found[k] for k in expected_states) for t in ids)

    def true_or_raise(self, fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        res = fun(*args, **kwargs)
        if not res:
            raise Sentinel()
        return res

    def wait_until_idle(self) -> None:
        """Purge the queues, then wait until no worker runs a task."""
        control = self.app.control
        while control.purge():
            pass
        inspect = control.inspect()
        while sum(len(tasks) for tasks in (inspect.active() or {}).values()):
            time.sleep(0.1)


class Manager(ManagerMixin):
    """Helpers for integration tests of ``app``."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        self.app = app
        self._init_manager(**kwargs)


__all__ = ["E_STILL_WAITING", "Manager", "ManagerMixin", "Sentinel", "humanize_seconds"]
