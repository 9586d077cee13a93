"""``start_worker(app)``: a pyrula worker on a thread of this process, for tests and
one-file scripts (as ``celery.contrib.testing.worker.start_worker``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyrula.workflows import WorkerOptions, WorkflowWorker, open_store
from pyrula_compat.worker import AppWorker

FAST = {"claim_poll_interval": 0.05, "timer_poll_interval_s": 0.2, "schedule_poll_interval": 1.0}


@contextmanager
def start_worker(
    app: Any,
    concurrency: int = 1,
    pool: str = "threads",
    loglevel: Any = None,
    logfile: Any = None,
    perform_ping_check: bool = True,
    ping_task_timeout: float = 10.0,
    shutdown_timeout: float = 10.0,
    **options: Any,
) -> Iterator[WorkflowWorker]:
    """Serve ``app``'s tasks on a background thread until the block ends."""
    setup = AppWorker(app)
    setup.prepare()
    url = app.store_url()
    store = app.client().store if (url or "").startswith("memory") else open_store(url)
    settings = {**FAST, "max_concurrent_runs": max(1, concurrency) * 4, **options}
    worker = WorkflowWorker(store=store, registry=app.registry, options=WorkerOptions(**settings))
    ready = threading.Event()
    failure: list[BaseException] = []

    async def main() -> None:
        await store.open()
        await setup.on_start(store)
        ready.set()
        try:
            await worker.run()
        finally:
            if store is not app.client().store:
                await store.close()

    def target() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # handed to the caller below
            failure.append(exc)
            ready.set()

    thread = threading.Thread(target=target, name="pyrula-compat-worker", daemon=True)
    thread.start()
    ready.wait(ping_task_timeout)
    if failure:
        raise failure[0]
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(shutdown_timeout)
        setup.on_stop()


__all__ = ["start_worker"]
