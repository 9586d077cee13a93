"""The blocking WorkflowClient, for plain sync code (web views, scripts, Celery-style callers).

One per process, shared between threads: it runs the async client on one private
event-loop thread, started on first use. It is safe across ``fork``: the child starts
its own loop thread on first use (and the store reconnects), so a client created at
import time under gunicorn ``--preload`` or a prefork pool works in every worker.
Don't call it before the fork if you can avoid it; creating it is free.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from datetime import datetime
from typing import Any, TypeVar

from pyrula.workflows.client import Delay, RunHandle
from pyrula.workflows.client import WorkflowClient as AsyncWorkflowClient
from pyrula.workflows.errors import PyrulaError
from pyrula.workflows.records import RunRecord, RunStatus
from pyrula.workflows.registry import Registry, WorkflowDefinition
from pyrula.workflows.serialization import DEFAULT_MAX_PAYLOAD_BYTES
from pyrula.workflows.stores.base import Store

T = TypeVar("T")

_clients: weakref.WeakSet[WorkflowClient] = weakref.WeakSet()


class _LoopThread:
    """An event loop running forever on a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name="pyrula-client", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()


class WorkflowClient:
    """Blocking twin of :class:`pyrula.workflows.client.WorkflowClient`; same arguments."""

    def __init__(
        self,
        store: Store,
        *,
        registry: Registry | None = None,
        require_registered: bool = True,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self._async = AsyncWorkflowClient(
            store,
            registry=registry,
            require_registered=require_registered,
            max_payload_bytes=max_payload_bytes,
        )
        self.store = store
        self._lock = threading.Lock()
        self._runner: _LoopThread | None = None
        self._pid = os.getpid()
        self._closed = False
        _clients.add(self)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._closed:
            coro.close()
            raise PyrulaError("this WorkflowClient is closed")
        with self._lock:
            if self._runner is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._runner = _LoopThread()
            runner = self._runner
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            if threading.current_thread() is runner.thread:
                coro.close()
                raise PyrulaError("the blocking client cannot be called from its own loop")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, runner.loop)
        return future.result(timeout)

    def submit(
        self,
        workflow: str | WorkflowDefinition,
        params: Mapping[str, Any] | None = None,
        *,
        owner: str | None = None,
        delay: Delay | None = None,
        start_at: datetime | float | None = None,
        idempotency_key: str | None = None,
        run_id: str | None = None,
        expires_at: datetime | float | None = None,
    ) -> SyncRunHandle:
        """Queue a run; see the async client's ``submit``."""
        handle = self._call(
            self._async.submit(
                workflow,
                params,
                owner=owner,
                delay=delay,
                start_at=start_at,
                idempotency_key=idempotency_key,
                run_id=run_id,
                expires_at=expires_at,
            )
        )
        return SyncRunHandle(self, handle)

    def handle(self, workflow: str, run_id: str) -> SyncRunHandle:
        return SyncRunHandle(self, self._async.handle(workflow, run_id))

    def close(self) -> None:
        """Close the store and stop the loop thread. Idempotent."""
        if self._closed:
            return
        runner = self._runner
        if runner is not None and self._pid == os.getpid():
            try:
                asyncio.run_coroutine_threadsafe(self._async.close(), runner.loop).result(10)
            finally:
                runner.stop()
        self._closed = True
        self._runner = None

    def __enter__(self) -> WorkflowClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncRunHandle:
    """Blocking twin of :class:`pyrula.workflows.client.RunHandle`."""

    def __init__(self, client: WorkflowClient, handle: RunHandle) -> None:
        self._client = client
        self._handle = handle
        self.run_id = handle.run_id
        self.workflow = handle.workflow

    def __repr__(self) -> str:
        return f"SyncRunHandle(workflow={self.workflow!r}, run_id={self.run_id!r})"

    def record(self) -> RunRecord:
        return self._client._call(self._handle.record())

    def status(self) -> RunStatus:
        return self._client._call(self._handle.status())

    def result(self, timeout: float | None = None) -> Any:
        """Block until the run ends; see the async handle's ``result``."""
        return self._client._call(self._handle.result(timeout))

    def signal(self, name: str, payload: Any = None) -> None:
        """Send a signal to the run; see the async handle's ``signal``."""
        self._client._call(self._handle.signal(name, payload))

    def forget(self) -> bool:
        return self._client._call(self._handle.forget())

    def cancel(self) -> RunRecord:
        return self._client._call(self._handle.cancel())

    def terminate(self) -> RunRecord:
        return self._client._call(self._handle.terminate())

    def retry(self) -> RunRecord:
        return self._client._call(self._handle.retry())


def _after_fork_in_child() -> None:
    for client in list(_clients):
        client._runner = None  # the parent's loop thread does not exist here
        client._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
