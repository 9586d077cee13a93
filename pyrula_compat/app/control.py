"""``app.control``: revoke (durable, even before the task is sent), and the inspect calls
health checks use."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pyrula.workflows import InvalidRunState, RunNotFound, open_store
from pyrula.workflows.errors import IdempotencyConflict
from pyrula_compat.runstate import REVOKED_TASK

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery


class Control:
    """Celery's remote control, on the store: no broadcast, nothing held in memory."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def revoke(
        self,
        task_id: str | Iterable[str],
        destination: Any = None,
        terminate: bool = False,
        signal: Any = None,
        **kwargs: Any,
    ) -> None:
        """Cancel the tasks durably: a queued or waiting one never runs, a running one
        stops at its next step boundary. ``terminate=True`` ends it at once: its result
        is discarded, and its worker raises ``BodyStopped`` in the body's thread at the
        run's next lease renewal (every ``lock_ttl / 3``). A finished
        id is left as it is. An id no task has yet is remembered, as Celery's workers
        remember revoked ids, but in the store: a revoked run is left under it, so the
        task sent later with that id is discarded (it never runs; it reads REVOKED)."""
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        client = self.app.client()
        for one in ids:
            self._revoke_one(client, str(one), terminate)

    def _revoke_one(self, client: Any, run_id: str, terminate: bool) -> None:
        handle = client.handle("", run_id)
        for _ in range(3):  # an unknown id: the tombstone, unless the task is sent meanwhile
            try:
                if terminate:
                    handle.terminate()
                else:
                    handle.cancel()
                return
            except InvalidRunState:  # already ended
                return
            except RunNotFound:
                pass
            try:
                created = client.submit(REVOKED_TASK, {}, run_id=run_id, idempotency_key=run_id)
            except (InvalidRunState, IdempotencyConflict):
                continue  # the task was sent meanwhile: revoke that run
            with contextlib.suppress(InvalidRunState):  # revoked twice at once
                created.cancel()
            return

    def terminate(self, task_id: str | Iterable[str], signal: Any = None, **kwargs: Any) -> None:
        self.revoke(task_id, terminate=True, signal=signal)

    def purge(self) -> int:
        """Celery drops queued messages; pyrula keeps runs (cancel them instead): 0."""
        return 0

    discard_all = purge

    def inspect(self, destination: Any = None, timeout: float = 1.0, **kwargs: Any) -> Inspect:
        return Inspect(self.app, timeout)

    def ping(self, destination: Any = None, timeout: float = 1.0, **kwargs: Any) -> list[Any]:
        replies = self.inspect(timeout=timeout).ping()
        return [{name: reply} for name, reply in (replies or {}).items()]

    def rate_limit(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("rate limits are set on the task (rate_limit=) in pyrula")


class Inspect:
    """``app.control.inspect()``: answers from the workers' heartbeats in the store."""

    def __init__(self, app: Celery, timeout: float) -> None:
        self.app = app
        self.timeout = timeout

    def _workers(self) -> list[Any]:
        url = self.app.store_url()

        async def read() -> list[Any]:
            store = open_store(url)
            await store.open()
            try:
                return await store.list_workers()
            finally:
                await store.close()

        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = asyncio.run(read())
            except BaseException as exc:
                box["error"] = exc

        thread = threading.Thread(target=target, name="pyrula-compat-inspect")
        thread.start()
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]  # type: ignore[no-any-return]

    def ping(self) -> dict[str, Any] | None:
        workers = self._workers()
        return {w.worker_id: {"ok": "pong"} for w in workers} or None

    def stats(self) -> dict[str, Any] | None:
        workers = self._workers()
        return {
            w.worker_id: {"pid": w.pid, "hostname": w.hostname, "running": w.running}
            for w in workers
        } or None

    def registered(self) -> dict[str, Any] | None:
        workers = self._workers()
        return {w.worker_id: sorted(w.workflows) for w in workers} or None

    registered_tasks = registered

    def active(self) -> dict[str, Any] | None:
        workers = self._workers()
        return {w.worker_id: [] for w in workers} or None

    def scheduled(self) -> dict[str, Any] | None:
        return self.active()

    reserved = scheduled
    revoked = scheduled
