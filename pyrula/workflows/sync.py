"""The blocking WorkflowClient, for plain sync code (web views, scripts, Celery-style callers).

One per process, shared between threads: it runs the async client on one private
event-loop thread, started on first use. It is safe across ``fork``: the child starts
its own loop thread on first use (and the store reconnects), so a client created at
import time under gunicorn ``--preload`` or a prefork pool works in every worker.
Don't call it before the fork if you can avoid it; creating it is free.

On a single-node ValkeyStore the calls made per task (submit without an idempotency
key, read a run, wait for a run to end) skip the loop thread: they run in the calling
thread on a blocking connection pool (:mod:`pyrula.workflows.stores.valkey.blocking`),
with the same Lua functions and the same checks. Anything else goes through the loop
thread: the other calls, an idempotency key, a cluster, the first call of a process
(it opens the store), the first run of each workflow (the store notes it), a call after
the server was unreachable (the store checks it for data loss first).
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Coroutine, Iterable, Mapping
from concurrent.futures import Future
from datetime import datetime
from typing import Any, TypeVar, cast

from pyrula.workflows.client import Delay, RunHandle, outcome_of
from pyrula.workflows.client import WorkflowClient as AsyncWorkflowClient
from pyrula.workflows.errors import PyrulaError, RunNotFound
from pyrula.workflows.inspection import live_workers
from pyrula.workflows.records import RunRecord, RunStatus, WorkerInfo
from pyrula.workflows.registry import Registry, WorkflowDefinition
from pyrula.workflows.serialization import DEFAULT_MAX_PAYLOAD_BYTES
from pyrula.workflows.stores.base import BlockingRuns, Store, events_of, fast_path_of

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
        fast = fast_path_of(store)
        self._fast = None if fast is None else fast.blocking_runs()
        self._archived = self._fast is not None and cast(object, fast) is not store
        """The fast path serves the store an ArchivingStore wraps: what it does not
        find there may be in the archive (the async path reads it)."""
        _clients.add(self)

    def _ready_fast(self) -> BlockingRuns | None:
        """The blocking fast path, if it can take a call now."""
        fast = self._fast
        if fast is None:
            return None
        if self._closed:
            raise PyrulaError("this WorkflowClient is closed")
        runner = self._runner
        if runner is not None and threading.current_thread() is runner.thread:
            raise PyrulaError("the blocking client cannot be called from its own loop")
        return fast if fast.ready() else None

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
        fresh_id: bool = False,
        keep_key_order: bool = False,
    ) -> SyncRunHandle:
        """Queue a run; see the async client's ``submit``."""
        new = self._async.new_run(
            workflow,
            params,
            owner=owner,
            delay=delay,
            start_at=start_at,
            idempotency_key=idempotency_key,
            run_id=run_id,
            expires_at=expires_at,
            fresh_id=fresh_id,
            keep_key_order=keep_key_order,
        )
        # Through an archive only an id made up at random skips its lookup (see NewRun).
        direct = idempotency_key is None and (new.generated_id or not self._archived)
        fast = self._ready_fast() if direct else None
        if fast is not None and fast.create(new):
            return SyncRunHandle(self, self._async.handle(new.workflow, new.run_id))
        record, _ = self._call(self.store.create_run(new))
        return SyncRunHandle(self, self._async.handle(record.workflow, record.run_id))

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run's record, or None for an unknown id (the store's ``get_run``)."""
        fast = self._ready_fast()
        if fast is not None:
            found = fast.get_run(run_id)
            if found is not None or not self._archived:
                return found
        return self._call(self.store.get_run(run_id))

    def wait_run(self, run_id: str, timeout: float | None) -> RunRecord:
        """The store's ``wait_run``: the run once it has ended, or as it is when
        ``timeout`` seconds pass (or the client closes). Raises RunNotFound."""
        fast = self._ready_fast()
        if fast is not None:
            try:
                return fast.wait_run(run_id, timeout)
            except RunNotFound:
                if not self._archived:
                    raise
        return self._call(self.store.wait_run(run_id, timeout))

    def send_events(
        self, trigger: str, events: Iterable[Any], timeout: float | None = None
    ) -> list[int]:
        """Append ``events`` to the batch trigger's buffer; see the async client's."""
        name, texts = self._async.event_texts(trigger, events)  # checked in this thread
        buffers = events_of(self.store, "sending events")
        return self._call(buffers.append_events(name, texts), timeout)

    def send_event(self, trigger: str, event: Any, timeout: float | None = None) -> int:
        """Append one event to the batch trigger's buffer; return its sequence number."""
        return self.send_events(trigger, [event], timeout)[0]

    def handle(self, workflow: str, run_id: str) -> SyncRunHandle:
        return SyncRunHandle(self, self._async.handle(workflow, run_id))

    def purge_queued(self, workflows: Iterable[str], timeout: float | None = None) -> int:
        """Cancel every run of ``workflows`` that waits to start; how many (see the async
        :meth:`pyrula.workflows.WorkflowClient.purge_queued`)."""
        return self._call(self._async.purge_queued(list(workflows)), timeout)

    def list_workers(
        self,
        timeout: float | None = None,
        *,
        stale_after: float | None = None,
        include_dead: bool = False,
    ) -> list[WorkerInfo]:
        """The live workers, most recently seen first: those whose heartbeat is at most
        their own ``lock_ttl`` old, or ``stale_after`` seconds if given (see
        :mod:`pyrula.workflows.inspection`); with ``include_dead`` also the killed ones
        the store still lists."""
        if include_dead:
            return self._call(self.store.list_workers(), timeout)
        return self._call(live_workers(self.store, stale_after), timeout)

    def close(self) -> None:
        """Close the store and stop the loop thread. Idempotent."""
        if self._closed:
            return
        if self._fast is not None:
            self._fast.close()  # waits in other threads return
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
        """The run's full record. Raises RunNotFound."""
        run = self._client.get_run(self.run_id)
        if run is None:
            raise RunNotFound(f"no run with id {self.run_id!r} in {self._client.store.url}")
        return run

    def status(self) -> RunStatus:
        return self.record().status

    def result(self, timeout: float | None = None) -> Any:
        """Block until the run ends; see the async handle's ``result``."""
        return outcome_of(self._client.wait_run(self.run_id, timeout))

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
        if client._fast is not None:
            client._fast.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
